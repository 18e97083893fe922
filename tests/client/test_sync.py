"""The blocking client against the fake server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from mpbroker.client import (
    Connection,
    ConnectionClosed,
    Message,
    ReceiptTimeout,
    StompError,
    connect,
)

from .conftest import WAIT_S, FakeServer


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def open_conn(server: FakeServer, **kwargs: Any) -> Connection:
    return connect("127.0.0.1", server.port, timeout=WAIT_S, **kwargs)


# --- connect ----------------------------------------------------------------------------------


def test_connect_negotiates_and_disconnects_on_exit(server: FakeServer) -> None:
    server.version = "1.1"
    server.connected_headers = {"session": "s-1"}
    with open_conn(
        server, login="alice", passcode="pw", client_id="c-1", vhost="vh", heartbeat=(0, 0)
    ) as conn:
        assert conn.version == "1.1"
        assert conn.server_headers["server"] == "fake/1"
        assert conn.server_headers["session"] == "s-1"
        assert not conn.closed and conn.error is None
    connect_frame = server.wait_for_frame("CONNECT")
    assert connect_frame.headers["accept-version"] == "1.0,1.1,1.2"
    assert connect_frame.headers["host"] == "vh"
    assert connect_frame.headers["login"] == "alice"
    assert connect_frame.headers["passcode"] == "pw"
    assert connect_frame.headers["client-id"] == "c-1"
    assert "receipt" in server.wait_for_frame("DISCONNECT").headers
    assert conn.closed


def test_host_header_defaults_to_host(server: FakeServer) -> None:
    with open_conn(server):
        pass
    assert server.wait_for_frame("CONNECT").headers["host"] == "127.0.0.1"


def test_error_instead_of_connected_raises(server: FakeServer) -> None:
    server.connect_error = "bad credentials"
    with pytest.raises(StompError, match="bad credentials") as info:
        open_conn(server, login="mallory")
    assert info.value.body == b"go away"
    assert not isinstance(info.value, ConnectionClosed)


def test_connect_times_out_when_server_is_silent(server: FakeServer) -> None:
    server.answer_connect = False
    with pytest.raises(TimeoutError, match="no CONNECTED"):
        connect("127.0.0.1", server.port, timeout=0.1)


def test_connect_refused() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        connect("127.0.0.1", port, timeout=1.0)


# --- send -------------------------------------------------------------------------------------


def test_send_without_and_with_receipt(server: FakeServer) -> None:
    with open_conn(server) as conn:
        conn.send("/queue/a", b"one", {"x-tag": "1"})
        conn.send("/queue/a", "two", receipt=True)
        # The receipt proves the server read both frames.
        first, second = server.frames_of("SEND")
    assert first.body == b"one"
    assert first.headers["x-tag"] == "1"
    assert "receipt" not in first.headers
    assert second.body == b"two"
    assert second.headers["content-type"] == "text/plain;charset=utf-8"


def test_receipt_timeout(server: FakeServer) -> None:
    server.auto_receipt = False
    with open_conn(server) as conn:
        started = time.monotonic()
        with pytest.raises(ReceiptTimeout, match="no RECEIPT for SEND"):
            conn.send("/queue/a", b"x", receipt=True, timeout=0.1)
        assert time.monotonic() - started < 1.0
        conn.send("/queue/a", b"still usable")


def test_concurrent_senders_never_interleave_frames(server: FakeServer) -> None:
    threads, per_thread = 8, 50
    # Bodies bigger than a socket buffer make a torn frame likely if sendall were unlocked.
    body = b"x" * 100_000

    with open_conn(server) as conn:

        def blast(n: int) -> None:
            for i in range(per_thread):
                conn.send("/queue/a", body, {"sender": f"{n}-{i}"})

        workers = [threading.Thread(target=blast, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        server.wait_for_frame("SEND", count=threads * per_thread)
        frames = server.frames_of("SEND")
    assert len({f.headers["sender"] for f in frames}) == threads * per_thread
    assert all(f.body == body for f in frames)


# --- subscribe --------------------------------------------------------------------------------


def test_subscribe_waits_for_receipt_and_iterates(server: FakeServer) -> None:
    with open_conn(server) as conn:
        sub = conn.subscribe("/queue/a", prefetch=10)
        frame = server.frames_of("SUBSCRIBE")[0]  # already there: the receipt came back
        assert frame.headers["id"] == sub.id
        assert frame.headers["ack"] == "auto" == sub.ack_mode
        assert frame.headers["activemq.prefetchSize"] == "10"
        sent = [server.deliver("/queue/a", f"m{i}".encode()) for i in range(3)]
        received: list[Message] = []
        for message in sub:
            received.append(message)
            if len(received) == 3:
                break
    assert [m.message_id for m in received] == sent
    assert [m.body for m in received] == [b"m0", b"m1", b"m2"]
    assert all(m.subscription == sub.id and m.ack_id is None for m in received)


def test_get_times_out_with_none(server: FakeServer) -> None:
    with open_conn(server) as conn:
        sub = conn.subscribe("/queue/a")
        assert sub.get(timeout=0.05) is None


def test_callback_receives_messages(server: FakeServer) -> None:
    got: list[Message] = []
    done = threading.Event()

    def on_message(message: Message) -> None:
        got.append(message)
        if len(got) == 2:
            done.set()

    with open_conn(server) as conn:
        sub = conn.subscribe("/topic/t", callback=on_message)
        server.deliver("/topic/t", b"a")
        server.deliver("/topic/t", b"b")
        assert done.wait(WAIT_S)
        assert sub.get(timeout=0.01) is None  # callbacks take the messages, not the queue
    assert [m.body for m in got] == [b"a", b"b"]


def test_failing_callback_does_not_stop_delivery(
    server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    got: list[bytes] = []

    def on_message(message: Message) -> None:
        if message.body == b"bad":
            raise RuntimeError("callback bug")
        got.append(message.body)

    with open_conn(server) as conn:
        conn.subscribe("/queue/a", callback=on_message)
        server.deliver("/queue/a", b"bad")
        server.deliver("/queue/a", b"good")
        wait_until(lambda: got == [b"good"])
    assert "callback bug" in caplog.text


def test_callback_may_send_but_not_wait_for_receipts(server: FakeServer) -> None:
    outcome: list[BaseException | None] = []

    def on_message(message: Message) -> None:
        conn.send("/queue/reply", message.body)  # fine: no waiting
        try:
            conn.send("/queue/reply", b"with receipt", receipt=True)
        except RuntimeError as exc:
            outcome.append(exc)

    with open_conn(server) as conn:
        conn.subscribe("/queue/a", callback=on_message)
        server.deliver("/queue/a", b"ping")
        reply = server.wait_for_frame("SEND")
        wait_until(lambda: bool(outcome))
    assert reply.body == b"ping"
    assert "would deadlock" in str(outcome[0])


def test_unsubscribe_ends_iteration(server: FakeServer) -> None:
    with open_conn(server) as conn:
        sub = conn.subscribe("/queue/a")
        server.deliver("/queue/a", b"queued")
        wait_until(lambda: bool(sub._queue))
        conn.unsubscribe(sub)
        assert server.frames_of("UNSUBSCRIBE")[0].headers["id"] == sub.id
        assert [m.body for m in sub] == [b"queued"]  # already-received messages stay readable


# --- ack / nack -------------------------------------------------------------------------------


def test_ack_and_nack_carry_the_messages_ack_id(server: FakeServer) -> None:
    with open_conn(server) as conn:
        sub = conn.subscribe("/queue/a", ack="client-individual")
        server.deliver("/queue/a", b"1")
        server.deliver("/queue/a", b"2")
        first, second = sub.get(WAIT_S), sub.get(WAIT_S)
        assert first is not None and second is not None
        assert first.ack_id is not None and first.ack_id != second.ack_id
        conn.ack(first, receipt=True)
        conn.nack(second)
        ack = server.frames_of("ACK")[0]
        nack = server.wait_for_frame("NACK")
    assert ack.headers["id"] == first.ack_id
    assert nack.headers == {"id": second.ack_id}


def test_ack_on_auto_subscription_is_refused(server: FakeServer) -> None:
    with open_conn(server) as conn:
        sub = conn.subscribe("/queue/a")
        server.deliver("/queue/a", b"1")
        message = sub.get(WAIT_S)
        assert message is not None
        with pytest.raises(ValueError, match="no ack header"):
            conn.ack(message)


# --- server ERROR and closes ------------------------------------------------------------------


def test_error_wakes_every_waiter(server: FakeServer) -> None:
    server.auto_receipt = False
    conn = open_conn(server)
    sub = conn.subscribe("/queue/a", receipt=False)
    results: dict[str, object] = {}

    def wait_receipt() -> None:
        try:
            conn.send("/queue/a", b"x", receipt=True, timeout=WAIT_S)
        except StompError as exc:
            results["receipt"] = exc

    def wait_get() -> None:
        results["get"] = sub.get()

    def wait_iter() -> None:
        results["iter"] = list(sub)

    waiters = [threading.Thread(target=f) for f in (wait_receipt, wait_get, wait_iter)]
    for waiter in waiters:
        waiter.start()
    server.wait_for_frame("SEND")
    server.send_error("destination full", b"details")
    for waiter in waiters:
        waiter.join(WAIT_S)
        assert not waiter.is_alive()
    receipt_error = results["receipt"]
    assert isinstance(receipt_error, StompError)
    assert receipt_error.message == "destination full"
    assert results["get"] is None
    assert results["iter"] == []
    assert conn.closed
    assert conn.error is not None and conn.error.message == "destination full"
    with pytest.raises(ConnectionClosed, match="destination full") as info:
        conn.send("/queue/a")
    assert info.value.error is conn.error
    conn.disconnect()  # on a closed connection: only releases resources


def test_messages_received_before_error_stay_readable(server: FakeServer) -> None:
    conn = open_conn(server)
    sub = conn.subscribe("/queue/a")
    server.deliver("/queue/a", b"before")
    server.send_error("bye")
    wait_until(lambda: conn.closed)
    assert [m.body for m in sub] == [b"before"]
    conn.close()


def test_server_closing_the_socket(server: FakeServer) -> None:
    conn = open_conn(server)
    sub = conn.subscribe("/queue/a")
    server.client.close()
    assert sub.get(WAIT_S) is None
    assert conn.closed and conn.error is None
    with pytest.raises(ConnectionClosed, match="the server closed the connection"):
        conn.subscribe("/queue/b")
    conn.close()


# --- heart-beats ------------------------------------------------------------------------------


def test_heartbeats_sent_while_idle(server: FakeServer) -> None:
    server.heartbeat = "0,30"
    with open_conn(server, heartbeat=(30, 0)):
        server.wait_until(lambda: server.heartbeats_received >= 3, timeout=2.0)


def test_silent_server_is_detected(server: FakeServer) -> None:
    server.heartbeat = "30,0"  # promises heart-beats every 30 ms, never sends one
    conn = open_conn(server, heartbeat=(0, 30))
    sub = conn.subscribe("/queue/a")
    started = time.monotonic()
    assert sub.get(WAIT_S) is None  # ends when the connection is declared dead
    assert time.monotonic() - started < 1.0  # 60 ms after the last byte, plus scheduling
    with pytest.raises(ConnectionClosed, match="no data from the server"):
        conn.send("/queue/a")
    conn.close()


def test_server_heartbeats_keep_the_connection(server: FakeServer) -> None:
    server.heartbeat = "30,0"
    server.heartbeat_every_s = 0.01
    with open_conn(server, heartbeat=(0, 30)) as conn:
        time.sleep(0.3)
        assert not conn.closed
        conn.send("/queue/a", receipt=True)


# --- disconnect and close ---------------------------------------------------------------------


def test_disconnect_waits_for_receipt(server: FakeServer) -> None:
    conn = open_conn(server)
    conn.disconnect()
    frame = server.frames_of("DISCONNECT")[0]
    assert frame.headers["receipt"].startswith("rcpt-")
    assert conn.closed
    conn.disconnect()  # idempotent
    with pytest.raises(ConnectionClosed, match=r"cannot send\(\): the client disconnected"):
        conn.send("/queue/a")


def test_disconnect_accepts_server_closing_without_receipt(server: FakeServer) -> None:
    server.auto_receipt = False  # the fake still closes the socket after DISCONNECT
    conn = open_conn(server)
    conn.disconnect(timeout=WAIT_S)
    assert conn.closed


def test_close_sends_no_disconnect(server: FakeServer) -> None:
    conn = open_conn(server)
    conn.close()
    assert conn.closed
    server.wait_until(lambda: server.client.stop.is_set())  # the server saw EOF
    assert server.frames_of("DISCONNECT") == []


def test_exception_in_block_still_closes(server: FakeServer) -> None:
    with pytest.raises(KeyError), open_conn(server) as conn:
        raise KeyError("boom")
    assert conn.closed
    assert len(server.frames_of("DISCONNECT")) == 1
