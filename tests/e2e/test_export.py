"""`mpbroker export` against a real broker's data directory: while it runs (a snapshot) and
after it stopped, counts per destination and outcome read back from the Parquet files, and
later runs that export only what is new."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mpbroker.cli import main
from mpbroker.export import Options, export
from mpbroker.harness import BrokerProcess, RawClient
from tests.commands import EXPORT_IN_PROCESS

RawFactory = Callable[[BrokerProcess], RawClient]

pytestmark = pytest.mark.slow

CONFIG = "[queues]\nexpiry_scan_interval_s = 0.2\n"
DURABLE = {"activemq.subscriptionName": "sub1", "ack": "client-individual"}


def register_durable(client: RawClient, topic: str) -> None:
    """Subscribe durably (client-id app, subscription sub1) and leave: from now on the topic
    keeps a backlog for it."""
    client.connect(**{"client-id": "app"})
    client.send("SUBSCRIBE", {"destination": topic, "id": "d", "receipt": "d", **DURABLE})
    assert client.recv().headers["receipt-id"] == "d"
    client.send("DISCONNECT", {"receipt": "bye"})
    assert client.recv().command == "RECEIPT"


def send_all(client: RawClient, destination: str, headers: list[dict[str, str]]) -> None:
    for n, extra in enumerate(headers):
        client.send(
            "SEND",
            {"destination": destination, "persistent": "true", "receipt": f"r{n}", **extra},
            b"body-%d" % n,
        )
    assert {client.recv(timeout=15).headers["receipt-id"] for _ in headers} == {
        f"r{n}" for n in range(len(headers))
    }


def consume_and_ack(client: RawClient, destination: str, count: int, **headers: str) -> None:
    client.send(
        "SUBSCRIBE",
        {"destination": destination, "id": "s", "ack": "client-individual", **headers},
    )
    for _ in range(count):
        frame = client.recv(timeout=15)
        client.send("ACK", {"id": frame.headers["ack"]})
    client.send("DISCONNECT", {"receipt": "bye"})
    # Messages delivered beyond `count` (the consumer window) arrive before the RECEIPT;
    # left unacked, they go back to wait.
    while client.recv(timeout=15).command != "RECEIPT":
        pass


def table(out: Path) -> pa.Table:
    return pa.concat_tables([pq.read_table(f) for f in sorted(out.rglob("*.parquet"))])


def by(out: Path, *columns: str) -> Counter[tuple[object, ...]]:
    d = table(out).to_pydict()
    return Counter(zip(*(d[c] for c in columns), strict=True))


def wait_for_expired(broker: BrokerProcess, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = sum(int(n) for n in re.findall(r"expired (\d+) messages", broker.log_text()))
        if done >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"fewer than {count} messages expired in {timeout} s")


def test_export_while_running_after_stopping_and_incrementally(
    start_broker: type[BrokerProcess], raw: RawFactory, tmp_path: Path
) -> None:
    broker = start_broker("--gateways", "1", config=CONFIG)
    register_durable(raw(broker), "/topic/ex")

    producer = raw(broker)
    producer.connect()
    send_all(producer, "/queue/ex-a", [{} for _ in range(150)])
    send_all(producer, "/queue/ex-b", [{"ttl": "300"} if n < 20 else {} for n in range(100)])
    send_all(producer, "/topic/ex", [{"priority": str(n % 10)} for n in range(100)])

    consumer = raw(broker)
    consumer.connect()
    consume_and_ack(consumer, "/queue/ex-a", 50)
    back = raw(broker)
    back.connect(**{"client-id": "app"})
    consume_and_ack(back, "/topic/ex", 30, **{"activemq.subscriptionName": "sub1"})
    wait_for_expired(broker, 20)

    # While the broker runs: a snapshot of every stored message, each exactly once.
    live = tmp_path / "live"
    summary = export(broker.data_dir, live, Options())
    assert summary.rows == 350
    assert by(live, "destination") == {
        ("/queue/ex-a",): 150,
        ("/queue/ex-b",): 100,
        ("/topic/ex",): 100,
    }

    assert broker.stop() == 0
    stopped = tmp_path / "stopped"
    assert (
        main(
            [
                "export",
                "--data-dir",
                str(broker.data_dir),
                "--out",
                str(stopped),
                *EXPORT_IN_PROCESS,
            ]
        )
        == 0
    )
    assert by(stopped, "destination", "kind", "outcome") == {
        ("/queue/ex-a", "queue", "acked"): 50,
        ("/queue/ex-a", "queue", "pending"): 100,
        ("/queue/ex-b", "queue", "expired"): 20,
        ("/queue/ex-b", "queue", "pending"): 80,
        ("/topic/ex", "topic", "acked"): 30,
        ("/topic/ex", "topic", "pending"): 70,
    }
    d = table(stopped).to_pydict()
    assert all(
        at is not None
        for at, o in zip(d["settled_at"], d["outcome"], strict=True)
        if o != "pending"
    )
    assert {
        p for p, o in zip(d["pending_subscriptions"], d["outcome"], strict=True) if o == "pending"
    } >= {1}

    # Nothing new: neither export directory gains a row.
    for out in (live, stopped):
        again = export(broker.data_dir, out, Options())
        assert (again.rows, again.files_written) == (0, 0)
        assert len(table(out)) == 350

    # More messages after a restart: only they are exported, with no row twice.
    again = start_broker("--gateways", "1", config=CONFIG, data_dir=broker.data_dir)
    producer = raw(again)
    producer.connect()
    send_all(producer, "/queue/ex-a", [{} for _ in range(10)])
    send_all(producer, "/topic/ex", [{} for _ in range(5)])
    for out in (live, stopped):
        summary = export(again.data_dir, out, Options())
        assert summary.rows == 15
        rows = table(out).to_pydict()
        assert len(rows["seq"]) == 365
        assert len(set(zip(rows["store"], rows["seq"], strict=True))) == 365


def test_redeliveries_and_dead_letter_sizes_are_what_happened(
    start_broker: type[BrokerProcess], raw: RawFactory, tmp_path: Path
) -> None:
    """A queue message NACKed until max_redeliveries sends it to the dead-letter queue counts
    every delivery its dead-letter reason names; its dead-letter copy's size is its own
    (with the headers it gained); a topic message returned by its durable subscriber counts
    those returns too."""
    broker = start_broker("--gateways", "1", config="[queues]\nmax_redeliveries = 3\n")
    register_durable(raw(broker), "/topic/redo")
    producer = raw(broker)
    producer.connect()
    send_all(producer, "/queue/redo", [{"k": "v"}])
    send_all(producer, "/topic/redo", [{}])

    client = raw(broker)
    client.connect()
    client.send("SUBSCRIBE", {"destination": "/queue/redo", "id": "q", "ack": "client-individual"})
    for _ in range(4):  # the first delivery and three redeliveries, all refused
        client.send("NACK", {"id": client.recv(timeout=15).headers["ack"]})
    client.send("DISCONNECT", {"receipt": "bye"})
    assert client.recv(timeout=15).command == "RECEIPT"

    back = raw(broker)
    back.connect(**{"client-id": "app"})
    back.send("SUBSCRIBE", {"destination": "/topic/redo", "id": "d", **DURABLE})
    for _ in range(2):  # returned twice, then acknowledged
        back.send("NACK", {"id": back.recv(timeout=15).headers["ack"]})
    back.send("ACK", {"id": back.recv(timeout=15).headers["ack"]})
    back.send("DISCONNECT", {"receipt": "bye"})
    assert back.recv(timeout=15).command == "RECEIPT"
    assert broker.stop() == 0

    out = tmp_path / "out"
    export(broker.data_dir, out, Options())
    rows = {r["destination"]: r for r in table(out).to_pylist()}
    original, letter, topic = rows["/queue/redo"], rows["/queue/DLQ.redo"], rows["/topic/redo"]
    reason = dict(letter["headers"])["dead-letter-reason"]
    assert reason == "max_redeliveries 3 exceeded (4 deliveries)"
    assert (original["outcome"], original["redeliveries"]) == ("dead-lettered", 4)
    assert (topic["outcome"], topic["redeliveries"]) == ("acked", 2)
    # The copy is bigger by exactly the header lines it gained.
    gained = sum(
        len(k) + len(v)
        for k, v in dict(letter["headers"]).items()
        if k in ("original-destination", "dead-letter-reason")
    )
    assert letter["size_bytes"] == original["size_bytes"] + gained
