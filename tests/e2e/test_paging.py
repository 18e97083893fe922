"""Flow-to-disk end to end: non-persistent bodies paged to the temp store and back, a full
temp store stops producers (and lets them go when consumers drain), large messages wait
while memory is short."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mpbroker.harness import BrokerProcess, FrameTimeout, RawClient
from tests.e2e._admin import eventually, worker_stats

RawFactory = Callable[[BrokerProcess], RawClient]

pytestmark = pytest.mark.slow

PAGING = """
[vol_queue_store]
global_byte_high = 131072
global_byte_low = 65536
[temp_store]
segment_bytes = 65536
limit_bytes = {limit}
page_step_bytes = 32768
[flow]
send_timeout_ms = {timeout}
"""


def temp_files(broker: BrokerProcess) -> list[Path]:
    return sorted((broker.data_dir / "p2p-0-temp").glob("tmp-*"))


def send_many(client: RawClient, destination: str, bodies: list[bytes]) -> None:
    """Pipelined SENDs, one receipt at the end (in order: all were taken before it)."""
    for body in bodies:
        client.send("SEND", {"destination": destination}, body)
    client.send("SEND", {"destination": destination, "receipt": "last"}, b"last")
    frame = client.recv(timeout=30)
    assert (frame.command, frame.headers.get("receipt-id")) == ("RECEIPT", "last"), frame


def receive(client: RawClient, destination: str, count: int) -> list[bytes]:
    client.send("SUBSCRIBE", {"destination": destination, "id": "s", "ack": "auto"})
    return [client.recv(timeout=30).body for _ in range(count)]


def test_bodies_over_the_volqueuestore_budget_are_paged_to_disk_and_come_back_in_order(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker(
        "--gateways", "1", config=PAGING.format(limit=8 * 1024 * 1024, timeout=10000)
    )
    producer = raw(broker)
    producer.connect()
    bodies = [b"%05d" % n + bytes(995) for n in range(2000)]  # 2 MB, the budget is 128 KiB
    send_many(producer, "/queue/paged", bodies)
    temp = eventually(lambda: worker_stats(broker, "p2p 0").get("temp_store", {}).get("messages"))
    assert temp > 1500  # most bodies are on disk
    assert temp_files(broker)
    broker.wait_for_log(r"paging non-persistent messages to the temp store")
    consumer = raw(broker)
    consumer.connect()
    assert receive(consumer, "/queue/paged", 2001) == [*bodies, b"last"]
    # Every body read back: every file went whole.
    eventually(lambda: not temp_files(broker))
    eventually(lambda: worker_stats(broker, "p2p 0")["temp_store"]["messages"] == 0)


def test_a_full_temp_store_stops_producers_until_consumers_drain_then_they_resume(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    # Room for two 64 KiB units on disk: ~128 messages, and ~128 KiB more in memory.
    broker = start_broker("--gateways", "1", config=PAGING.format(limit=131072, timeout=30000))
    producer = raw(broker)
    producer.connect()
    sent: list[bytes] = []
    for n in range(800):  # 800 KB: far more than memory and temp store hold
        body = b"%05d" % n + bytes(995)
        producer.send("SEND", {"destination": "/queue/full", "receipt": str(n)}, body)
        try:
            frame = producer.recv(timeout=2)
        except FrameTimeout:  # no receipt: held by flow control
            break
        assert frame.command == "RECEIPT", frame
        sent.append(body)
    else:
        pytest.fail("the producer was never stopped")
    assert 100 < len(sent) < 800
    broker.wait_for_log(r"stopped: limit_bytes 131072 reached")
    consumer = raw(broker)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/full", "id": "s", "ack": "auto"})
    got = [consumer.recv(timeout=30).body for _ in range(len(sent))]
    assert got == sent
    # The held SEND went through once there was room again: its receipt, then the message.
    frame = producer.recv(timeout=30)
    assert (frame.command, frame.headers.get("receipt-id")) == ("RECEIPT", str(len(sent)))
    assert consumer.recv(timeout=30).body.startswith(b"%05d" % len(sent))


def test_a_temp_store_full_past_the_send_timeout_refuses_with_an_error_naming_its_limit(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1", config=PAGING.format(limit=131072, timeout=300))
    producer = raw(broker)
    producer.connect()
    for n in range(2000):
        producer.send("SEND", {"destination": "/queue/refused", "receipt": str(n)}, bytes(1000))
        frame = producer.recv(timeout=10)
        if frame.command == "ERROR":
            break
    else:
        pytest.fail("never refused")
    assert (
        frame.headers["message"] == "ResourceAllocation: /queue/refused limit_bytes 131072 reached"
    )
    assert "temp_store.limit_bytes" in frame.body.decode()
    assert frame.headers["receipt-id"] == str(n)


def test_a_large_message_waits_while_memory_is_short_and_small_ones_are_slowed_down(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    # Level 2 from 2 % of max_memory: short of memory from the start.
    config = (
        '[memory]\nmemwatch_levels = "1,2"\nmemwatch_interval_ms = 100\n'
        "socket_reader_threshold_bytes = 4096\n"
        "[flow]\nsend_timeout_ms = 400\nflow_maximum = 20.0\nflow_minimum = 10.0\n"
    )
    broker = start_broker("--gateways", "1", config=config)
    broker.wait_for_log(r"memory level 2")
    client = raw(broker)
    client.connect()
    started = time.monotonic()
    for n in range(6):  # small: taken, at most 20 a second
        client.send("SEND", {"destination": "/queue/small", "receipt": str(n)}, bytes(100))
        assert client.recv(timeout=10).command == "RECEIPT"
    assert time.monotonic() - started >= 0.2  # paced: 5 gaps of at least 1/20 s
    client.send("SEND", {"destination": "/queue/large", "receipt": "big"}, bytes(5000))
    frames = client.recv_until_closed()
    assert [f.command for f in frames] == ["ERROR"]
    message = frames[0].headers["message"]
    assert message.startswith("ResourceAllocation: /queue/large throttle_level 2")
    assert "above socket_reader_threshold_bytes 4096" in message


def test_topic_messages_waiting_for_a_slow_subscriber_are_paged_and_come_back_in_order(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = (
        "[topics]\nglobal_live_byte_high = 131072\nglobal_live_byte_low = 65536\n"
        "live_msg_high = 5000\nlive_msg_low = 4000\n"
        "[temp_store]\nsegment_bytes = 65536\nlimit_bytes = 8388608\n"
    )
    broker = start_broker("--gateways", "1", config=config)
    slow, fast = raw(broker), raw(broker)
    for client, sub, ack in ((slow, "slow", "client-individual"), (fast, "fast", "auto")):
        client.connect()
        headers = {"destination": "/topic/paged", "id": sub, "ack": ack, "receipt": sub}
        if client is slow:
            headers["activemq.prefetchSize"] = "1"
        client.send("SUBSCRIBE", headers)
        assert client.recv().command == "RECEIPT"
    producer = raw(broker)
    producer.connect()
    bodies = [b"%05d" % n + bytes(995) for n in range(1500)]
    send_many(producer, "/topic/paged", bodies)
    assert [fast.recv(timeout=30).body for _ in range(1501)] == [*bodies, b"last"]
    paged = eventually(
        lambda: worker_stats(broker, "pubsub 0").get("temp_store", {}).get("messages")
    )
    assert paged > 1000
    got = []
    for _ in range(1501):
        frame = slow.recv(timeout=30)
        got.append(frame.body)
        slow.send("ACK", {"id": frame.headers["ack"]})
    assert got == [*bodies, b"last"]
    eventually(lambda: not sorted((broker.data_dir / "pubsub-0-temp").glob("tmp-*")))
