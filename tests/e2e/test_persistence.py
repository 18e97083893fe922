"""Persistent queue messages end to end: stored before the RECEIPT, kept across kill -9."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from mpbroker.harness import BrokerProcess, RawClient

RawFactory = Callable[[BrokerProcess], RawClient]

pytestmark = pytest.mark.slow


def send_persistent(client: RawClient, destination: str, bodies: list[bytes]) -> None:
    """Send with receipts and wait for every one: after this, the broker owes us them."""
    for n, body in enumerate(bodies):
        client.send(
            "SEND", {"destination": destination, "persistent": "true", "receipt": f"p{n}"}, body
        )
    receipts = {client.recv().headers["receipt-id"] for _ in bodies}
    assert receipts == {f"p{n}" for n in range(len(bodies))}


def drain(client: RawClient, count: int) -> list[bytes]:
    return [client.recv(timeout=15).body for _ in range(count)]


def test_receipted_messages_survive_a_killed_p2p_worker(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1")
    producer = raw(broker)
    producer.connect()
    bodies = [b"m%d" % n for n in range(200)]
    send_persistent(producer, "/queue/durable", bodies)
    victim = broker.workers()["p2p 0"]
    victim.kill()
    broker.wait_for_worker("p2p 0", not_pid=victim.pid)
    broker.wait_for_log(r"recovered 200 persistent messages from the store")
    consumer = raw(broker)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/durable", "id": "c"})
    got = [consumer.recv(timeout=15) for _ in bodies]
    assert [f.body for f in got] == bodies
    # They might have been delivered before the crash: the flag says so.
    assert all(f.headers["redelivered"] == "true" for f in got)


def test_acked_messages_do_not_come_back_after_a_restart(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    first = start_broker("--gateways", "1")
    client = raw(first)
    client.connect()
    send_persistent(client, "/queue/acks", [b"%d" % n for n in range(10)])
    client.send("SUBSCRIBE", {"destination": "/queue/acks", "id": "c", "ack": "client-individual"})
    frames = [client.recv() for _ in range(10)]
    for frame in frames[:6]:  # ack six, leave four unacked
        client.send("ACK", {"id": frame.headers["ack"]})
    client.send("DISCONNECT", {"receipt": "bye"})
    assert client.recv().command == "RECEIPT"
    first.kill()
    second = start_broker("--gateways", "1", data_dir=first.data_dir)
    again = raw(second)
    again.connect()
    again.send("SUBSCRIBE", {"destination": "/queue/acks", "id": "c"})
    assert sorted(drain(again, 4)) == [b"6", b"7", b"8", b"9"]
    again.assert_no_frame(0.5)


def test_after_a_clean_stop_only_delivered_messages_come_back_redelivered(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    first = start_broker("--gateways", "1")
    client = raw(first)
    client.connect()
    send_persistent(client, "/queue/clean", [b"%d" % n for n in range(6)])
    client.send(
        "SUBSCRIBE",
        {
            "destination": "/queue/clean",
            "id": "c",
            "ack": "client-individual",
            "activemq.prefetchSize": "2",
        },
    )
    assert [client.recv().body for _ in range(2)] == [b"0", b"1"]  # left unacknowledged
    assert first.stop() == 0  # SIGTERM: an orderly stop
    second = start_broker("--gateways", "1", data_dir=first.data_dir)
    again = raw(second)
    again.connect()
    again.send("SUBSCRIBE", {"destination": "/queue/clean", "id": "c"})
    got = [again.recv(timeout=15) for _ in range(6)]
    assert [(f.body, f.headers.get("redelivered")) for f in got] == [
        (b"0", "true"),
        (b"1", "true"),
        (b"2", None),
        (b"3", None),
        (b"4", None),
        (b"5", None),
    ]


def test_non_persistent_messages_are_not_stored(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1")
    client = raw(broker)
    client.connect()
    client.send("SEND", {"destination": "/queue/mixed", "receipt": "np"}, b"volatile")
    assert client.recv().command == "RECEIPT"
    send_persistent(client, "/queue/mixed", [b"kept"])
    victim = broker.workers()["p2p 0"]
    victim.kill()
    broker.wait_for_worker("p2p 0", not_pid=victim.pid)
    consumer = raw(broker)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/mixed", "id": "c"})
    assert drain(consumer, 1) == [b"kept"]
    consumer.assert_no_frame(0.5)


@pytest.mark.parametrize("group_commit", ["true", "false"])
def test_persistent_round_trip_with_and_without_group_commit(
    start_broker: type[BrokerProcess], raw: RawFactory, group_commit: str
) -> None:
    broker = start_broker("--gateways", "1", config=f"[store]\ngroup_commit = {group_commit}\n")
    client = raw(broker)
    client.connect()
    client.send("SUBSCRIBE", {"destination": "/queue/gc", "id": "c", "receipt": "s"})
    assert client.recv().command == "RECEIPT"
    for n in range(50):
        client.send("SEND", {"destination": "/queue/gc", "persistent": "true"}, b"%d" % n)
    client.send("DISCONNECT", {"receipt": "bye"})
    frames = client.recv_until_closed()
    assert [f.body for f in frames if f.command == "MESSAGE"] == [b"%d" % n for n in range(50)]
    assert frames[-1].command == "RECEIPT"


@pytest.mark.parametrize("persistent", ["true", "false"])
def test_a_message_that_keeps_failing_goes_to_the_dead_letter_queue(
    start_broker: type[BrokerProcess], raw: RawFactory, persistent: str
) -> None:
    broker = start_broker("--gateways", "1", config="[queues]\nmax_redeliveries = 1\n")
    client = raw(broker)
    client.connect()
    client.send(
        "SEND",
        {"destination": "/queue/poison", "persistent": persistent, "receipt": "r"},
        b"poison",
    )
    assert client.recv().command == "RECEIPT"
    client.send(
        "SUBSCRIBE", {"destination": "/queue/poison", "id": "p", "ack": "client-individual"}
    )
    for _ in range(2):  # first delivery and one redelivery, both refused
        frame = client.recv()
        client.send("NACK", {"id": frame.headers["ack"]})
    client.send(
        "SUBSCRIBE",
        {"destination": "/queue/DLQ.poison", "id": "d", "ack": "client-individual"},
    )
    letter = client.recv()
    assert letter.headers["subscription"] == "d" and letter.body == b"poison"
    assert letter.headers["original-destination"] == "/queue/poison"
    assert letter.headers["dead-letter-reason"] == "max_redeliveries 1 exceeded (2 deliveries)"
    if persistent == "true":
        # The dead letter is stored: it outlives the broker; the original does not return.
        broker.kill()
        again = start_broker(
            "--gateways", "1", config="[queues]\nmax_redeliveries = 1\n", data_dir=broker.data_dir
        )
        consumer = raw(again)
        consumer.connect()
        consumer.send("SUBSCRIBE", {"destination": "/queue/poison", "id": "p"})
        consumer.send("SUBSCRIBE", {"destination": "/queue/DLQ.poison", "id": "d"})
        frame = consumer.recv()
        assert (frame.headers["subscription"], frame.body) == ("d", b"poison")
        consumer.assert_no_frame(0.5)


def test_a_backlog_beyond_the_index_cache_is_delivered_whole_and_in_order(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = "[store]\nindex_cache_entries = 10\n"
    expected = sorted(range(150), key=lambda n: (-(n % 3 + 3), n))

    def produce(broker: BrokerProcess, queue: str) -> None:
        producer = raw(broker)
        producer.connect()
        for n in range(150):
            headers = {"destination": queue, "persistent": "true", "n": str(n)}
            producer.send("SEND", {**headers, "priority": str(n % 3 + 3)}, b"body-%d" % n)
        producer.send("DISCONNECT", {"receipt": "bye"})
        assert producer.recv().command == "RECEIPT"

    def consume(broker: BrokerProcess, queue: str) -> None:
        consumer = raw(broker)
        consumer.connect()
        subscription = {"id": "c", "ack": "client", "activemq.prefetchSize": "7"}
        consumer.send("SUBSCRIBE", {"destination": queue, **subscription})
        frames = []
        for _ in range(150):
            frames.append(consumer.recv())
            if len(frames) % 7 == 0 or len(frames) == 150:
                consumer.send("ACK", {"id": frames[-1].headers["ack"]})
        assert [int(f.headers["n"]) for f in frames] == expected
        assert all(f.body == b"body-%s" % f.headers["n"].encode() for f in frames)

    broker = start_broker("--gateways", "1", config=config)
    produce(broker, "/queue/paged-live")
    consume(broker, "/queue/paged-live")  # paged while waiting, read back when delivered
    produce(broker, "/queue/paged-recovered")
    broker.kill()
    again = start_broker("--gateways", "1", config=config, data_dir=broker.data_dir)
    consume(again, "/queue/paged-recovered")  # paged again as it is recovered
