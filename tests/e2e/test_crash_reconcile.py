"""kill -9 under load, reconciled: every receipted persistent message is delivered.

Producers send persistent messages with receipts, consumers take them with client acks,
and workers (and finally the whole broker) are killed at random moments. At the end every
message whose RECEIPT arrived must have been delivered at least once, and any copy after
the first must carry `redelivered:true`.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from dataclasses import dataclass, field

import pytest

from mpbroker.harness import BrokerProcess, FrameTimeout, RawClient

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
        while sent < total and not ledger.stop.is_set():
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
                client.close()
                client = connect(ledger)
            sent += len(bodies)
    finally:
        client.close()


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
        deadline = time.monotonic() + 60
        while True:
            with ledger.lock:
                missing = ledger.receipted - {body for body, _ in ledger.deliveries}
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        ledger.stop.set()
        producer.join(30)
        consumer.join(30)
    assert not missing, f"{len(missing)} receipted messages never delivered: {sorted(missing)[:10]}"
    assert len(ledger.receipted) > 1000, "the test should have moved a good number of messages"
    seen: set[bytes] = set()
    for body, redelivered in ledger.deliveries:
        if body in seen:
            assert redelivered, f"{body!r} delivered twice without redelivered:true"
        seen.add(body)
