"""The gateway shell under pressure: a pipeline that refuses while frames keep coming, a ring
that stays full, a slow auto-ack consumer. Real brokers, raw sockets."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable

import pytest

from mpbroker.harness import BrokerProcess, RawClient
from mpbroker.stomp import Frame, encode_frame
from tests.e2e._admin import get
from tests.e2e.test_queues import HARD_LIMIT_ONLY

pytestmark = pytest.mark.slow


def sends(destination: str, count: int, body: bytes = b"x" * 100) -> bytes:
    return b"".join(
        encode_frame(Frame("SEND", {"destination": destination}, body)) for _ in range(count)
    )


def test_frames_that_come_after_a_pipelines_refusal_get_the_error_not_a_dropped_connection(
    start_broker: type[BrokerProcess], raw: Callable[[BrokerProcess], RawClient]
) -> None:
    broker = start_broker(config=HARD_LIMIT_ONLY)
    client = raw(broker)
    client.connect()
    # Many socket reads' worth of SENDs at once: the p2p worker's refusals come back while
    # the gateway still reads the rest.
    with contextlib.suppress(OSError):
        client.send_bytes(sends("/queue/full", 3000))
    frames = client.recv_until_closed()
    assert [f.command for f in frames] == ["ERROR"]
    assert frames[0].headers["message"] == "ResourceAllocation: /queue/full max_messages 5 reached"
    assert "failed" not in broker.log_text() and "Traceback" not in broker.log_text()


def test_heart_beats_go_on_while_a_ring_to_a_stopped_pipeline_is_full(
    start_broker: type[BrokerProcess],
) -> None:
    broker = start_broker("--gateways", "1", config="[rings]\ncapacity_bytes = 65536\n")
    p2p = broker.workers()["p2p 0"]
    sock = socket.create_connection((broker.host, broker.port), timeout=10)
    try:
        sock.sendall(
            encode_frame(Frame("CONNECT", {"accept-version": "1.2", "heart-beat": "0,500"}))
        )
        assert sock.recv(4096).startswith(b"CONNECTED")
        os.kill(p2p.pid, signal.SIGSTOP)  # its ring fills and stays full
        try:
            # Far more than the ring holds: the connection's reader waits for room.
            sock.sendall(sends("/queue/held", 2000))
            time.sleep(0.5)
            # Only heart-beats can come now (the server sends one every 1000 ms: its offer).
            beats = b""
            deadline = time.monotonic() + 3.5
            while time.monotonic() < deadline and beats.count(b"\n") < 2:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                with contextlib.suppress(TimeoutError):
                    beats += sock.recv(4096)
            assert beats.count(b"\n") >= 2, beats
            assert beats.strip(b"\n") == b""
        finally:
            os.kill(p2p.pid, signal.SIGCONT)
    finally:
        sock.close()


def test_a_slow_auto_ack_subscriber_is_held_to_its_window_in_the_gateway(
    start_broker: type[BrokerProcess], raw: Callable[[BrokerProcess], RawClient]
) -> None:
    broker = start_broker("--gateways", "1")
    slow = socket.create_connection((broker.host, broker.port), timeout=10)
    try:
        # It sends heart-beats (each one wakes its connection's reader) and never reads.
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.sendall(
            encode_frame(Frame("CONNECT", {"accept-version": "1.2", "heart-beat": "100,0"}))
            + encode_frame(
                Frame(
                    "SUBSCRIBE",
                    {"id": "s", "destination": "/topic/slow", "activemq.prefetchSize": "10"},
                )
            )
        )
        time.sleep(0.5)
        producer = raw(broker)
        producer.connect()
        producer.send_bytes(sends("/topic/slow", 1000, b"x" * 10_000))
        producer.send("DISCONNECT", {"receipt": "done"})
        producer.expect("RECEIPT", "done")

        def waiting_in_the_pipeline(seconds: float) -> int:
            """Heart-beats for `seconds`, then what waits for the subscriber in its
            pipeline (its window and backlog), as the admin API shows it."""
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                slow.sendall(b"\n")
                time.sleep(0.1)
            [row] = [
                c for c in get(broker, "/flow")["consumers"] if c["destination"] == "/topic/slow"
            ]
            return int(row["backlog"]) + int(row["unacknowledged"])

        # Once the socket buffers are full, nothing more reaches the client, so nothing more
        # may leave the window: heart-beats must not let the gateway take window after window.
        before = waiting_in_the_pipeline(3.0)
        after = waiting_in_the_pipeline(2.0)
        assert before > 0
        assert before - after <= 10, (before, after)
    finally:
        slow.close()
