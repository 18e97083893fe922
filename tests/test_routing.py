"""Destination parsing and the partition that owns each destination."""

from __future__ import annotations

import dataclasses
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpbroker.routing import (
    QUEUE_PREFIX,
    TOPIC_PREFIX,
    Topology,
    UnknownDestination,
    parse_destination,
)

NAMES = st.text(
    st.characters(min_codepoint=32, max_codepoint=0x10FFFF, exclude_categories=["Cs"]), min_size=1
)


@pytest.mark.parametrize(
    ("destination", "expected"),
    [
        ("/queue/orders", ("queue", "orders")),
        ("/topic/prices", ("topic", "prices")),
        ("/queue/a/b/c", ("queue", "a/b/c")),
        ("/topic/ünï cødé", ("topic", "ünï cødé")),
        ("/queue//", ("queue", "/")),
    ],
)
def test_parse_destination_splits_kind_and_name(
    destination: str, expected: tuple[str, str]
) -> None:
    assert parse_destination(destination) == expected


@pytest.mark.parametrize(
    "destination",
    [
        "",
        "/queue/",
        "/topic/",
        "queue/x",
        "/queues/x",
        "/Queue/x",
        "/temp-queue/x",
        "/queue/a\nb",
        "/topic/\x00",
        "/queue/\x1f",
    ],
)
def test_parse_destination_refuses_anything_else(destination: str) -> None:
    with pytest.raises(UnknownDestination) as info:
        parse_destination(destination)
    assert info.value.destination == destination
    assert repr(destination) in str(info.value)
    assert "/queue/NAME or /topic/NAME" in str(info.value)


def test_unknown_destination_is_a_value_error() -> None:
    assert issubclass(UnknownDestination, ValueError)


def test_prefixes() -> None:
    assert (QUEUE_PREFIX, TOPIC_PREFIX) == ("/queue/", "/topic/")


def test_pipelines_are_numbered_p2p_first_then_pubsub() -> None:
    topology = Topology(p2p=3, pubsub=2)
    assert topology.pipelines == 5
    assert [topology.role(i) for i in range(5)] == [
        ("p2p", 0),
        ("p2p", 1),
        ("p2p", 2),
        ("pubsub", 0),
        ("pubsub", 1),
    ]


def test_owner_is_crc32_of_the_name_modulo_the_workers_of_its_kind() -> None:
    topology = Topology(p2p=4, pubsub=3)
    crc = zlib.crc32(b"orders")
    assert topology.owner("/queue/orders") == crc % 4
    assert topology.owner("/topic/orders") == 4 + crc % 3


def test_owner_of_an_invalid_destination_raises_unknown_destination() -> None:
    with pytest.raises(UnknownDestination):
        Topology(1, 1).owner("/nowhere/x")


def test_a_single_worker_of_each_kind_owns_everything_of_its_kind() -> None:
    topology = Topology(p2p=1, pubsub=1)
    assert {topology.owner(f"/queue/q{i}") for i in range(50)} == {0}
    assert {topology.owner(f"/topic/t{i}") for i in range(50)} == {1}


def test_destinations_spread_over_every_partition() -> None:
    topology = Topology(p2p=4, pubsub=4)
    assert {topology.owner(f"/queue/q{i}") for i in range(200)} == {0, 1, 2, 3}
    assert {topology.owner(f"/topic/t{i}") for i in range(200)} == {4, 5, 6, 7}


def test_topology_is_immutable() -> None:
    topology = Topology(1, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        topology.p2p = 2  # type: ignore[misc]


@given(name=NAMES, p2p=st.integers(1, 64), pubsub=st.integers(1, 64))
def test_every_valid_name_has_one_owner_of_the_right_kind(name: str, p2p: int, pubsub: int) -> None:
    topology = Topology(p2p, pubsub)
    queue_owner = topology.owner(QUEUE_PREFIX + name)
    topic_owner = topology.owner(TOPIC_PREFIX + name)
    assert topology.role(queue_owner)[0] == "p2p"
    assert topology.role(topic_owner)[0] == "pubsub"
    assert 0 <= queue_owner < p2p <= topic_owner < topology.pipelines
    assert topology.owner(QUEUE_PREFIX + name) == queue_owner  # stable
