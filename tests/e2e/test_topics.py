"""Topics end to end: every subscriber connected at the time gets every message, in order."""

from __future__ import annotations

from collections.abc import Callable

from mpbroker.harness import BrokerProcess, RawClient

RawFactory = Callable[[BrokerProcess], RawClient]


def subscribe(client: RawClient, destination: str, sub_id: str, **headers: str) -> None:
    client.send(
        "SUBSCRIBE", {"destination": destination, "id": sub_id, "receipt": sub_id, **headers}
    )
    assert client.recv().headers["receipt-id"] == sub_id


def test_every_subscriber_gets_every_message_in_order(
    broker: BrokerProcess, raw: RawFactory
) -> None:
    subscribers = [raw(broker) for _ in range(4)]
    for i, client in enumerate(subscribers):
        client.connect()
        subscribe(client, "/topic/fanout", f"s{i}")
    producer = raw(broker)
    producer.connect()
    total = 500
    for n in range(total):
        producer.send("SEND", {"destination": "/topic/fanout", "seq": str(n)}, f"m{n}".encode())
    for i, client in enumerate(subscribers):
        got = [client.recv() for _ in range(total)]
        assert [f.body for f in got] == [f"m{n}".encode() for n in range(total)], f"subscriber {i}"
        assert {f.headers["subscription"] for f in got} == {f"s{i}"}
        # One message, one id, whoever receives it.
        assert [f.headers["seq"] for f in got] == [str(n) for n in range(total)]


def test_subscriber_joining_later_gets_only_later_messages(
    broker: BrokerProcess, raw: RawFactory
) -> None:
    producer = raw(broker)
    producer.connect()
    producer.send("SEND", {"destination": "/topic/late", "receipt": "r0"}, b"before")
    assert producer.recv().command == "RECEIPT"
    late = raw(broker)
    late.connect()
    subscribe(late, "/topic/late", "l")
    producer.send("SEND", {"destination": "/topic/late"}, b"after")
    assert late.recv().body == b"after"


def test_topics_are_independent_of_queues_with_the_same_name(
    broker: BrokerProcess, raw: RawFactory
) -> None:
    client = raw(broker)
    client.connect()
    subscribe(client, "/topic/same", "t")
    subscribe(client, "/queue/same", "q")
    client.send("SEND", {"destination": "/queue/same"}, b"to queue")
    client.send("SEND", {"destination": "/topic/same"}, b"to topic")
    frames = {client.recv().headers["subscription"]: None for _ in range(2)}
    assert set(frames) == {"t", "q"}


def test_client_ack_topic_subscriber_window(broker: BrokerProcess, raw: RawFactory) -> None:
    slow = raw(broker)
    slow.connect()
    subscribe(slow, "/topic/window", "w", ack="client-individual", **{"activemq.prefetchSize": "2"})
    producer = raw(broker)
    producer.connect()
    for n in range(4):
        producer.send("SEND", {"destination": "/topic/window"}, str(n).encode())
    first = [slow.recv(), slow.recv()]
    slow.assert_no_frame(0.5)  # the window is full
    for frame in first:
        slow.send("ACK", {"id": frame.headers["ack"]})
    assert [slow.recv().body, slow.recv().body] == [b"2", b"3"]


def test_persistent_topic_messages_reach_connected_subscribers(
    broker: BrokerProcess, raw: RawFactory
) -> None:
    # Without durable subscribers (a later milestone) a persistent topic message is
    # delivered to whoever is subscribed, like a non-persistent one.
    client = raw(broker)
    client.connect()
    subscribe(client, "/topic/persistent", "s")
    client.send("SEND", {"destination": "/topic/persistent", "persistent": "true"}, b"p")
    frame = client.recv()
    assert frame.body == b"p" and frame.headers["persistent"] == "true"
