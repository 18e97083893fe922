"""The admin JSON, defined once: snapshots survive encode/decode, say their kind, leave
unset fields out, and shrink to what fits when they must."""

from __future__ import annotations

import json

import msgspec
import pytest

from mpbroker.admin import (
    ConsumerRow,
    DurableRow,
    FlowView,
    GatewayStats,
    QueueRow,
    ReplayStats,
    StatusView,
    TopicWorkerStats,
    WorkerStats,
    WorkerStatus,
    decode,
    encode,
    without_details,
)

CONSUMER = ConsumerRow(
    destination="/topic/t",
    subscription="s",
    gateway=0,
    connection=1,
    ack="auto",
    unacknowledged=2,
    prefetch=10,
    unacknowledged_bytes=20,
    window_bytes=-1,
    backlog=0,
    ready="yes",
)
PUBSUB = TopicWorkerStats(
    title="pubsub 0",
    pid=3,
    at_ms=4,
    received=5,
    delivered=6,
    destinations=[],
    destinations_not_shown=0,
    stores={},
    consumers=[CONSUMER],
    consumers_not_shown=0,
    durable_subscriptions=[DurableRow(name="c/d", topic="/topic/t", state="live")],
)
EVERY_WORKER: list[WorkerStats] = [
    GatewayStats(
        title="gateway 0", pid=1, at_ms=2, connections=3, stopped_producers=[], stops_known=0
    ),
    PUBSUB,
    ReplayStats(
        title="replay 0",
        pid=7,
        at_ms=8,
        replaying=["c/d"],
        waiting_for_a_place=[],
        in_flight_bytes=9,
        batches=1,
        messages=2,
    ),
]


@pytest.mark.parametrize("stats", EVERY_WORKER, ids=lambda s: s.title)
def test_every_worker_snapshot_round_trips_and_names_its_role(stats: WorkerStats) -> None:
    data = encode(stats)
    assert decode(data, WorkerStats) == stats  # type: ignore[arg-type]
    assert (
        json.loads(data)["role"]
        == {"gateway 0": "gateway", "pubsub 0": "pubsub", "replay 0": "replay"}[stats.title]
    )


def test_unset_fields_are_left_out_of_the_json() -> None:
    shown = json.loads(encode(PUBSUB))
    assert "temp_store" not in shown and "error" not in shown
    # ... but how many rows it leaves out is always said, 0 included.
    assert (shown["destinations_not_shown"], shown["consumers_not_shown"]) == (0, 0)
    assert "worker" not in shown["consumers"][0]


def test_a_status_page_round_trips_with_a_worker_that_published_nothing_yet() -> None:
    view = StatusView(
        at_ms=1,
        workers=[
            WorkerStatus(
                title="p2p 0",
                role="p2p",
                index=0,
                state="starting",
                pid=0,
                incarnation=0,
                heartbeat_age_ms=None,
                stats=None,
            )
        ],
    )
    data = encode(view)
    assert json.loads(data)["workers"][0]["stats"] is None
    assert decode(data, StatusView) == view


def test_the_flow_page_calls_the_global_figures_global_and_tags_destinations() -> None:
    view = FlowView(
        at_ms=1,
        destinations=[
            QueueRow(name="/queue/q", waiting=1, unacknowledged=0, consumers=0, stores={})
        ],
        destinations_not_shown=0,
        global_stores={"p2p 0": {}},
        stopped_producers=[],
        consumers=[],
        consumers_not_shown=0,
        durable_subscriptions=[],
        durable_subscriptions_not_shown=0,
    )
    shown = json.loads(encode(view))
    assert shown["global"] == {"p2p 0": {}}
    assert shown["destinations"][0]["kind"] == "queue"
    assert decode(encode(view), FlowView) == view


def test_a_snapshot_that_does_not_fit_keeps_its_figures_and_says_why() -> None:
    short = without_details(PUBSUB, "too big")
    assert isinstance(short, TopicWorkerStats)
    assert (short.consumers, short.durable_subscriptions, short.error) == ([], [], "too big")
    assert (short.title, short.received, short.delivered) == ("pubsub 0", 5, 6)
    # What it leaves out is counted, not hidden.
    assert (short.consumers_not_shown, short.destinations_not_shown) == (1, 0)


def test_snapshots_are_frozen() -> None:
    with pytest.raises(AttributeError):
        PUBSUB.received = 0  # type: ignore[misc]


def test_a_page_that_is_not_ours_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError):
        decode(b'{"hello": "world"}', StatusView)
