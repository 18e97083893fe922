"""Durable subscribers replayed by the replay worker: one stored copy per message, bounded
batches, several subscribers at once, slow subscribers paged back, expiry, kill -9."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mpbroker.harness import BrokerProcess, RawClient

RawFactory = Callable[[BrokerProcess], RawClient]

pytestmark = pytest.mark.slow


def durable(
    broker: BrokerProcess,
    raw: RawFactory,
    client_id: str,
    topic: str,
    prefetch: int = 1000,
) -> RawClient:
    client = raw(broker)
    client.connect(**{"client-id": client_id})
    client.send(
        "SUBSCRIBE",
        {
            "destination": topic,
            "id": "s",
            "ack": "client-individual",
            "activemq.subscriptionName": "d",
            "activemq.prefetchSize": str(prefetch),
            "receipt": "subscribed",
        },
    )
    assert client.recv().headers["receipt-id"] == "subscribed"
    return client


def leave(client: RawClient) -> None:
    client.send("DISCONNECT", {"receipt": "bye"})
    assert client.recv().command == "RECEIPT"
    client.close()


def publish(broker: BrokerProcess, raw: RawFactory, topic: str, bodies: list[bytes]) -> None:
    producer = raw(broker)
    producer.connect()
    for start in range(0, len(bodies), 200):
        chunk = bodies[start : start + 200]
        for n, body in enumerate(chunk):
            producer.send(
                "SEND",
                {"destination": topic, "persistent": "true", "receipt": str(start + n)},
                body,
            )
        for _ in chunk:
            assert producer.recv().command == "RECEIPT"
    producer.close()


def take(client: RawClient, count: int) -> list[bytes]:
    """Receive `count` messages, acknowledging each; fails on a redelivery."""
    bodies = []
    for _ in range(count):
        frame = client.recv(timeout=20)
        assert frame.command == "MESSAGE", frame
        assert "redelivered" not in frame.headers, frame.headers
        client.send("ACK", {"id": frame.headers["ack"]})
        bodies.append(frame.body)
    return bodies


def stored_rows(data_dir: Path) -> int:
    """Message rows in every topic-store segment (settled ones included)."""
    total = 0
    for path in data_dir.glob("pubsub-*/seg-*.db"):
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            total += db.execute("SELECT count(*) FROM messages").fetchone()[0]
        db.close()
    return total


def pending_rows(data_dir: Path) -> int:
    total = 0
    for path in data_dir.glob("pubsub-*-durable.db"):
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            total += db.execute("SELECT count(*) FROM pending").fetchone()[0]
        db.close()
    return total


def wait_until(condition: Callable[[], bool], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_one_stored_copy_serves_every_subscriber_and_goes_when_all_acked(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1")
    topic = "/topic/shared"
    clients = {cid: durable(broker, raw, cid, topic) for cid in ("a", "b", "c")}
    leave(clients.pop("a"))
    leave(clients.pop("b"))
    bodies = [b"m%03d" % n for n in range(50)]
    publish(broker, raw, topic, bodies)
    frame = clients["c"].recv()
    assert frame.headers["destination"] == topic
    clients["c"].send("ACK", {"id": frame.headers["ack"]})
    assert [frame.body, *take(clients["c"], 49)] == bodies
    assert stored_rows(broker.data_dir) == 50  # not one copy per subscriber
    wait_until(lambda: pending_rows(broker.data_dir) == 100)  # a and b still owe theirs
    for cid in ("a", "b"):
        back = durable(broker, raw, cid, topic)
        assert take(back, 50) == bodies
    wait_until(lambda: pending_rows(broker.data_dir) == 0)
    broker.wait_for_log(r"replayed 50 messages in \d+ batches")


def test_many_subscribers_return_at_once_to_a_large_backlog(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    # Small batches, two places, little room in flight: the budget is what is exercised.
    config = (
        "[replay]\nreplay_messages = 40\nreplay_bytes = 8192\n"
        "max_concurrent = 2\nglobal_bytes = 16384\n"
    )
    broker = start_broker("--gateways", "2", config=config)
    topic = "/topic/backlog"
    names = [f"r{n}" for n in range(5)]
    for cid in names:
        leave(durable(broker, raw, cid, topic))
    bodies = [b"%05d-" % n + b"x" * 150 for n in range(1500)]
    publish(broker, raw, topic, bodies)
    back = {cid: durable(broker, raw, cid, topic, prefetch=50) for cid in names}
    received: dict[str, list[bytes]] = {}
    errors: list[BaseException] = []

    def consume(cid: str) -> None:
        try:
            received[cid] = take(back[cid], len(bodies))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    # Each returning subscriber consumes on its own, as real clients do; those without a
    # replay place wait for one.
    threads = [threading.Thread(target=consume, args=(cid,)) for cid in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    for cid in names:
        assert received[cid] == bodies, cid
    broker.wait_for_log("replayed 1500 messages")
    wait_until(lambda: broker.log_text().count("replayed 1500 messages") == len(names))
    assert broker.log_text().count("replayed 1500 messages") == len(names)


def test_a_slow_live_subscriber_is_paged_back_to_the_store(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = "[topics]\nmax_pending_messages = 50\nlive_msg_high = 40\nlive_msg_low = 30\n"
    broker = start_broker("--gateways", "1", config=config)
    topic = "/topic/slow"
    client = durable(broker, raw, "slow", topic, prefetch=10)
    bodies = [b"s%04d" % n for n in range(400)]
    publish(broker, raw, topic, bodies)  # nobody acknowledges meanwhile
    broker.wait_for_log(r"durable subscription 'slow/d' is \d+ messages behind")
    assert take(client, 400) == bodies
    wait_until(lambda: pending_rows(broker.data_dir) == 0)


def test_stored_messages_expire_for_a_subscriber_that_is_away(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = "[queues]\nexpiry_scan_interval_s = 0.2\n"
    broker = start_broker("--gateways", "1", config=config)
    topic = "/topic/ttl"
    leave(durable(broker, raw, "away", topic))
    producer = raw(broker)
    producer.connect()
    for n, ttl in enumerate(["300", "300", ""]):
        headers = {"destination": topic, "persistent": "true", "receipt": str(n)}
        if ttl:
            headers["ttl"] = ttl
        producer.send("SEND", headers, b"ttl" if ttl else b"kept")
        assert producer.recv().command == "RECEIPT"
    broker.wait_for_log(r"expired 2 stored topic messages")
    back = durable(broker, raw, "away", topic)
    assert take(back, 1) == [b"kept"]
    back.assert_no_frame(0.5)


def test_killing_the_replay_worker_mid_replay_loses_and_repeats_nothing(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = "[replay]\nreplay_messages = 10\n"
    broker = start_broker("--gateways", "1", config=config)
    topic = "/topic/replay-kill"
    leave(durable(broker, raw, "k", topic))
    bodies = [b"k%04d" % n for n in range(600)]
    publish(broker, raw, topic, bodies)
    client = durable(broker, raw, "k", topic, prefetch=5)
    got = take(client, 100)
    victim = broker.workers()["replay 0"]
    victim.kill()
    broker.wait_for_worker("replay 0", not_pid=victim.pid)
    got += take(client, 500)
    assert got == bodies


def test_the_backlog_is_replayed_highest_priority_first_across_batches(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = "[replay]\nreplay_messages = 20\n"
    broker = start_broker("--gateways", "1", config=config)
    topic = "/topic/priorities"
    leave(durable(broker, raw, "p", topic))
    producer = raw(broker)
    producer.connect()
    sent = [(b"low%03d" % n, "4") for n in range(100)]
    sent += [(b"urgent%d" % n, "9") for n in range(3)]
    sent += [(b"lowest", "0")]
    for n, (body, priority) in enumerate(sent):
        producer.send(
            "SEND",
            {"destination": topic, "persistent": "true", "priority": priority, "receipt": str(n)},
            body,
        )
        assert producer.recv().command == "RECEIPT"
    back = durable(broker, raw, "p", topic, prefetch=10)
    expected = [b"urgent%d" % n for n in range(3)] + [b"low%03d" % n for n in range(100)]
    assert take(back, 104) == [*expected, b"lowest"]


def test_the_log_expiry_policy_describes_stored_topic_messages_that_expire(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = (
        '[queues]\nexpiry_scan_interval_s = 0.2\n[destinations."/topic/logged"]\n'
        'expiry_policy = "log"\nexpiry_log_fields = "JMSDestination,colour"\n'
    )
    broker = start_broker("--gateways", "1", config=config)
    leave(durable(broker, raw, "away", "/topic/logged"))
    producer = raw(broker)
    producer.connect()
    producer.send(
        "SEND",
        {
            "destination": "/topic/logged",
            "persistent": "true",
            "ttl": "100",
            "colour": "red",
            "receipt": "r",
        },
        b"short-lived",
    )
    assert producer.recv().command == "RECEIPT"
    broker.wait_for_log(
        r"<ExpiredJMSMessage JMSMessageID='ID-\S+' > <HeaderFields "
        r"JMSDestination='/topic/logged' /> <UserProperties colour='red' /> </ExpiredJMSMessage>"
    )
    wait_until(lambda: pending_rows(broker.data_dir) == 0)
