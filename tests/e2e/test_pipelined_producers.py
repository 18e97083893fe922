"""Pipelined producers at full speed, default configuration: flow control holds them, and
no hard limit refuses what they sent in good faith.

A producer writes every SEND without waiting (a RECEIPT asked on every 256th), as fast as
the socket takes them, to a topic with a fast and a slow subscriber, or to a queue with a
slow consumer. When the slow side falls behind, the destination's stop reaches the
gateway, which stops reading the producer's socket (TCP back-pressure, as ActiveMQ and
RabbitMQ do); what was already in flight then is taken beyond `topics.max_pending_messages`
or `queues.max_messages` rather than refused. Every message arrives exactly once, in order.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import pytest

from mpbroker.harness import BrokerProcess, FrameTimeout, RawClient
from mpbroker.stomp import Frame, encode_frame

RawFactory = Callable[[BrokerProcess], RawClient]

pytestmark = pytest.mark.slow

BATCH = 256
BODY = 100


def body(n: int) -> bytes:
    return b"%08d" % n + b"." * (BODY - 8)


@dataclass
class Received:
    """What one subscriber got: the message numbers, in order."""

    numbers: list[int] = field(default_factory=list)
    errors: list[Frame] = field(default_factory=list)


def produce(client: RawClient, destination: str, total: int, first: int) -> None:
    """Every SEND written without waiting (a RECEIPT asked on the last of each batch of
    BATCH), encoded before the first is written, so the socket is the only limit."""
    frames = []
    for n in range(total):
        headers = {"destination": destination}
        if n % BATCH == BATCH - 1 or n == total - 1:
            headers["receipt"] = f"r{n}"
        frames.append(encode_frame(Frame("SEND", headers, body(first + n))))
    for start in range(0, total, BATCH):
        client.send_bytes(b"".join(frames[start : start + BATCH]))


def producer_process(
    host: str, port: int, destination: str, total: int, index: int, results: Connection
) -> None:
    """A producer in a process of its own (the test process's threads share one
    interpreter lock): sends, then reports (RECEIPTs, ERROR messages) through `results`."""
    client = RawClient(host, port, send_timeout=None)
    try:
        client.connect()
        errors: list[Frame] = []
        writer = threading.Thread(target=produce, args=(client, destination, total, index * total))
        writer.start()
        receipts = collect_receipts(client, -(-total // BATCH), errors)
        writer.join(60)
        results.send((receipts, [e.headers.get("message", "") for e in errors]))
    finally:
        client.close()


def collect_receipts(client: RawClient, expected: int, errors: list[Frame]) -> int:
    """RECEIPTs until `expected` came (or an ERROR, or 60 s of silence)."""
    got = 0
    while got < expected:
        try:
            frame = client.recv(timeout=60)
        except FrameTimeout:
            break
        if frame.command == "ERROR":
            errors.append(frame)
            break
        got += frame.command == "RECEIPT"
    return got


def subscriber(
    client: RawClient, total: int, received: Received, *, ack_every: int, pause_s: float
) -> None:
    """Take `total` messages; with `ack_every` > 0 acknowledge (client mode, cumulative)
    every `ack_every` messages, pausing `pause_s` after each ACK: a slow consumer."""
    while len(received.numbers) < total:
        try:
            frame = client.recv(timeout=60)
        except FrameTimeout:
            return
        if frame.command != "MESSAGE":
            received.errors.append(frame)
            return
        received.numbers.append(int(frame.body[:8]))
        count = len(received.numbers)
        if ack_every and (count % ack_every == 0 or count == total):
            client.send("ACK", {"id": frame.headers["ack"]})
            time.sleep(pause_s)


def run(
    broker: BrokerProcess,
    raw: RawFactory,
    destination: str,
    total: int,
    subscribers: list[tuple[int, float]],
    producers: int = 1,
) -> None:
    """`producers` pipelining producers share `total` messages (producer i sends the
    numbers i*count ... in order); `subscribers`: (ack_every, pause_s) of each, 0 = auto
    acknowledgement, no pause."""
    received = [Received() for _ in subscribers]
    threads = []
    for i, (ack_every, pause_s) in enumerate(subscribers):
        client = raw(broker)
        client.connect()
        mode = "client" if ack_every else "auto"
        client.send(
            "SUBSCRIBE", {"destination": destination, "id": f"s{i}", "ack": mode, "receipt": "s"}
        )
        client.expect("RECEIPT", "s")
        threads.append(
            threading.Thread(
                target=subscriber,
                args=(client, total, received[i]),
                kwargs={"ack_every": ack_every, "pause_s": pause_s},
            )
        )
    for thread in threads:
        thread.start()
    spawn = multiprocessing.get_context("spawn")
    pipes = [spawn.Pipe(duplex=False) for _ in range(producers)]
    processes = [
        spawn.Process(
            target=producer_process,
            args=(broker.host, broker.port, destination, total // producers, i, child_end),
        )
        for i, (_, child_end) in enumerate(pipes)
    ]
    for process in processes:
        process.start()
    try:
        reports = []
        for results, _ in pipes:
            assert results.poll(180), "a producer did not finish"
            reports.append(results.recv())
    finally:
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join()
        for thread in threads:
            thread.join(120)
    for receipts, errors in reports:
        assert not errors
        assert receipts == -(-(total // producers) // BATCH)
    for i, got in enumerate(received):
        assert not got.errors, [e.headers.get("message") for e in got.errors]
        assert len(got.numbers) == total, f"subscriber {i}: {len(got.numbers)} of {total}"
        assert sorted(got.numbers) == list(range(total)), f"subscriber {i}: not exactly once"
        # Each producer's messages in the order it sent them.
        share = total // producers
        for p in range(producers):
            own = [n for n in got.numbers if n // share == p]
            assert own == sorted(own), f"subscriber {i}: producer {p} out of order"
    assert "max_pending_messages" not in broker.log_text()
    assert "max_messages" not in broker.log_text()


@pytest.mark.parametrize("attempt", range(2))
def test_a_pipelined_publisher_is_held_not_refused_by_a_slow_topic_subscriber(
    start_broker: type[BrokerProcess], raw: RawFactory, attempt: int
) -> None:
    broker = start_broker("--gateways", "2")
    run(broker, raw, "/topic/pipelined", 40_000, [(0, 0.0), (0, 0.0), (500, 0.05)], producers=4)


def test_a_pipelined_producer_is_held_not_refused_by_a_slow_queue_consumer(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "2")
    run(broker, raw, "/queue/pipelined", 60_000, [(500, 0.005)], producers=4)
