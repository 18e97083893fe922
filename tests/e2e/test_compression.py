"""Compression end to end: large bodies are stored and passed on compressed, and every consumer
(our codec and stomp.py, live and replayed from the store) gets the original bytes."""

from __future__ import annotations

import json
import random
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import stomp

from mpbroker.harness import BrokerProcess, RawClient

RawFactory = Callable[[BrokerProcess], RawClient]

pytestmark = pytest.mark.slow

THRESHOLD = 1024
CONFIG = f"[compression]\nthreshold_bytes = {THRESHOLD}\n"


def jsonish(size: int, seed: int) -> bytes:
    """JSON order records, `size` bytes: compresses about 4:1, as real bodies do."""
    rnd = random.Random(seed)
    lines: list[bytes] = []
    total = 0
    while total < size:
        record = {
            "order": rnd.randrange(10**9),
            "status": rnd.choice(["pending", "shipped", "delivered", "returned"]),
            "city": rnd.choice(["lisbon", "oslo", "vienna", "dublin"]),
            "price": round(rnd.uniform(1, 500), 2),
        }
        line = json.dumps(record).encode() + b",\n"
        lines.append(line)
        total += len(line)
    return b"".join(lines)[:size]


# Large and compressible (up to most of the 1 MiB frame limit), at the threshold (kept), and
# over it but incompressible (kept: compression does not pay).
BODIES = [
    jsonish(2 * 1024, 1),
    jsonish(100 * 1024, 2),
    jsonish(700 * 1024, 3),
    jsonish(THRESHOLD, 4),
    random.Random(5).randbytes(8 * 1024),
]
COMPRESSIBLE = {0, 1, 2}


def send_all(
    producer: RawClient, destination: str, bodies: list[bytes], *, persistent: bool
) -> None:
    """SEND each body with a receipt (a persistent one is stored once its receipt is back)."""
    for n, body in enumerate(bodies):
        headers = {"destination": destination, "receipt": f"r{n}", "n": str(n)}
        if persistent:
            headers["persistent"] = "true"
        producer.send("SEND", headers, body)
    receipts = [producer.recv(timeout=15) for _ in bodies]
    assert {f.headers.get("receipt-id") for f in receipts} == {f"r{n}" for n in range(len(bodies))}


def take(client: RawClient, count: int) -> list[bytes]:
    """`count` MESSAGE bodies, each checked against its content-length, acknowledged."""
    bodies = []
    for _ in range(count):
        frame = client.recv(timeout=20)
        assert frame.command == "MESSAGE", frame
        assert int(frame.headers["content-length"]) == len(frame.body)
        if "ack" in frame.headers:
            client.send("ACK", {"id": frame.headers["ack"]})
        bodies.append(frame.body)
    return bodies


def stored(data_dir: Path, kind: str) -> list[tuple[int, str, int]]:
    """(length of the stored body, encoding, size) of every message row in the stores of
    `kind` ("p2p", "pubsub": one partition each here), in seq order; the segment files are
    opened read-only while the broker runs."""
    rows: list[tuple[int, str, int]] = []
    for path in sorted(data_dir.glob(f"{kind}-*/seg-*.db")):
        db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
        try:
            rows += db.execute(
                "SELECT length(body), encoding, size FROM messages ORDER BY seq"
            ).fetchall()
        finally:
            db.close()
    return rows


def check_stored(rows: list[tuple[int, str, int]], bodies: list[bytes]) -> None:
    assert len(rows) == len(bodies)
    for n, ((length, encoding, size), body) in enumerate(zip(rows, bodies, strict=True)):
        if n in COMPRESSIBLE:
            assert encoding == "zstd"
            assert length < len(body) / 2
            assert length < size < len(body) / 2  # limits count the stored bytes
        else:
            assert (length, encoding) == (len(body), "")


class Collector(stomp.ConnectionListener):
    """stomp.py listener keeping raw MESSAGE bodies (auto_decode off: bytes)."""

    def __init__(self, expected: int) -> None:
        self.bodies: list[bytes] = []
        self.lengths: list[int] = []
        self.expected = expected
        self.done = threading.Event()

    def on_message(self, frame: stomp.utils.Frame) -> None:
        self.bodies.append(frame.body)
        self.lengths.append(int(frame.headers["content-length"]))
        if len(self.bodies) >= self.expected:
            self.done.set()


def stomp_py_subscriber(
    broker: BrokerProcess, destination: str, expected: int
) -> tuple[stomp.Connection12, Collector]:
    conn = stomp.Connection12([(broker.host, broker.port)], auto_decode=False)
    collector = Collector(expected)
    conn.set_listener("collector", collector)
    conn.connect(wait=True)
    ready = threading.Event()

    class Receipts(stomp.ConnectionListener):
        def on_receipt(self, frame: stomp.utils.Frame) -> None:
            ready.set()

    conn.set_listener("receipts", Receipts())
    conn.subscribe(destination, id="py", ack="auto", headers={"receipt": "subscribed"})
    assert ready.wait(10)
    return conn, collector


def test_queue_messages_are_stored_compressed_and_consumed_whole(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "2", config=CONFIG)
    producer = raw(broker)
    producer.connect()
    # Persistent ones wait in the store, nobody consuming yet.
    send_all(producer, "/queue/big", BODIES, persistent=True)
    check_stored(stored(broker.data_dir, "p2p"), BODIES)
    # Our codec drains the stored ones...
    consumer = raw(broker)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/big", "id": "q", "ack": "client-individual"})
    assert take(consumer, len(BODIES)) == BODIES
    consumer.send("UNSUBSCRIBE", {"id": "q", "receipt": "gone"})
    assert consumer.recv().headers["receipt-id"] == "gone"
    # ...stomp.py gets persistent and non-persistent ones live.
    py, got = stomp_py_subscriber(broker, "/queue/big", 2 * len(BODIES))
    try:
        send_all(producer, "/queue/big", BODIES, persistent=False)
        send_all(producer, "/queue/big", BODIES, persistent=True)
        assert got.done.wait(20)
        assert got.bodies == BODIES + BODIES
        assert got.lengths == [len(b) for b in BODIES + BODIES]
    finally:
        py.disconnect()
    rows = stored(broker.data_dir, "p2p")
    check_stored(rows[len(BODIES) :], BODIES)  # the second persistent round only


def test_topic_messages_reach_live_and_returning_durable_subscribers_whole(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "2", config=CONFIG)
    durable = {"activemq.subscriptionName": "big", "ack": "client-individual"}
    away = raw(broker)
    away.connect(**{"client-id": "app"})
    away.send("SUBSCRIBE", {"destination": "/topic/big", "id": "d", "receipt": "d", **durable})
    assert away.recv().headers["receipt-id"] == "d"
    away.send("DISCONNECT", {"receipt": "bye"})
    assert away.recv().command == "RECEIPT"

    live = raw(broker)
    live.connect()
    live.send("SUBSCRIBE", {"destination": "/topic/big", "id": "l", "receipt": "l"})
    assert live.recv().headers["receipt-id"] == "l"
    py, got = stomp_py_subscriber(broker, "/topic/big", 2 * len(BODIES))
    try:
        producer = raw(broker)
        producer.connect()
        send_all(producer, "/topic/big", BODIES, persistent=True)
        send_all(producer, "/topic/big", BODIES, persistent=False)  # kept in memory for it
        assert take(live, 2 * len(BODIES)) == BODIES + BODIES
        assert got.done.wait(20)
        assert got.bodies == BODIES + BODIES
        assert got.lengths == [len(b) for b in BODIES + BODIES]
    finally:
        py.disconnect()
    # Stored once, compressed, for the durable subscriber that is away.
    check_stored(stored(broker.data_dir, "pubsub"), BODIES)

    back = raw(broker)
    back.connect(**{"client-id": "app"})
    back.send("SUBSCRIBE", {"destination": "/topic/big", "id": "d", **durable})
    # Replayed from the store, then the non-persistent ones kept for it: all whole.
    assert take(back, 2 * len(BODIES)) == BODIES + BODIES
    back.assert_no_frame(0.5)
