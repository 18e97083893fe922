"""`store.disk_free_limit_bytes` holds under persistent producers at full speed, on a real
small filesystem (a tmpfs the test mounts, so it needs root): the free space, read by the
test every few milliseconds, never goes below the limit, not even for the segment rolls
and WAL checkpoints of the stores; producers are held and refused naming the limit (never
a store error), and nothing receipted is lost across a restart."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mpbroker.harness import BrokerClosed, BrokerProcess, RawClient
from mpbroker.stomp import Frame, encode_frame
from tests.filesystems import small_tmpfs

RawFactory = Callable[[BrokerProcess], RawClient]

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
LIMIT = 4 * MiB
# Small segments, so that producers roll them often; held SENDs are refused soon.
CONFIG = (
    '[store]\ndisk_free_limit_bytes = "4MiB"\nsegment_max_bytes = "2MiB"\n'
    'disk_reserve_bytes = "1MiB"\n[flow]\nsend_timeout_ms = 300\n'
)
PRODUCERS = 3
IN_FLIGHT = 32
BODY_BYTES = 8 * 1024


class FreeSpace:
    """The free space of a filesystem, read from a thread every `every_s`: the lowest
    reading, and how many were taken."""

    def __init__(self, path: Path, every_s: float = 0.002) -> None:
        self.path = path
        self.every_s = every_s
        self.lowest = self.read()
        self.readings = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="free-space", daemon=True)

    def read(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def _run(self) -> None:
        while not self._stop.is_set():
            self.lowest = min(self.lowest, self.read())
            self.readings += 1
            self._stop.wait(self.every_s)

    def __enter__(self) -> FreeSpace:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Producer(threading.Thread):
    """Persistent SENDs of random (incompressible) bodies to `destination`, IN_FLIGHT at a
    time, each asking for a receipt, until the broker has refused `refusals` of them (a
    refused SEND's ERROR closes the connection: then a new one goes on)."""

    def __init__(self, broker: BrokerProcess, destination: str, name: str, refusals: int) -> None:
        super().__init__(name=name, daemon=True)
        self.broker = broker
        self.destination = destination
        self.refusals = refusals
        self.receipted: set[str] = set()
        self.errors: list[Frame] = []
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self._produce()
        except BaseException as exc:
            self.failure = exc

    def _produce(self) -> None:
        sent = 0
        deadline = time.monotonic() + 120
        while len(self.errors) < self.refusals:
            assert time.monotonic() < deadline, "the broker never refused a SEND"
            client = RawClient(self.broker.host, self.broker.port, timeout=30)
            try:
                client.connect()
                while True:
                    ids = [f"{self.name}-{sent + i}" for i in range(IN_FLIGHT)]
                    sent += IN_FLIGHT
                    client.send_bytes(b"".join(self._frame(i) for i in ids))
                    if not self._answers(client, set(ids)):
                        break
            finally:
                client.close()

    def _frame(self, message_id: str) -> bytes:
        body = f"{message_id}.".encode() + os.urandom(BODY_BYTES)
        headers = {"destination": self.destination, "persistent": "true", "receipt": message_id}
        return encode_frame(Frame("SEND", headers, body))

    def _answers(self, client: RawClient, waiting: set[str]) -> bool:
        """The RECEIPTs of `waiting`; False once an ERROR came (the connection closes)."""
        while waiting:
            try:
                frame = client.recv()
            except BrokerClosed:
                return False
            if frame.command == "ERROR":
                self.errors.append(frame)
                return False
            assert frame.command == "RECEIPT", frame
            receipt = frame.headers["receipt-id"]
            waiting.discard(receipt)
            self.receipted.add(receipt)
        return True


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB tmpfs, unmounted at the end (after the brokers a test started: request it
    before `start_broker`)."""
    with small_tmpfs(tmp_path / "fs", "48m") as mount:
        yield mount


def produce_until_refused(broker: BrokerProcess, destination: str) -> tuple[set[str], list[Frame]]:
    """PRODUCERS producers at full speed until each was refused 3 times; what was
    receipted, and the ERRORs."""
    producers = [Producer(broker, destination, f"p{n}", refusals=3) for n in range(PRODUCERS)]
    for producer in producers:
        producer.start()
    for producer in producers:
        producer.join(timeout=180)
        assert not producer.is_alive()
        if producer.failure is not None:
            raise producer.failure
    receipted = set().union(*(p.receipted for p in producers))
    return receipted, [error for p in producers for error in p.errors]


def drain(client: RawClient, receipted: set[str]) -> set[str]:
    """Every message until each receipted one came (auto ack); their ids."""
    received: set[str] = set()
    while not receipted <= received:
        frame = client.recv(timeout=30)
        assert frame.command == "MESSAGE", frame
        received.add(frame.body.split(b".", 1)[0].decode())
    return received


@pytest.mark.parametrize("destination", ["/queue/disk", "/topic/disk"])
def test_free_space_never_goes_below_the_limit_under_producers_at_full_speed(
    destination: str, small_fs: Path, start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    topic = destination.startswith("/topic/")
    durable = {"activemq.subscriptionName": "kept"} if topic else {}
    broker = start_broker("--gateways", "2", config=CONFIG, data_dir=small_fs / "data")
    if topic:
        # A durable subscription that is away: the topic store keeps every message.
        keeper = raw(broker)
        keeper.connect(**{"client-id": "keeper"})
        keeper.send("SUBSCRIBE", {"destination": destination, "id": "k", **durable})
        keeper.disconnect()
    with FreeSpace(small_fs) as free:
        receipted, errors = produce_until_refused(broker, destination)
        assert free.lowest >= LIMIT, f"{free.lowest} bytes free, below the limit ({LIMIT})"
        assert len(receipted) > 500
        # Held, then refused by name; or refused by the store before it wrote a thing:
        # never a store error.
        for error in errors:
            message = f"ResourceAllocation: {destination} disk_free_limit {LIMIT} reached"
            assert error.headers["message"] == message, error
        broker.wait_for_log(r"below store.disk_free_limit_bytes \(4 MiB\)")
        broker.stop_checked()
        broker = start_broker("--gateways", "2", config=CONFIG, data_dir=small_fs / "data")
        consumer = raw(broker)
        consumer.connect(**{"client-id": "keeper"})
        consumer.send("SUBSCRIBE", {"destination": destination, "id": "k", **durable})
        drain(consumer, receipted)
    # ...nor while the restarted broker delivered and settled them.
    assert free.lowest >= LIMIT, f"{free.lowest} bytes free, below the limit ({LIMIT})"
    assert free.readings > 1000
