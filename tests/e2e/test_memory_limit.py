"""A broker kept a few tens of MiB above its fixed cost stays inside max_memory under a
flood with slow consumers: it pages to disk, throttles producers, and delivers every message
it accepted exactly once."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter

import psutil
import pytest

from mpbroker.harness import BrokerProcess, RawClient

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
QUEUES = ("/queue/flood-0", "/queue/flood-1")
TOPICS = ("/topic/flood-0", "/topic/flood-1")
BODY_BYTES = 1000
FLOOD_S = 12.0


def broker_pss(broker: BrokerProcess) -> int:
    total = 0
    for process in broker.processes():
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_full_info().pss
    return total


class Sampler(threading.Thread):
    def __init__(self, broker: BrokerProcess) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, broker_pss(self.broker))
            self.done.wait(0.1)


class Producer(threading.Thread):
    """Sends to every destination in turn, each SEND with a receipt; keeps what was
    accepted. A refused SEND (ERROR: flow control's send timeout) ends the connection."""

    def __init__(self, broker: BrokerProcess, name: str, until: float) -> None:
        super().__init__(daemon=True)
        self.client = RawClient(broker.host, broker.port, timeout=30)
        self.client.connect()
        self.name = name
        self.until = until
        self.accepted: list[tuple[str, bytes]] = []
        self.refused = 0

    def run(self) -> None:
        destinations = [*QUEUES, *TOPICS]
        n = 0
        while time.monotonic() < self.until:
            destination = destinations[n % len(destinations)]
            body = f"{self.name}-{n:07d}-".encode().ljust(BODY_BYTES, b".")
            self.client.send("SEND", {"destination": destination, "receipt": str(n)}, body)
            frame = self.client.recv(timeout=30)
            if frame.command != "RECEIPT":
                self.refused += 1
                return
            self.accepted.append((destination, body))
            n += 1
        self.client.close()


class Consumer(threading.Thread):
    """One subscription, slow (a pause after each message) until told to drain."""

    def __init__(self, broker: BrokerProcess, destination: str) -> None:
        super().__init__(daemon=True)
        self.client = RawClient(broker.host, broker.port, timeout=30)
        self.client.connect()
        self.client.send(
            "SUBSCRIBE",
            {"destination": destination, "id": "s", "ack": "auto", "receipt": "sub"},
        )
        assert self.client.recv().command == "RECEIPT"
        self.received: list[bytes] = []
        self.slow = True
        self.quiet_s = 0.0

    def run(self) -> None:
        while True:
            try:
                frame = self.client.recv(timeout=3)
            except (AssertionError, OSError):
                return  # quiet for 3 s: drained
            self.received.append(frame.body)
            if self.slow:
                time.sleep(0.002)


def test_a_flood_with_slow_consumers_stays_within_max_memory_and_loses_nothing(
    start_broker: type[BrokerProcess],
) -> None:
    # The fixed cost of this process set, measured on an idle broker.
    idle = start_broker("--gateways", "1")
    time.sleep(2)
    fixed = max(broker_pss(idle) for _ in range(3))
    idle.stop()
    max_memory = fixed + 32 * MiB
    # Budgets that fit in the 32 MiB above the fixed cost (`mpbroker config show`).
    config = (
        f"[memory]\nmax_memory = {max_memory}\nmemwatch_interval_ms = 200\n"
        "[transactions]\nmax_uncommitted_bytes = 524288\n"
        "[vol_queue_store]\nmsg_high = 20000\nmsg_low = 15000\n"
        "global_msg_high = 20000\nglobal_msg_low = 15000\n"
        "global_byte_high = 2097152\nglobal_byte_low = 1048576\n"
        "[pers_queue_store]\nmsg_high = 5000\nmsg_low = 4000\n"
        "global_msg_high = 5000\nglobal_msg_low = 4000\n"
        "[topics]\nglobal_live_byte_high = 2097152\nglobal_live_byte_low = 1048576\n"
        "global_live_msg_high = 10000\nglobal_live_msg_low = 8000\n"
        "[flow]\nsend_timeout_ms = 60000\n"
    )
    broker = start_broker("--gateways", "1", config=config)
    sampler = Sampler(broker)
    sampler.start()
    consumers = [Consumer(broker, d) for d in (*QUEUES, *TOPICS)]
    for consumer in consumers:
        consumer.start()
    until = time.monotonic() + FLOOD_S
    producers = [Producer(broker, f"p{n}", until) for n in range(4)]
    for producer in producers:
        producer.start()
    for producer in producers:
        producer.join(120)
    for consumer in consumers:
        consumer.slow = False  # drain
    for consumer in consumers:
        consumer.join(120)
    sampler.done.set()
    sampler.join()
    for client in [*(p.client for p in producers), *(c.client for c in consumers)]:
        client.close()

    accepted = Counter(d for p in producers for d, _ in p.accepted)
    assert sum(accepted.values()) > 10000, accepted
    for consumer, destination in zip(consumers, (*QUEUES, *TOPICS), strict=True):
        sent = [body for p in producers for d, body in p.accepted if d == destination]
        # Exactly once, and in each producer's order.
        assert sorted(consumer.received) == sorted(sent), destination
        for p in producers:
            prefix = p.name.encode() + b"-"
            mine = [b for b in consumer.received if b.startswith(prefix)]
            assert mine == [b for d, b in p.accepted if d == destination]
    assert sum(p.refused for p in producers) == 0
    assert sampler.peak <= max_memory, (
        f"peak {sampler.peak / MiB:.1f} MiB above max_memory {max_memory / MiB:.1f} MiB "
        f"(fixed cost {fixed / MiB:.1f} MiB)"
    )
    log = broker.log_text()
    assert "paging non-persistent messages to the temp store" in log
    assert "memory level 2" in log  # producers were throttled
