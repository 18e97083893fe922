"""The baseline server's forwarding rules, driven over real sockets with the harness's RawClient."""

from __future__ import annotations

from collections.abc import Callable

from mpbroker.harness import RawClient
from mpbroker.stomp import Frame

TIMEOUT_S = 5.0


Connect = Callable[[], RawClient]


def _subscribe(conn: RawClient, destination: str, ack: str = "auto", prefetch: int = 10) -> None:
    conn.send(
        "SUBSCRIBE",
        {
            "id": "s",
            "destination": destination,
            "ack": ack,
            "activemq.prefetchSize": str(prefetch),
            "receipt": "sub",
        },
    )
    conn.expect("RECEIPT", "sub")


def _send(conn: RawClient, destination: str, *bodies: bytes) -> None:
    for body in bodies:
        conn.send("SEND", {"destination": destination}, body)
    conn.send("SEND", {"destination": destination, "receipt": "r"}, b"last")
    conn.expect("RECEIPT", "r")


def _messages(conn: RawClient, count: int) -> list[Frame]:
    got: list[Frame] = []
    while len(got) < count:
        frames = conn.read(TIMEOUT_S)
        assert frames is not None, f"only {len(got)} of {count} messages arrived"
        got += frames
    assert all(f.command == "MESSAGE" for f in got)
    return got


def test_topic_fan_out_to_every_subscriber(baseline_client: Connect) -> None:
    a, b, producer = baseline_client(), baseline_client(), baseline_client()
    _subscribe(a, "/topic/t")
    _subscribe(b, "/topic/t")
    _send(producer, "/topic/t", b"1", b"2")
    for conn in (a, b):
        assert [f.body for f in _messages(conn, 3)] == [b"1", b"2", b"last"]
    for conn in (a, b, producer):
        conn.disconnect()


def test_client_ack_window_and_cumulative_ack(baseline_client: Connect) -> None:
    consumer, producer = baseline_client(), baseline_client()
    _subscribe(consumer, "/queue/q", ack="client", prefetch=2)
    _send(producer, "/queue/q", b"1", b"2", b"3", b"4")
    first = _messages(consumer, 2)
    assert [f.body for f in first] == [b"1", b"2"]
    assert first[0].headers["message-id"].startswith("ID-")  # the broker's shape
    consumer.assert_no_frame(0.2)  # the window is full
    # A cumulative ACK of the second message frees both slots.
    consumer.send("ACK", {"id": first[1].headers["ack"]})
    assert [f.body for f in _messages(consumer, 2)] == [b"3", b"4"]
    consumer.send("ACK", {"id": "no:such"})  # ignored, not an error
    for conn in (consumer, producer):
        conn.disconnect()


def test_queue_round_robin(baseline_client: Connect) -> None:
    a, b, producer = baseline_client(), baseline_client(), baseline_client()
    _subscribe(a, "/queue/rr")
    _subscribe(b, "/queue/rr")
    _send(producer, "/queue/rr", b"1", b"2", b"3")
    assert [f.body for f in _messages(a, 2)] == [b"1", b"3"]
    assert [f.body for f in _messages(b, 2)] == [b"2", b"last"]
    for conn in (a, b, producer):
        conn.disconnect()


def test_unacknowledged_messages_return_to_the_queue(baseline_client: Connect) -> None:
    first, producer = baseline_client(), baseline_client()
    _subscribe(first, "/queue/r", ack="client-individual", prefetch=5)
    _send(producer, "/queue/r", b"1")
    assert [f.body for f in _messages(first, 2)] == [b"1", b"last"]
    first.close()  # without acknowledging
    second = baseline_client()
    _subscribe(second, "/queue/r", ack="client-individual", prefetch=5)
    got = _messages(second, 2)
    assert [f.body for f in got] == [b"1", b"last"]
    for frame in got:
        second.send("ACK", {"id": frame.headers["ack"]})
    for conn in (second, producer):
        conn.disconnect()
