"""JMS priorities and message expiry end to end, for stored and in-memory queue messages."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from mpbroker.harness import BrokerProcess, RawClient

RawFactory = Callable[[BrokerProcess], RawClient]


def send_all(
    client: RawClient, destination: str, messages: list[tuple[bytes, dict[str, str]]]
) -> None:
    for n, (body, headers) in enumerate(messages):
        client.send("SEND", {"destination": destination, "receipt": f"r{n}", **headers}, body)
    for _ in messages:
        assert client.recv().command == "RECEIPT"


@pytest.mark.parametrize("persistent", ["true", "false"])
def test_higher_priority_first_fifo_within_a_priority(
    broker: BrokerProcess, raw: RawFactory, persistent: str
) -> None:
    destination = f"/queue/prio-{persistent}"
    client = raw(broker)
    client.connect()
    plan = [
        (b"low-1", "1"),
        (b"mid-1", "4"),
        (b"high-1", "9"),
        (b"mid-2", "4"),
        (b"high-2", "9"),
        (b"default", ""),
    ]
    send_all(
        client,
        destination,
        [(body, {"persistent": persistent, **({"priority": p} if p else {})}) for body, p in plan],
    )
    client.send("SUBSCRIBE", {"destination": destination, "id": "s"})
    got = [client.recv().body for _ in plan]
    assert got == [b"high-1", b"high-2", b"mid-1", b"mid-2", b"default", b"low-1"]


@pytest.mark.parametrize("persistent", ["true", "false"])
def test_expired_messages_are_never_delivered(
    broker: BrokerProcess, raw: RawFactory, persistent: str
) -> None:
    destination = f"/queue/expiry-{persistent}"
    client = raw(broker)
    client.connect()
    past = str(int(time.time() * 1000) - 1000)
    send_all(
        client,
        destination,
        [
            (b"ttl", {"persistent": persistent, "ttl": "100"}),
            (b"expires", {"persistent": persistent, "expires": past}),
            (b"keeps", {"persistent": persistent, "ttl": "600000"}),
            (b"forever", {"persistent": persistent}),
        ],
    )
    time.sleep(0.3)
    client.send("SUBSCRIBE", {"destination": destination, "id": "s"})
    assert [client.recv().body, client.recv().body] == [b"keeps", b"forever"]
    client.assert_no_frame(0.5)


def test_bad_priority_is_refused(broker: BrokerProcess, raw: RawFactory) -> None:
    client = raw(broker)
    client.connect()
    client.send("SEND", {"destination": "/queue/p", "priority": "11", "receipt": "r"}, b"x")
    frames = client.recv_until_closed()
    assert frames[0].headers["message"] == "header priority:'11' must be an integer from 0 to 9"


def test_expiry_scan_settles_stored_messages_for_good(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = "[queues]\nexpiry_scan_interval_s = 0.2\n"
    broker = start_broker("--gateways", "1", config=config)
    client = raw(broker)
    client.connect()
    send_all(
        client,
        "/queue/scan",
        [(b"short", {"persistent": "true", "ttl": "200"}), (b"long", {"persistent": "true"})],
    )
    broker.wait_for_log(r"expired 1 messages")
    broker.kill()
    again = start_broker("--gateways", "1", config=config, data_dir=broker.data_dir)
    consumer = raw(again)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/scan", "id": "s"})
    assert consumer.recv().body == b"long"
    consumer.assert_no_frame(0.5)


@pytest.mark.parametrize("persistent", ["true", "false"])
def test_expiry_policies_log_and_redirect(
    start_broker: type[BrokerProcess], raw: RawFactory, persistent: str
) -> None:
    config = (
        "[queues]\nexpiry_scan_interval_s = 0.2\n"
        '[destinations."/queue/logged"]\nexpiry_policy = "log"\n'
        'expiry_log_fields = "JMSPriority,%properties%"\n'
        '[destinations."/queue/moved"]\nexpiry_policy = "redirect"\n'
        'expiry_destination = "/queue/expired"\n'
        '[destinations."/queue/to-dlq"]\nexpiry_policy = "redirect"\n'
    )
    broker = start_broker("--gateways", "1", config=config)
    client = raw(broker)
    client.connect()
    for queue in ("logged", "moved", "to-dlq", "discarded"):
        send_all(
            client,
            f"/queue/{queue}",
            [(queue.encode(), {"persistent": persistent, "ttl": "100", "car": "Civic"})],
        )
    broker.wait_for_log(
        r"<ExpiredJMSMessage JMSMessageID='ID-\S+' > <HeaderFields JMSPriority='4' /> "
        r"<UserProperties car='Civic' /> </ExpiredJMSMessage>"
    )
    for target, body in (("/queue/expired", b"moved"), ("/queue/DLQ.to-dlq", b"to-dlq")):
        client.send("SUBSCRIBE", {"destination": target, "id": target})
        frame = client.recv(timeout=10)
        assert frame.body == body
        assert frame.headers["expired-from"] == f"/queue/{body.decode()}"
        assert frame.headers["dead-letter-reason"].startswith("expired at ")
    for gone in ("/queue/logged", "/queue/discarded"):
        client.send("SUBSCRIBE", {"destination": gone, "id": gone})
    client.assert_no_frame(0.5)


def test_expired_messages_do_not_reach_a_slow_topic_subscriber(
    broker: BrokerProcess, raw: RawFactory
) -> None:
    # Measured before: 500 ms messages reached a slow subscriber 2.0-2.75 s after sending.
    slow = raw(broker)
    slow.connect()
    slow.send(
        "SUBSCRIBE",
        {
            "destination": "/topic/ttl",
            "id": "s",
            "ack": "client-individual",
            "activemq.prefetchSize": "1",
            "receipt": "s",
        },
    )
    assert slow.recv().command == "RECEIPT"
    producer = raw(broker)
    producer.connect()
    messages = [(b"first", {})]
    messages += [(b"short-%d" % n, {"ttl": "300"}) for n in range(10)]
    messages += [(b"kept", {"ttl": "60000"}), (b"forever", {})]
    send_all(producer, "/topic/ttl", messages)
    first = slow.recv()
    assert first.body == b"first"
    time.sleep(0.8)  # the 300 ms ones expire while they wait in its backlog
    got = []
    frame = first
    for _ in range(2):
        slow.send("ACK", {"id": frame.headers["ack"]})
        frame = slow.recv()
        got.append(frame.body)
    assert got == [b"kept", b"forever"]
    slow.assert_no_frame(0.3)
