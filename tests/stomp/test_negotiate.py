"""Version and heart-beat negotiation, with the cases the STOMP 1.2 spec describes."""

from __future__ import annotations

import pytest

from mpbroker.stomp import (
    SUPPORTED_VERSIONS,
    MalformedFrame,
    negotiate_heartbeat,
    negotiate_version,
    parse_heartbeat,
)


@pytest.mark.parametrize(
    ("accept_version", "expected"),
    [
        (None, "1.0"),  # "If the accept-version header is missing, ... 1.0"
        ("1.0", "1.0"),
        ("1.1", "1.1"),
        ("1.2", "1.2"),
        ("1.0,1.1,1.2", "1.2"),
        ("1.2,1.0", "1.2"),  # order in the header does not matter, the highest wins
        ("1.0,1.1", "1.1"),
        ("1.1, 1.2", "1.2"),
        ("1.1,2.0", "1.1"),
        ("2.0", None),
        ("2.0,3.1", None),
        ("", None),
    ],
)
def test_negotiate_version(accept_version: str | None, expected: str | None) -> None:
    assert negotiate_version(accept_version) == expected


def test_supported_versions() -> None:
    assert SUPPORTED_VERSIONS == ("1.0", "1.1", "1.2")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, (0, 0)),
        ("0,0", (0, 0)),
        ("10000,5000", (10000, 5000)),
        (" 100 , 200 ", (100, 200)),
        ("007,0", (7, 0)),
    ],
)
def test_parse_heartbeat(value: str | None, expected: tuple[int, int]) -> None:
    assert parse_heartbeat(value) == expected


@pytest.mark.parametrize(
    "value", ["", "1", "1,2,3", "-1,0", "0,-1", "a,b", "1.5,2", ",", "1,", "1 2", "9" * 30 + ",0"]
)
def test_parse_heartbeat_refuses_malformed_values(value: str) -> None:
    with pytest.raises(MalformedFrame) as info:
        parse_heartbeat(value)
    assert repr(value) in str(info.value)
    assert "heart-beat" in str(info.value)


@pytest.mark.parametrize(
    ("client", "server", "expected"),
    [
        # Nobody wants heart-beats.
        ((0, 0), (0, 0), (0, 0)),
        # The client wants them but the server cannot send / does not want any.
        ((1000, 1000), (0, 0), (0, 0)),
        # The server would, but the client says 0,0.
        ((0, 0), (5000, 5000), (0, 0)),
        # Both ways on: each interval is the larger of "can send" and "wants".
        ((4000, 6000), (5000, 5000), (6000, 5000)),
        ((10000, 1000), (5000, 5000), (5000, 10000)),
        # One direction only: the client cannot send (cx=0) but wants them every 2 s.
        ((0, 2000), (1000, 3000), (2000, 0)),
        # The client sends but wants none (cy=0); the server wants every 3 s.
        ((5000, 0), (1000, 3000), (0, 5000)),
    ],
)
def test_negotiate_heartbeat(
    client: tuple[int, int], server: tuple[int, int], expected: tuple[int, int]
) -> None:
    assert negotiate_heartbeat(client, server) == expected


def test_negotiate_heartbeat_is_symmetric_for_the_client_side() -> None:
    # The client's view: what the server sends is what the client expects, and vice versa.
    client, server = (4000, 6000), (5000, 5000)
    server_send, server_expect = negotiate_heartbeat(client, server)
    client_send, client_expect = negotiate_heartbeat(server, client)
    assert (client_send, client_expect) == (server_expect, server_send)
