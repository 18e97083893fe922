"""RawClient against a real server: the baseline forwarder, which starts in a blink."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from mpbroker.harness import BrokerClosed, FrameTimeout, RawClient, StompError

Connect = Callable[[], RawClient]


def subscribe(conn: RawClient, destination: str) -> None:
    conn.send("SUBSCRIBE", {"id": "s", "destination": destination, "receipt": "sub"})
    conn.expect("RECEIPT", "sub")


def test_assert_no_frame_passes_on_a_quiet_connection(baseline_client: Connect) -> None:
    baseline_client().assert_no_frame(0.2)


def test_assert_no_frame_fails_with_the_frame_that_arrived(
    baseline_client: Connect,
) -> None:
    consumer, producer = baseline_client(), baseline_client()
    subscribe(consumer, "/queue/quiet")
    producer.send("SEND", {"destination": "/queue/quiet"}, b"loud")
    with pytest.raises(AssertionError, match=r"expected no frame within 2 s, got .*MESSAGE"):
        consumer.assert_no_frame(2.0)
    assert consumer.recv().body == b"loud"  # not lost: it is still the next frame


def test_recv_times_out_with_frame_timeout(baseline_client: Connect) -> None:
    with pytest.raises(FrameTimeout, match=r"no frame within 0\.2 s"):
        baseline_client().recv(timeout=0.2)


def test_expect_keeps_the_frames_it_passed_for_the_next_read(
    baseline_client: Connect,
) -> None:
    conn = baseline_client()
    subscribe(conn, "/topic/self")
    conn.send("SEND", {"destination": "/topic/self"}, b"one")
    conn.send("SEND", {"destination": "/topic/self", "receipt": "r"}, b"two")
    assert conn.expect("RECEIPT", "r").headers["receipt-id"] == "r"
    assert [conn.recv().body, conn.recv().body] == [b"one", b"two"]
    assert conn.read(0) is None


def test_an_error_frame_is_a_stomp_error_then_the_connection_closes(
    baseline_client: Connect,
) -> None:
    conn = baseline_client()
    conn.send("BEGIN", {"transaction": "t", "receipt": "r"})  # the baseline refuses these
    with pytest.raises(StompError) as raised:
        conn.expect("RECEIPT", "r")
    assert raised.value.frame.command == "ERROR"
    assert conn.recv_until_closed() == []
    with pytest.raises(BrokerClosed):
        conn.recv(timeout=1.0)


def test_recv_until_closed_returns_every_frame_before_the_close(
    baseline_client: Connect,
) -> None:
    conn = baseline_client()
    conn.send("BEGIN", {"transaction": "t"})
    assert [f.command for f in conn.recv_until_closed()] == ["ERROR"]


def test_disconnect_waits_for_its_receipt(baseline_client: Connect) -> None:
    conn = baseline_client()
    conn.disconnect()
    assert conn.pending == []
