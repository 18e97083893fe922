"""A store's filesystem running out of room, on a real small filesystem (a tmpfs the test
mounts, so it needs root): `store.disk_free_limit_bytes` stops persistent producers before
the disk is full, as RabbitMQ's disk_free_limit does, and lets them go once there is room;
when the filesystem is full all the same, the disk reserve lets acknowledgements be stored
and draining free space, an acknowledgement that cannot be stored is refused (never a
RECEIPT), and the broker starts. When something else keeps the filesystem full, nothing is
receipted that is not stored, nothing is dead-lettered for the broker's failure, and the
delivery counts the store could not take are written later (`redelivered` survives)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mpbroker.harness import BrokerClosed, BrokerProcess, FrameTimeout, RawClient
from mpbroker.stomp import Frame
from tests.filesystems import fill, kept_full, small_tmpfs

RawFactory = Callable[[BrokerProcess], RawClient]

pytestmark = pytest.mark.slow

MiB = 1024 * 1024


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs, unmounted at the end (after the brokers a test started: request it
    before `start_broker`)."""
    with small_tmpfs(tmp_path / "fs") as mount:
        yield mount


@pytest.fixture
def roomy_fs(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB tmpfs, as `small_fs`: room for a disk free limit and the margin kept above
    it for what the stores may write between two readings (18.4 MiB by default)."""
    with small_tmpfs(tmp_path / "fs", "48m") as mount:
        yield mount


def persistent_send(client: RawClient, receipt: str, body: bytes = b"kept") -> None:
    client.send(
        "SEND",
        {"destination": "/queue/disk", "persistent": "true", "receipt": receipt},
        body,
    )


def send_stored(client: RawClient, count: int, prefix: str = "m") -> None:
    """`count` persistent 4 KB messages, each with its RECEIPT awaited."""
    for i in range(count):
        persistent_send(client, f"{prefix}{i}", f"{prefix}{i}".encode().ljust(4096, b"."))
        assert client.recv(timeout=10).headers["receipt-id"] == f"{prefix}{i}"


def ack(client: RawClient, frame_id: str, receipt: str) -> None:
    client.send("ACK", {"id": frame_id, "receipt": receipt})


def receive_and_ack(client: RawClient, count: int) -> list[Frame]:
    """Take `count` messages, ACK each with a receipt, and wait for every RECEIPT; the
    messages, in order. Any other frame (an ERROR) fails."""
    messages: list[Frame] = []
    receipts: set[str] = set()
    while len(messages) < count or len(receipts) < len(messages):
        frame = client.recv(timeout=10)
        if frame.command == "MESSAGE":
            messages.append(frame)
            ack(client, frame.headers["ack"], f"ack-{len(messages)}")
        else:
            assert frame.command == "RECEIPT", frame
            receipts.add(frame.headers["receipt-id"])
    assert receipts == {f"ack-{i + 1}" for i in range(count)}
    return messages


def heads(messages: list[Frame]) -> list[bytes]:
    """The first 4 bytes of each body (its number, see `send_stored`)."""
    return [m.body[:4] for m in messages]


def numbered(count: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}.".encode()[:4].ljust(4, b".") for i in range(count)]


# Two stores (one p2p, one pubsub worker); a disk reserve of 1 MiB each; the disk free
# limit off, so that the filesystem can really fill up.
FULL_DISK = '[store]\ndisk_free_limit_bytes = "0"\ndisk_reserve_bytes = "1MiB"\n'


def test_persistent_producers_wait_below_the_disk_free_limit_and_go_on_when_there_is_room(
    roomy_fs: Path, start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = (
        '[store]\ndisk_free_limit_bytes = "8MiB"\ndisk_reserve_bytes = "512KiB"\n'
        "[flow]\nsend_timeout_ms = 1500\n"
    )
    broker = start_broker("--gateways", "1", config=config, data_dir=roomy_fs / "data")
    producer = raw(broker)
    producer.connect()
    persistent_send(producer, "before")
    assert producer.recv(timeout=10).headers["receipt-id"] == "before"
    # Something else fills the filesystem: less than 8 MiB and the margin stays free.
    filler = roomy_fs / "filler"
    filler.write_bytes(bytes(26 * MiB))
    broker.wait_for_log(
        r"below store.disk_free_limit_bytes \(8 MiB\) plus .*: persistent producers"
    )
    # Non-persistent messages still go; a persistent one waits, then is refused by name.
    producer.send("SEND", {"destination": "/queue/disk", "receipt": "volatile"}, b"v")
    assert producer.recv(timeout=10).headers["receipt-id"] == "volatile"
    persistent_send(producer, "held")
    error = producer.recv(timeout=10)
    assert error.command == "ERROR"
    assert (
        error.headers["message"]
        == f"ResourceAllocation: /queue/disk disk_free_limit {8 * MiB} reached"
    )
    assert error.headers["receipt-id"] == "held"
    assert b"store.disk_free_limit_bytes" in error.body
    # Room again: producers go on.
    filler.unlink()
    broker.wait_for_log(r"has .* free again: persistent producers may go on")
    again = raw(broker)
    again.connect()
    persistent_send(again, "after")
    assert again.recv(timeout=10).headers["receipt-id"] == "after"
    consumer = raw(broker)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/disk", "id": "c"})
    assert [consumer.recv(timeout=10).body for _ in range(3)] == [b"kept", b"v", b"kept"]
    consumer.assert_no_frame(0.3)


def test_the_broker_starts_on_a_full_filesystem_and_says_so(
    small_fs: Path, start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    (small_fs / "filler").write_bytes(bytes(12 * MiB))
    config = (
        '[store]\ndisk_free_limit_bytes = "8MiB"\ndisk_reserve_bytes = "512KiB"\n'
        "[flow]\nsend_timeout_ms = 500\n"
    )
    broker = start_broker("--gateways", "1", config=config, data_dir=small_fs / "data")
    broker.wait_for_log(r"below store.disk_free_limit_bytes")
    client = raw(broker)
    client.connect()
    client.send("SEND", {"destination": "/queue/disk", "receipt": "volatile"}, b"v")
    assert client.recv(timeout=10).headers["receipt-id"] == "volatile"
    persistent_send(client, "held")
    assert "disk_free_limit" in client.recv(timeout=10).headers["message"]


def test_draining_a_full_filesystem_stores_every_ack_and_frees_space_for_producers(
    small_fs: Path, start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1", config=FULL_DISK, data_dir=small_fs / "data")
    assert (small_fs / "data" / "p2p-0" / "disk-reserve").stat().st_size == MiB
    producer = raw(broker)
    producer.connect()
    send_stored(producer, 200)
    fill(small_fs / "filler")
    # The filesystem is full: a persistent SEND is refused by the store, not acknowledged.
    persistent_send(producer, "no-room", bytes(4096))
    error = producer.recv(timeout=10)
    assert error.command == "ERROR"
    assert error.headers["receipt-id"] == "no-room"
    assert "database or disk is full" in error.headers["message"]
    assert str(small_fs) not in error.headers["message"] + error.body.decode()
    # Every acknowledgement is stored all the same (the reserve), with its RECEIPT.
    consumer = raw(broker)
    consumer.connect()
    consumer.send(
        "SUBSCRIBE", {"destination": "/queue/disk", "id": "c", "ack": "client-individual"}
    )
    assert heads(receive_and_ack(consumer, 200)) == numbered(200)
    broker.wait_for_log(r"is full: released its disk reserve \(1048576 bytes\)")
    # Drained: its segment was rolled and retired, so there is room for new messages.
    again = raw(broker)
    again.connect()
    send_stored(again, 20, prefix="n")
    assert heads(receive_and_ack(consumer, 20)) == numbered(20, "n")
    # After a restart none of the acknowledged messages comes back.
    broker.stop_checked()
    (small_fs / "filler").unlink()
    broker = start_broker("--gateways", "1", config=FULL_DISK, data_dir=small_fs / "data")
    late = raw(broker)
    late.connect()
    late.send("SUBSCRIBE", {"destination": "/queue/disk", "id": "c"})
    late.assert_no_frame(1.0)


def test_an_ack_the_store_cannot_record_gets_an_error_and_the_message_comes_back(
    small_fs: Path, start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = FULL_DISK.replace('"1MiB"', "0")  # no reserve: nothing saves the ACK
    broker = start_broker("--gateways", "1", config=config, data_dir=small_fs / "data")
    producer = raw(broker)
    producer.connect()
    send_stored(producer, 20)
    consumer = raw(broker)
    consumer.connect()
    consumer.send(
        "SUBSCRIBE",
        {
            "destination": "/queue/disk",
            "id": "c",
            "ack": "client-individual",
            "prefetch-count": "1",
        },
    )
    first = consumer.recv(timeout=10)
    assert first.body.startswith(b"m0.")
    fill(small_fs / "filler")
    ack(consumer, first.headers["ack"], "not-stored")
    # (The next message may come first: the ACK made room in the window.)
    frames = consumer.recv_until_closed(timeout=10)
    assert [f.command for f in frames if f.command != "MESSAGE"] == ["ERROR"]
    error = frames[-1]
    assert error.headers["receipt-id"] == "not-stored"
    assert error.headers["message"].startswith("ACK not stored: store error: settle: ")
    assert "unacknowledged" in error.body.decode()
    # Everything else goes on: the refused ACK's message comes back, redelivered, and
    # once there is room again its ACK is stored.
    (small_fs / "filler").unlink()
    other = raw(broker)
    other.connect()
    other.send("SUBSCRIBE", {"destination": "/queue/disk", "id": "o", "ack": "client-individual"})
    messages = receive_and_ack(other, 20)
    assert sorted(heads(messages)) == sorted(numbered(20))
    redelivered = {m.body[:4] for m in messages if m.headers.get("redelivered") == "true"}
    assert b"m0.." in redelivered


def test_the_broker_starts_on_a_full_filesystem_and_its_messages_can_be_drained(
    small_fs: Path, start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1", config=FULL_DISK, data_dir=small_fs / "data")
    producer = raw(broker)
    producer.connect()
    send_stored(producer, 50)
    broker.stop_checked()
    fill(small_fs / "filler")
    config = FULL_DISK.replace('disk_free_limit_bytes = "0"', 'disk_free_limit_bytes = "4MiB"')
    config += "[flow]\nsend_timeout_ms = 500\n"
    broker = start_broker("--gateways", "1", config=config, data_dir=small_fs / "data")
    broker.wait_for_log(r"data dir .* has .* free, below store.disk_free_limit_bytes")
    client = raw(broker)
    client.connect()
    # Non-persistent messages go; persistent ones are refused by name.
    client.send("SEND", {"destination": "/queue/other", "receipt": "volatile"}, b"v")
    assert client.recv(timeout=10).headers["receipt-id"] == "volatile"
    persistent_send(client, "held")
    assert "disk_free_limit" in client.recv(timeout=10).headers["message"]
    # The stored messages are all there, and their acknowledgements are stored.
    consumer = raw(broker)
    consumer.connect()
    consumer.send(
        "SUBSCRIBE", {"destination": "/queue/disk", "id": "c", "ack": "client-individual"}
    )
    assert heads(receive_and_ack(consumer, 50)) == numbered(50)


def take_acking_each(client: RawClient, quiet_s: float = 1.0) -> tuple[list[bytes], set[bytes]]:
    """Until the connection closes or is quiet for `quiet_s`: ACK every MESSAGE with a
    receipt naming its head; (heads delivered, heads whose ACK got a RECEIPT)."""
    delivered: list[bytes] = []
    receipted: set[bytes] = set()
    while True:
        try:
            frame = client.recv(timeout=quiet_s)
        except (FrameTimeout, BrokerClosed, ConnectionResetError):
            return delivered, receipted
        if frame.command == "MESSAGE":
            delivered.append(frame.body[:4])
            try:
                ack(client, frame.headers["ack"], "ack:" + frame.body[:4].decode())
            except OSError:
                return delivered, receipted  # closed by the ERROR of an earlier ACK
        elif frame.command == "RECEIPT":
            receipted.add(frame.headers["receipt-id"][len("ack:") :].encode())
        else:
            assert frame.command == "ERROR", frame
            assert frame.headers["message"].startswith("ACK not stored: "), frame


def test_a_disk_kept_full_from_outside_gets_no_false_receipt_and_dead_letters_nothing(
    small_fs: Path, start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    # The broker's reserve is given back on the first ACK that finds the disk full (that
    # one is stored); the filler takes the space again at once, as another program would.
    config = FULL_DISK + "[queues]\nmax_redeliveries = 1\n"
    broker = start_broker("--gateways", "1", config=config, data_dir=small_fs / "data")
    producer = raw(broker)
    producer.connect()
    send_stored(producer, 20)
    receipted: set[bytes] = set()
    delivered_before: set[bytes] = set()
    with kept_full(small_fs):
        # Consumers come back again and again; every ACK they send fails, and with it their
        # connection: were those returns counted, every message would pass max_redeliveries.
        for _ in range(4):
            for destination in ("/queue/disk", "/queue/DLQ.disk"):
                consumer = raw(broker)
                consumer.connect()
                # One message at a time: the filler takes the reserve back between ACKs.
                consumer.send(
                    "SUBSCRIBE",
                    {
                        "destination": destination,
                        "id": "c",
                        "ack": "client-individual",
                        "prefetch-count": "1",
                    },
                )
                delivered, acked = take_acking_each(consumer)
                assert destination == "/queue/disk" or not delivered, "a dead letter"
                receipted |= acked
                delivered_before.update(delivered)
                consumer.close()
    assert len(receipted) < 20
    broker.stop_checked()
    # The failures were logged once, then counted (a store error has no client address).
    log = broker.log_text()
    assert re.search(
        r"store error while recording acknowledgements: … and \d+ more like it in", log
    )
    assert "from  in" not in log
    broker = start_broker("--gateways", "1", config=config, data_dir=small_fs / "data")
    consumer = raw(broker)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/DLQ.disk", "id": "d"})
    consumer.send(
        "SUBSCRIBE", {"destination": "/queue/disk", "id": "c", "ack": "client-individual"}
    )
    left = 20 - len(receipted)
    messages = receive_and_ack(consumer, left)
    consumer.assert_no_frame(0.5)
    # What was receipted stays acknowledged; the rest is all there, in its queue (nothing
    # dead-lettered), flagged if it was delivered before.
    assert sorted(heads(messages)) == sorted(set(numbered(20)) - receipted)
    assert all(m.headers["subscription"] == "c" for m in messages)
    flagged = {m.body[:4] for m in messages if m.headers.get("redelivered") == "true"}
    assert flagged == delivered_before - receipted


def test_delivery_counts_a_full_disk_did_not_take_are_written_later(
    small_fs: Path, start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = FULL_DISK.replace('"1MiB"', "0")  # no reserve: every count fails
    broker = start_broker("--gateways", "1", config=config, data_dir=small_fs / "data")
    producer = raw(broker)
    producer.connect()
    send_stored(producer, 20)
    with kept_full(small_fs):
        consumer = raw(broker)
        consumer.connect()
        consumer.send(
            "SUBSCRIBE", {"destination": "/queue/disk", "id": "c", "ack": "client-individual"}
        )
        assert len([consumer.recv(timeout=10) for _ in range(20)]) == 20
        consumer.close()  # all 20 come back: their counts cannot be stored now
        broker.wait_for_log(r"store error while counting deliveries")
    # Room again; a clean stop (its marker says the counts are complete) and a start.
    broker.stop_checked()
    broker = start_broker("--gateways", "1", config=config, data_dir=small_fs / "data")
    consumer = raw(broker)
    consumer.connect()
    consumer.send(
        "SUBSCRIBE", {"destination": "/queue/disk", "id": "c", "ack": "client-individual"}
    )
    messages = receive_and_ack(consumer, 20)
    assert heads(messages) == numbered(20)
    assert [m.headers.get("redelivered") for m in messages] == ["true"] * 20
