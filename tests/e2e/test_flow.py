"""Flow control end to end: watermarks stop producers, send timeouts refuse, nothing is
half-accepted."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import pytest

from mpbroker.harness import BrokerProcess, RawClient

RawFactory = Callable[[BrokerProcess], RawClient]

pytestmark = pytest.mark.slow


class Producer(threading.Thread):
    """Sends one message at a time, each with a receipt, and counts the receipts."""

    def __init__(self, broker: BrokerProcess, destination: str, count: int) -> None:
        super().__init__(daemon=True)
        self.client = RawClient(broker.host, broker.port, timeout=30)
        self.client.connect()
        self.destination = destination
        self.count = count
        self.receipts = 0
        self.error: str = ""

    def run(self) -> None:
        try:
            for n in range(self.count):
                self.client.send(
                    "SEND", {"destination": self.destination, "receipt": str(n)}, b"m%d" % n
                )
                frame = self.client.recv(timeout=60)
                if frame.command != "RECEIPT":
                    self.error = frame.headers.get("message", frame.command)
                    return
                self.receipts += 1
        except (AssertionError, OSError) as exc:
            self.error = str(exc)

    def wait_for(self, receipts: int, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while self.receipts < receipts:
            assert not self.error, self.error
            assert time.monotonic() < deadline, f"{self.receipts} receipts, wanted {receipts}"
            time.sleep(0.01)

    def stays_at(self, receipts: int, seconds: float = 0.7) -> None:
        time.sleep(seconds)
        assert self.receipts == receipts

    def finish(self) -> None:
        self.join(30)
        self.client.close()


def test_a_producer_stops_at_high_and_resumes_only_below_low(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = "[vol_queue_store]\nmsg_high = 20\nmsg_low = 10\n[flow]\nsend_timeout_ms = 60000\n"
    broker = start_broker("--gateways", "1", config=config)
    producer = Producer(broker, "/queue/flow", 25)
    producer.start()
    try:
        producer.wait_for(20)
        producer.stays_at(20)  # stopped at msg_high, no error: it waits
        broker.wait_for_log(r"producers to /queue/flow stopped: msg_high 20 reached")
        consumer = raw(broker)
        consumer.connect()
        consumer.send(
            "SUBSCRIBE",
            {
                "destination": "/queue/flow",
                "id": "c",
                "ack": "client-individual",
                "activemq.prefetchSize": "1",
            },
        )
        for _ in range(9):  # 11 left: above low, still stopped
            frame = consumer.recv()
            consumer.send("ACK", {"id": frame.headers["ack"]})
        producer.stays_at(20)
        frame = consumer.recv()
        consumer.send("ACK", {"id": frame.headers["ack"]})  # 10 left: low reached
        producer.wait_for(25)  # 15 held now: below msg_high again
        broker.wait_for_log(r"producers to /queue/flow may go again")
    finally:
        producer.finish()
    assert not producer.error


def test_send_timeout_refuses_with_an_error_naming_the_limit_and_loses_nothing(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = "[vol_queue_store]\nmsg_high = 5\nmsg_low = 2\n[flow]\nsend_timeout_ms = 500\n"
    broker = start_broker("--gateways", "1", config=config)
    client = raw(broker)
    client.connect()
    for n in range(5):
        client.send("SEND", {"destination": "/queue/timeout", "receipt": str(n)}, b"ok%d" % n)
        assert client.recv().command == "RECEIPT"
    started = time.monotonic()
    client.send("SEND", {"destination": "/queue/timeout", "receipt": "late"}, b"refused")
    frames = client.recv_until_closed()
    waited = time.monotonic() - started
    assert [f.command for f in frames] == ["ERROR"]
    error = frames[0]
    assert error.headers["message"] == "ResourceAllocation: /queue/timeout msg_high 5 reached"
    assert error.headers["receipt-id"] == "late"
    assert "send_timeout_ms 500" in error.body.decode()
    assert waited >= 0.4  # it waited for room before giving up
    consumer = raw(broker)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/timeout", "id": "c"})
    assert [consumer.recv().body for _ in range(5)] == [b"ok%d" % n for n in range(5)]
    consumer.assert_no_frame(0.5)


def test_send_timeout_zero_refuses_at_once(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = "[vol_queue_store]\nmsg_high = 3\nmsg_low = 1\n[flow]\nsend_timeout_ms = 0\n"
    broker = start_broker("--gateways", "1", config=config)
    client = raw(broker)
    client.connect()
    for n in range(3):
        client.send("SEND", {"destination": "/queue/zero", "receipt": str(n)}, b"x")
        assert client.recv().command == "RECEIPT"
    client.send("SEND", {"destination": "/queue/zero", "receipt": "r"}, b"x")
    frames = client.recv_until_closed()
    assert frames[0].headers["message"] == "ResourceAllocation: /queue/zero msg_high 3 reached"


def test_a_global_limit_stops_producers_to_every_queue_of_the_store(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = (
        "[vol_queue_store]\nmsg_high = -1\nmsg_low = -1\n"
        "global_msg_high = 10\nglobal_msg_low = 4\n[flow]\nsend_timeout_ms = 300\n"
    )
    broker = start_broker("--gateways", "1", config=config)
    client = raw(broker)
    client.connect()
    for n in range(10):
        client.send("SEND", {"destination": f"/queue/g{n % 2}", "receipt": str(n)}, b"x")
        assert client.recv().command == "RECEIPT"
    client.send("SEND", {"destination": "/queue/another", "receipt": "r"}, b"x")
    frames = client.recv_until_closed()
    assert frames[0].headers["message"] == (
        "ResourceAllocation: /queue/another global_msg_high 10 reached"
    )
    assert "the store stayed over vol_queue_store.global_msg_high" in frames[0].body.decode()


def test_a_slow_topic_subscriber_stops_its_topics_publishers_while_others_flow(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = "[topics]\nlive_msg_high = 20\nlive_msg_low = 5\n[flow]\nsend_timeout_ms = 60000\n"
    broker = start_broker("--gateways", "1", config=config)
    slow = raw(broker)
    slow.connect()
    slow.send(
        "SUBSCRIBE",
        {
            "destination": "/topic/slow",
            "id": "s",
            "ack": "client-individual",
            "activemq.prefetchSize": "1",
            "receipt": "s",
        },
    )
    assert slow.recv().command == "RECEIPT"
    fast = raw(broker)
    fast.connect()
    fast.send("SUBSCRIBE", {"destination": "/topic/fast", "id": "f", "receipt": "f"})
    assert fast.recv().command == "RECEIPT"
    producer = Producer(broker, "/topic/slow", 30)
    producer.start()
    try:
        producer.wait_for(21)  # one in the window, 20 waiting: live_msg_high
        producer.stays_at(21)
        other = Producer(broker, "/topic/fast", 50)
        other.start()
        other.wait_for(50)  # another topic flows meanwhile
        other.finish()
        assert len([fast.recv() for _ in range(50)]) == 50
        # The slow subscriber catches up to live_msg_low: its topic's publishers go again.
        for _ in range(16):
            frame = slow.recv()
            slow.send("ACK", {"id": frame.headers["ack"]})
        producer.wait_for(30)  # 13 waiting now: below live_msg_high again
    finally:
        producer.finish()
    assert not producer.error


def test_destination_patterns_set_their_own_limits_and_send_timeout(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = (
        '[destinations."/queue/small.*"]\nmsg_high = 2\nmsg_low = 1\nsend_timeout_ms = 0\n'
        "[flow]\nsend_timeout_ms = 60000\n"
    )
    broker = start_broker("--gateways", "1", config=config)
    client = raw(broker)
    client.connect()
    for n in range(5):  # the default limits: plenty of room
        client.send("SEND", {"destination": "/queue/big", "receipt": f"b{n}"}, b"x")
        assert client.recv().command == "RECEIPT"
    for n in range(2):
        client.send("SEND", {"destination": "/queue/small.one", "receipt": f"s{n}"}, b"x")
        assert client.recv().command == "RECEIPT"
    client.send("SEND", {"destination": "/queue/small.one", "receipt": "s2"}, b"x")
    frames = client.recv_until_closed()  # refused at once: the table's send_timeout_ms 0
    assert frames[0].headers["message"] == "ResourceAllocation: /queue/small.one msg_high 2 reached"


def test_rate_based_flow_slows_producers_of_an_armed_destination_instead_of_stopping_them(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = (
        '[destinations."/queue/paced"]\nmsg_high = 5\nmsg_low = 2\nflow_control = true\n'
        "flow_maximum = 20.0\nflow_minimum = 10.0\nflow_interval_s = 1.0\nflow_steps = 1\n"
        "[flow]\nsend_timeout_ms = 0\n"  # would refuse at once if it were a stop
    )
    broker = start_broker("--gateways", "1", config=config)
    client = raw(broker)
    client.connect()
    sent_at = []
    for n in range(15):
        client.send("SEND", {"destination": "/queue/paced", "receipt": str(n)}, b"x")
        assert client.recv().command == "RECEIPT"  # never refused: slowed down
        sent_at.append(time.monotonic())
    # Armed after the 5th: the others went at 20/s at most, then 10/s.
    paced = sent_at[-1] - sent_at[5]
    assert paced >= 9 / 20 * 0.9, paced
    consumer = raw(broker)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/paced", "id": "c"})
    assert len([consumer.recv() for _ in range(15)]) == 15


def test_a_shared_quota_holds_senders_to_any_of_its_queues_until_room_comes_back(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = (
        '[quotas.orders]\nmax_messages = 4\n[destinations."/queue/orders.*"]\nquota = "orders"\n'
        "[flow]\nsend_timeout_ms = 60000\n"
    )
    broker = start_broker("--gateways", "1", config=config)
    first = raw(broker)
    first.connect()
    for n, queue in enumerate(["orders.eu", "orders.eu", "orders.us", "orders.us"]):
        first.send("SEND", {"destination": f"/queue/{queue}", "receipt": str(n)}, b"x")
        assert first.recv().command == "RECEIPT"
    waiting = Producer(broker, "/queue/orders.eu", 1)  # the quota is full: it waits
    waiting.start()
    try:
        waiting.stays_at(0)
        other = Producer(broker, "/queue/unrelated", 3)  # no quota: not held
        other.start()
        other.wait_for(3)
        other.finish()
        consumer = raw(broker)
        consumer.connect()
        consumer.send(
            "SUBSCRIBE", {"destination": "/queue/orders.us", "id": "c", "ack": "client-individual"}
        )
        frame = consumer.recv()
        waiting.stays_at(0)  # delivered, not yet acknowledged: still in the quota
        consumer.send("ACK", {"id": frame.headers["ack"]})
        waiting.wait_for(1)
    finally:
        waiting.finish()
    assert not waiting.error


def test_a_sender_that_waits_longer_than_its_send_timeout_for_a_quota_is_refused(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = (
        "[quotas.default]\nmax_messages = 1\n"  # every destination without its own quota
        "[flow]\nsend_timeout_ms = 300\n"
    )
    broker = start_broker("--gateways", "1", config=config)
    client = raw(broker)
    client.connect()
    client.send("SEND", {"destination": "/queue/one", "receipt": "a"}, b"kept")
    assert client.recv().command == "RECEIPT"
    client.send("SEND", {"destination": "/queue/two", "receipt": "b"}, b"refused")
    frames = client.recv_until_closed()
    assert frames[0].headers["message"] == (
        "ResourceAllocation: /queue/two quota default max_messages 1 reached"
    )
    assert frames[0].headers["receipt-id"] == "b"
    consumer = raw(broker)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/two", "id": "c"})
    consumer.assert_no_frame(0.5)  # the refused message was never accepted


def test_a_topic_store_limit_stops_persistent_publishers_until_durable_subscribers_ack(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = "[topic_store]\nmsg_high = 5\nmsg_low = 2\n[flow]\nsend_timeout_ms = 300\n"
    broker = start_broker("--gateways", "1", config=config)
    durable_sub = {
        "destination": "/topic/kept",
        "id": "d",
        "ack": "client-individual",
        "activemq.subscriptionName": "d",
        "receipt": "sub",
    }
    subscriber = raw(broker)
    subscriber.connect(**{"client-id": "app"})
    subscriber.send("SUBSCRIBE", durable_sub)
    assert subscriber.recv().command == "RECEIPT"
    subscriber.send("DISCONNECT", {"receipt": "bye"})
    assert subscriber.recv().command == "RECEIPT"
    producer = raw(broker)
    producer.connect()
    headers = {"destination": "/topic/kept", "persistent": "true"}
    for n in range(5):
        producer.send("SEND", {**headers, "receipt": str(n)}, b"m%d" % n)
        assert producer.recv().command == "RECEIPT"
    producer.send("SEND", {**headers, "receipt": "6"}, b"refused")
    frames = producer.recv_until_closed()
    assert frames[0].headers["message"] == "ResourceAllocation: /topic/kept msg_high 5 reached"
    # The subscriber comes back and acknowledges three: 2 left, the low watermark.
    back = raw(broker)
    back.connect(**{"client-id": "app"})
    back.send("SUBSCRIBE", durable_sub)
    assert back.recv().command == "RECEIPT"
    for _ in range(3):
        frame = back.recv()
        back.send("ACK", {"id": frame.headers["ack"]})
    broker.wait_for_log(r"producers to /topic/kept may go again")
    again = raw(broker)
    again.connect()
    again.send("SEND", {**headers, "receipt": "7"}, b"accepted")
    assert again.recv().command == "RECEIPT"


def test_sighup_reloads_flow_settings_without_dropping_connections(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = "[vol_queue_store]\nmsg_high = 3\nmsg_low = 1\n[flow]\nsend_timeout_ms = 60000\n"
    broker = start_broker("--gateways", "1", config=config)
    path = broker.data_dir.parent / f"{broker.data_dir.name}.toml"
    producer = Producer(broker, "/queue/reload", 6)
    producer.start()
    try:
        producer.wait_for(3)
        producer.stays_at(3)  # stopped at msg_high 3
        # A bad file is refused and changes nothing.
        path.write_text("[vol_queue_store]\nmsg_high = 3\nmsg_low = 7\n")
        os.kill(broker.pid, signal.SIGHUP)
        broker.wait_for_log(r"SIGHUP: configuration not reloaded: .*vol_queue_store.msg_low")
        producer.stays_at(3)
        # So is one whose budgets no longer fit in max_memory.
        path.write_text(
            "[vol_queue_store]\nmsg_high = 10\nmsg_low = 5\n"
            '[topics]\nglobal_live_byte_high = "250MiB"\nglobal_live_byte_low = "200MiB"\n'
        )
        os.kill(broker.pid, signal.SIGHUP)
        broker.wait_for_log(
            r"SIGHUP: configuration not reloaded: the theoretical maximum .* exceeds"
        )
        producer.stays_at(3)
        path.write_text(
            "[vol_queue_store]\nmsg_high = 10\nmsg_low = 5\n[stomp]\nmax_headers = 500\n"
        )
        os.kill(broker.pid, signal.SIGHUP)
        broker.wait_for_log(r"SIGHUP: stomp.max_headers changed: takes effect after a restart")
        broker.wait_for_log(r"flow settings reloaded")
        producer.wait_for(6)  # the same connection goes on under the new limits
    finally:
        producer.finish()
    assert not producer.error


def test_a_consumer_byte_window_holds_back_large_messages_until_acknowledged(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = '[destinations."/queue/big"]\nconsumer_window_bytes = 3000\n'
    broker = start_broker("--gateways", "1", config=config)
    producer = raw(broker)
    producer.connect()
    for n in range(4):
        producer.send("SEND", {"destination": "/queue/big", "receipt": str(n)}, b"%d" % n * 2000)
        assert producer.recv().command == "RECEIPT"
    consumer = raw(broker)
    consumer.connect()
    consumer.send(
        "SUBSCRIBE",
        {"destination": "/queue/big", "id": "c", "ack": "client-individual", "receipt": "s"},
    )
    assert consumer.recv().command == "RECEIPT"
    first, second = consumer.recv(), consumer.recv()  # 2000 + 2000 bytes: the window is full
    consumer.assert_no_frame(0.5)
    consumer.send("ACK", {"id": first.headers["ack"]})
    consumer.send("ACK", {"id": second.headers["ack"]})
    assert {consumer.recv().body[:1], consumer.recv().body[:1]} == {b"2", b"3"}
