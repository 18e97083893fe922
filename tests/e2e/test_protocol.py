"""STOMP details end to end: version negotiation, heart-beats both ways, escaping, NUL bodies."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from mpbroker.harness import BrokerProcess, RawClient

RawFactory = Callable[[BrokerProcess], RawClient]


def test_connected_headers(broker: BrokerProcess, raw: RawFactory) -> None:
    client = raw(broker)
    connected = client.connect()
    assert connected.headers["version"] == "1.2"
    assert connected.headers["server"].startswith("mpbroker")
    assert connected.headers["heart-beat"] == "1000,1000"


def test_stomp_command_and_version_1_1(broker: BrokerProcess, raw: RawFactory) -> None:
    client = raw(broker)
    client.send("STOMP", {"accept-version": "1.0,1.1", "host": "/"})
    connected = client.recv()
    assert connected.command == "CONNECTED" and connected.headers["version"] == "1.1"
    client.parser.version = "1.1"
    client.send("SUBSCRIBE", {"destination": "/queue/v11", "id": "s", "ack": "client"})
    client.send("SEND", {"destination": "/queue/v11", "k": "a:b"}, b"x")
    msg = client.recv()
    assert msg.headers["k"] == "a:b"
    # 1.1 acknowledges by message-id and subscription.
    client.send(
        "ACK", {"message-id": msg.headers["message-id"], "subscription": "s", "receipt": "a"}
    )
    assert client.recv().command == "RECEIPT"


def test_version_1_0_without_accept_version(broker: BrokerProcess, raw: RawFactory) -> None:
    client = raw(broker)
    client.send("CONNECT", {"login": "guest", "passcode": "guest"})
    connected = client.recv()
    assert connected.headers["version"] == "1.0"
    assert connected.headers["heart-beat"] == "0,0"  # 1.0 cannot heart-beat; always said
    client.parser.version = "1.0"
    # 1.0 allows SUBSCRIBE without an id and ACK by message-id alone.
    client.send("SUBSCRIBE", {"destination": "/queue/v10", "ack": "client"})
    client.send("SEND", {"destination": "/queue/v10"}, b"old")
    msg = client.recv()
    assert msg.body == b"old"
    client.send("ACK", {"message-id": msg.headers["message-id"], "receipt": "a"})
    assert client.recv().command == "RECEIPT"


def test_body_with_nul_bytes_and_escaped_headers(broker: BrokerProcess, raw: RawFactory) -> None:
    client = raw(broker)
    client.connect()
    client.send("SUBSCRIBE", {"destination": "/queue/binary", "id": "s"})
    body = bytes(range(256)) * 4
    client.send(
        "SEND", {"destination": "/queue/binary", "weird": "colon:newline\nbackslash\\cr\r"}, body
    )
    msg = client.recv()
    assert msg.body == body
    assert msg.headers["content-length"] == str(len(body))
    assert msg.headers["weird"] == "colon:newline\nbackslash\\cr\r"


def test_broker_sends_heartbeats_and_drops_a_silent_client(
    broker: BrokerProcess, raw: RawFactory
) -> None:
    client = raw(broker)
    client.send("CONNECT", {"accept-version": "1.2", "host": "/", "heart-beat": "1000,1000"})
    assert client.recv().command == "CONNECTED"
    # Negotiated: the broker beats every max(1000, 1000) ms and expects the same from us.
    client.sock.settimeout(3)
    started = time.monotonic()
    data = client.sock.recv(100)
    assert data == b"\n", data
    assert time.monotonic() - started > 0.5
    # We stay silent: after grace (2) x 1000 ms the broker gives up on us.
    frames = client.recv_until_closed(timeout=10)
    assert [f.command for f in frames] == ["ERROR"]
    assert "heart-beat" in frames[0].headers["message"]
    broker.wait_for_log("closing .*: no heart-beat or frame for 2000 ms")


def test_client_heartbeats_keep_the_connection(broker: BrokerProcess, raw: RawFactory) -> None:
    client = raw(broker)
    client.send("CONNECT", {"accept-version": "1.2", "host": "/", "heart-beat": "1000,0"})
    assert client.recv().command == "CONNECTED"
    for _ in range(6):  # 3 s of beats every 0.5 s: longer than the 2 s the broker allows
        time.sleep(0.5)
        client.send_bytes(b"\n")
    client.send("SEND", {"destination": "/queue/hb", "receipt": "alive"}, b"x")
    assert client.recv().headers["receipt-id"] == "alive"


def test_header_a_1_0_consumer_cannot_carry_is_blanked_not_injected(
    broker: BrokerProcess, raw: RawFactory
) -> None:
    old = raw(broker)
    old.send("CONNECT", {})
    assert old.recv().headers["version"] == "1.0"
    old.parser.version = "1.0"
    old.send("SUBSCRIBE", {"destination": "/queue/v10-escape", "receipt": "s"})
    assert old.recv().command == "RECEIPT"
    new = raw(broker)
    new.connect()
    new.send("SEND", {"destination": "/queue/v10-escape", "note": "line1\nevil:injected"}, b"x")
    msg = old.recv()
    assert msg.headers["note"] == "line1 evil:injected"
    assert "evil" not in msg.headers


@pytest.mark.parametrize("persistent", ["false", "true"])
def test_a_message_near_max_frame_bytes_passes_queue_and_topic(
    broker: BrokerProcess, raw: RawFactory, persistent: str
) -> None:
    body = bytes(range(256)) * (1023 * 4)  # just under the 1 MiB frame limit with headers
    client = raw(broker)
    client.connect()
    for destination in (f"/queue/big-{persistent}", f"/topic/big-{persistent}"):
        client.send("SUBSCRIBE", {"destination": destination, "id": destination, "receipt": "s"})
        assert client.recv().command == "RECEIPT"
        client.send(
            "SEND", {"destination": destination, "persistent": persistent, "receipt": "r"}, body
        )
        frames = [client.recv(), client.recv()]
        assert sorted(f.command for f in frames) == ["MESSAGE", "RECEIPT"]
        assert [f.body for f in frames if f.command == "MESSAGE"] == [body]
