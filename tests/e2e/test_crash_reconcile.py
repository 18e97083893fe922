"""kill -9 under load, reconciled: every receipted persistent message is delivered.

Producers send persistent messages with receipts (each SEND, or a transaction's COMMIT),
consumers take them with client acks, and workers (and finally the whole broker) are killed
at random moments, once after the data directory's filesystem was full for a while. At the
end every message whose RECEIPT arrived must have been delivered at least once, and any
copy after the first must carry `redelivered:true`.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mpbroker.harness import BrokerProcess, FrameTimeout, RawClient
from tests.filesystems import fill, small_tmpfs

pytestmark = pytest.mark.slow

BATCH = 20


@dataclass
class Ledger:
    lock: threading.Lock = field(default_factory=threading.Lock)
    receipted: set[bytes] = field(default_factory=set)
    deliveries: list[tuple[bytes, bool]] = field(default_factory=list)
    port: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    destination: str = "/queue/reconcile"
    # A durable topic subscription instead of a queue: the headers that make it durable.
    durable: dict[str, str] = field(default_factory=dict)
    # Producers stop early once this is set (the consumer goes on until `stop`).
    enough: threading.Event = field(default_factory=threading.Event)
    # Batches refused or cut off (not owed).
    failed_batches: int = 0

    def subscription(self) -> dict[str, str]:
        return {
            "destination": self.destination,
            "id": "c",
            "ack": "client-individual",
            **self.durable,
        }


def connect(ledger: Ledger) -> RawClient:
    """Connect to wherever the broker is now, retrying while it restarts."""
    deadline = time.monotonic() + 30
    while True:
        client: RawClient | None = None
        try:
            client = RawClient("127.0.0.1", ledger.port, timeout=5)
            client.connect(**({"client-id": "reconcile"} if ledger.durable else {}))
            return client
        except (OSError, AssertionError, ConnectionError):
            if client is not None:
                client.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def produce(ledger: Ledger, total: int) -> None:
    sent = 0
    client = connect(ledger)
    try:
        while sent < total and not ledger.stop.is_set() and not ledger.enough.is_set():
            bodies = [b"m%05d" % n for n in range(sent, min(total, sent + BATCH))]
            try:
                for body in bodies:
                    client.send(
                        "SEND",
                        {
                            "destination": ledger.destination,
                            "persistent": "true",
                            "receipt": body.decode(),
                        },
                        body,
                    )
                for _ in bodies:
                    frame = client.recv(timeout=10)
                    assert frame.command == "RECEIPT", frame
                    with ledger.lock:
                        ledger.receipted.add(frame.headers["receipt-id"].encode())
            except (OSError, ConnectionError, AssertionError):
                # Unreceipted messages of this batch may or may not exist: they are not
                # owed. Send the batch again on a new connection (new messages).
                with ledger.lock:
                    ledger.failed_batches += 1
                client.close()
                client = connect(ledger)
            sent += len(bodies)
    finally:
        client.close()


def produce_in_transactions(ledger: Ledger, total: int) -> None:
    """Batches of BATCH persistent messages, each in a transaction whose COMMIT carries the
    receipt: a batch is owed once that RECEIPT arrives, all of it."""
    sent = 0
    client = connect(ledger)
    try:
        while sent < total and not ledger.stop.is_set() and not ledger.enough.is_set():
            bodies = [b"t%05d" % n for n in range(sent, min(total, sent + BATCH))]
            tx = f"tx{sent}"
            try:
                client.send("BEGIN", {"transaction": tx})
                for body in bodies:
                    client.send(
                        "SEND",
                        {
                            "destination": ledger.destination,
                            "persistent": "true",
                            "transaction": tx,
                        },
                        body,
                    )
                client.send("COMMIT", {"transaction": tx, "receipt": tx})
                frame = client.recv(timeout=10)
                assert frame.command == "RECEIPT", frame
                with ledger.lock:
                    ledger.receipted.update(bodies)
            except (OSError, ConnectionError, AssertionError):
                # Refused (a full disk) or cut off: not owed; new messages on a new connection.
                with ledger.lock:
                    ledger.failed_batches += 1
                client.close()
                client = connect(ledger)
            sent += len(bodies)
    finally:
        client.close()


def wait_until_delivered(ledger: Ledger, seconds: float) -> set[bytes]:
    """The receipted messages still not delivered once all are, or `seconds` passed."""
    deadline = time.monotonic() + seconds
    while True:
        with ledger.lock:
            missing = ledger.receipted - {body for body, _ in ledger.deliveries}
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.2)


def assert_reconciled(ledger: Ledger, missing: set[bytes], least: int) -> None:
    assert not missing, f"{len(missing)} receipted messages never delivered: {sorted(missing)[:10]}"
    assert len(ledger.receipted) > least, "the test should have moved a good number of messages"
    seen: set[bytes] = set()
    for body, redelivered in ledger.deliveries:
        if body in seen:
            assert redelivered, f"{body!r} delivered twice without redelivered:true"
        seen.add(body)


def consume(ledger: Ledger) -> None:
    client = connect(ledger)
    client.send("SUBSCRIBE", ledger.subscription())
    try:
        while not ledger.stop.is_set():
            try:
                frame = client.recv(timeout=0.5)
            except FrameTimeout:
                continue  # nothing within the timeout
            except (OSError, ConnectionError):
                client.close()
                client = connect(ledger)
                client.send("SUBSCRIBE", ledger.subscription())
                continue
            if frame.command != "MESSAGE":
                continue
            with ledger.lock:
                ledger.deliveries.append((frame.body, frame.headers.get("redelivered") == "true"))
            with contextlib.suppress(OSError):  # reconnects on the next recv
                client.send("ACK", {"id": frame.headers["ack"]})
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["queue", "durable topic"])
def test_kill_9_at_random_moments_loses_no_receipted_message(
    start_broker: type[BrokerProcess], kind: str
) -> None:
    rng = random.Random(20261123)
    broker = start_broker("--gateways", "2")
    ledger = Ledger(port=broker.port)
    victims = ["gateway 0", "gateway 1", "p2p 0"]
    if kind == "durable topic":
        ledger.destination = "/topic/reconcile"
        ledger.durable = {"activemq.subscriptionName": "reconcile"}
        victims = ["gateway 0", "gateway 1", "pubsub 0", "replay 0"]
        # The subscription must exist before the first message is published.
        first = RawClient(broker.host, broker.port)
        try:
            first.connect(**{"client-id": "reconcile"})
            first.send("SUBSCRIBE", {**ledger.subscription(), "receipt": "s"})
            assert first.recv().command == "RECEIPT"
        finally:
            first.close()
    producer = threading.Thread(target=produce, args=(ledger, 3000))
    consumer = threading.Thread(target=consume, args=(ledger,))
    producer.start()
    consumer.start()
    try:
        for _ in range(5):
            time.sleep(rng.uniform(0.2, 0.8))
            title = rng.choice(victims)
            victim = broker.workers().get(title)
            if victim is not None:
                victim.kill()
                broker.wait_for_worker(title, not_pid=victim.pid)
        # Finally the whole broker, restarted on the same data directory.
        time.sleep(rng.uniform(0.2, 0.5))
        broker.kill()
        broker = start_broker("--gateways", "2", data_dir=broker.data_dir)
        ledger.port = broker.port
        producer.join(120)
        assert not producer.is_alive()
        missing = wait_until_delivered(ledger, 60)
    finally:
        ledger.stop.set()
        producer.join(30)
        consumer.join(30)
    assert_reconciled(ledger, missing, 1000)


@pytest.fixture
def data_fs(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs for the data directory (requested before `start_broker`, so it is
    unmounted after the brokers stopped)."""
    with small_tmpfs(tmp_path / "fs", "64m") as mount:
        yield mount


def test_a_full_disk_kill_9_and_transactions_lose_no_receipted_message(
    data_fs: Path, start_broker: type[BrokerProcess]
) -> None:
    """A plain and a transactional producer, a consumer; the filesystem fills up for a
    while (producers are refused, acknowledgements go on with the disk reserve), then the
    p2p worker and finally the whole broker are killed."""
    # The free-space limit off, so the filesystem really fills; 1 MiB reserves.
    config = '[store]\ndisk_free_limit_bytes = "0"\ndisk_reserve_bytes = "1MiB"\n'
    data_dir = data_fs / "data"
    broker = start_broker("--gateways", "2", config=config, data_dir=data_dir)
    ledger = Ledger(port=broker.port)
    threads = [
        threading.Thread(target=produce, args=(ledger, 90_000)),
        threading.Thread(target=produce_in_transactions, args=(ledger, 90_000)),
    ]
    consumer = threading.Thread(target=consume, args=(ledger,))
    for thread in [*threads, consumer]:
        thread.start()
    try:
        time.sleep(0.3)
        fill(data_fs / "filler")
        time.sleep(1.5)
        with ledger.lock:
            refused_while_full = ledger.failed_batches
        (data_fs / "filler").unlink()
        time.sleep(0.3)
        victim = broker.workers()["p2p 0"]
        victim.kill()
        broker.wait_for_worker("p2p 0", not_pid=victim.pid)
        time.sleep(0.3)
        broker.kill()
        broker = start_broker("--gateways", "2", config=config, data_dir=data_dir)
        ledger.port = broker.port
        time.sleep(0.5)
        ledger.enough.set()
        for thread in threads:
            thread.join(120)
            assert not thread.is_alive()
        missing = wait_until_delivered(ledger, 60)
    finally:
        ledger.stop.set()
        for thread in [*threads, consumer]:
            thread.join(30)
    assert refused_while_full > 0, "the producers should have met the full filesystem"
    assert_reconciled(ledger, missing, 1000)
    assert any(body.startswith(b"t") for body in ledger.receipted)
