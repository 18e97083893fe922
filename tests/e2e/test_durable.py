"""Durable topic subscriptions: messages published while away are kept and replayed."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import pytest

from mpbroker.harness import BrokerClosed, BrokerProcess, RawClient
from mpbroker.stomp import Frame
from tests.e2e.test_faults import gateway_of

RawFactory = Callable[[BrokerProcess], RawClient]

pytestmark = pytest.mark.slow

DURABLE = {"activemq.subscriptionName": "sub1", "ack": "client-individual"}


def durable_client(broker: BrokerProcess, raw: RawFactory, client_id: str = "app") -> RawClient:
    client = raw(broker)
    client.connect(**{"client-id": client_id})
    return client


def subscribe(client: RawClient, destination: str, sub_id: str, **headers: str) -> None:
    client.send(
        "SUBSCRIBE", {"destination": destination, "id": sub_id, "receipt": sub_id, **headers}
    )
    assert client.recv().headers["receipt-id"] == sub_id


def publish(
    client: RawClient, destination: str, bodies: list[bytes], persistent: str = "true"
) -> None:
    for n, body in enumerate(bodies):
        client.send(
            "SEND", {"destination": destination, "persistent": persistent, "receipt": f"p{n}"}, body
        )
    assert {client.recv().headers["receipt-id"] for _ in bodies} == {
        f"p{n}" for n in range(len(bodies))
    }


def take(client: RawClient, count: int) -> list[bytes]:
    frames = [client.recv(timeout=15) for _ in range(count)]
    for frame in frames:
        client.send("ACK", {"id": frame.headers["ack"]})
    return [f.body for f in frames]


def test_messages_published_while_away_are_replayed_in_order_then_live(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "2")
    first = durable_client(broker, raw)
    subscribe(first, "/topic/news", "s", **DURABLE)
    producer = raw(broker)
    producer.connect()
    publish(producer, "/topic/news", [b"while-here"])
    assert take(first, 1) == [b"while-here"]
    first.send("DISCONNECT", {"receipt": "bye"})
    assert first.recv().command == "RECEIPT"
    publish(producer, "/topic/news", [b"away-%d" % n for n in range(30)])
    publish(producer, "/topic/news", [b"volatile"], persistent="false")  # kept for it too
    back = durable_client(broker, raw)
    subscribe(back, "/topic/news", "s", **DURABLE)
    publish(producer, "/topic/news", [b"live"])
    assert take(back, 32) == [b"away-%d" % n for n in range(30)] + [b"volatile", b"live"]
    back.assert_no_frame(0.5)


def test_durable_subscription_and_its_backlog_survive_a_restart(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1")
    client = durable_client(broker, raw)
    subscribe(client, "/topic/kept", "s", **DURABLE)
    client.close()
    producer = raw(broker)
    producer.connect()
    publish(producer, "/topic/kept", [b"m%d" % n for n in range(20)])
    broker.kill()
    again = start_broker("--gateways", "1", data_dir=broker.data_dir)
    producer = raw(again)
    producer.connect()
    # The subscription exists although nobody is connected: new messages are kept too.
    publish(producer, "/topic/kept", [b"after-restart"])
    back = durable_client(again, raw)
    subscribe(back, "/topic/kept", "s", **DURABLE)
    assert take(back, 21) == [b"m%d" % n for n in range(20)] + [b"after-restart"]


def test_unacked_messages_come_back_and_acked_ones_do_not(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1")
    client = durable_client(broker, raw)
    subscribe(client, "/topic/acks", "s", **DURABLE)
    producer = raw(broker)
    producer.connect()
    publish(producer, "/topic/acks", [b"a", b"b", b"c"])
    frames = [client.recv() for _ in range(3)]
    client.send("ACK", {"id": frames[0].headers["ack"]})
    client.send("DISCONNECT", {"receipt": "bye"})
    assert client.recv().command == "RECEIPT"
    back = durable_client(broker, raw)
    subscribe(back, "/topic/acks", "s", **DURABLE)
    again = [back.recv(), back.recv()]
    assert [f.body for f in again] == [b"b", b"c"]
    assert all(f.headers["redelivered"] == "true" for f in again)


def test_durable_unsubscribe_removes_the_subscription_and_its_backlog(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1")
    client = durable_client(broker, raw)
    subscribe(client, "/topic/gone", "s", **DURABLE)
    producer = raw(broker)
    producer.connect()
    publish(producer, "/topic/gone", [b"x", b"y"])
    client.recv()
    client.send("UNSUBSCRIBE", {"id": "s", "activemq.subscriptionName": "sub1", "receipt": "u"})
    frames = [client.recv()]
    while frames[-1].command != "RECEIPT":
        frames.append(client.recv())
    broker.wait_for_log(r"durable subscription 'app/sub1' removed")
    publish(producer, "/topic/gone", [b"z"])
    subscribe(client, "/topic/gone", "s2", **DURABLE)  # a new, empty subscription
    publish(producer, "/topic/gone", [b"fresh"])
    assert take(client, 1) == [b"fresh"]


def test_other_protocols_durable_headers_and_errors(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1")
    producer = raw(broker)
    producer.connect()
    # Artemis' header, and RabbitMQ's durable:true named by the id.
    artemis = durable_client(broker, raw, "artemis-app")
    subscribe(artemis, "/topic/h", "a", **{"durable-subscription-name": "n"})
    rabbit = durable_client(broker, raw, "rabbit-app")
    subscribe(rabbit, "/topic/h", "r", durable="true")
    artemis.close()
    rabbit.close()
    publish(producer, "/topic/h", [b"kept"])
    for client_id, headers in (
        ("artemis-app", {"durable-subscription-name": "n"}),
        ("rabbit-app", {"durable": "true"}),
    ):
        back = durable_client(broker, raw, client_id)
        subscribe(
            back, "/topic/h", "a" if "durable-subscription-name" in headers else "r", **headers
        )
        assert back.recv().body == b"kept"
    # ActiveMQ's header needs a client-id; a second subscriber to an active one is refused.
    anonymous = raw(broker)
    anonymous.connect()
    anonymous.send("SUBSCRIBE", {"destination": "/topic/h", "id": "x", **DURABLE})
    assert "needs a client-id" in anonymous.recv_until_closed()[0].headers["message"]
    holder = durable_client(broker, raw, "twin")
    subscribe(holder, "/topic/h", "t", **DURABLE)
    twin = durable_client(broker, raw, "twin")
    twin.send("SUBSCRIBE", {"destination": "/topic/h", "id": "t", **DURABLE})
    assert "already active" in twin.recv_until_closed()[0].headers["message"]


# -- non-persistent messages for a subscriber that is away (JMS 1.1, 6.11) ----------------


def leave(client: RawClient) -> None:
    client.send("DISCONNECT", {"receipt": "bye"})
    assert client.recv().headers["receipt-id"] == "bye"


def test_non_persistent_messages_are_kept_while_away_in_order_with_persistent_ones(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "2")
    first = durable_client(broker, raw)
    subscribe(first, "/topic/mixed", "s", **DURABLE)
    leave(first)
    producer = raw(broker)
    producer.connect()
    sent = []
    for n in range(40):
        persistent = "true" if n % 3 == 0 else "false"
        publish(producer, "/topic/mixed", [b"%s-%d" % (persistent.encode(), n)], persistent)
        sent.append(b"%s-%d" % (persistent.encode(), n))
    back = durable_client(broker, raw)
    subscribe(back, "/topic/mixed", "s", **DURABLE)
    assert take(back, 40) == sent
    back.assert_no_frame(0.3)
    # Acknowledged, nothing comes back; and a second absence works the same way.
    leave(back)
    publish(producer, "/topic/mixed", [b"again"], persistent="false")
    third = durable_client(broker, raw)
    subscribe(third, "/topic/mixed", "s", **DURABLE)
    assert take(third, 1) == [b"again"]


def test_a_selector_keeps_only_what_it_selects_while_away(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1")
    first = durable_client(broker, raw)
    subscribe(first, "/topic/sel", "s", selector="kind = 'keep'", **DURABLE)
    leave(first)
    producer = raw(broker)
    producer.connect()
    for n, kind in enumerate(["keep", "skip", "keep"]):
        producer.send(
            "SEND", {"destination": "/topic/sel", "kind": kind, "receipt": f"r{n}"}, kind.encode()
        )
        assert producer.recv().headers["receipt-id"] == f"r{n}"
    back = durable_client(broker, raw)
    subscribe(back, "/topic/sel", "s", selector="kind = 'keep'", **DURABLE)
    assert take(back, 2) == [b"keep", b"keep"]
    back.assert_no_frame(0.3)


def test_what_is_kept_for_a_subscriber_that_is_away_is_bounded_by_the_topic_watermarks(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = (
        "[topics]\nlive_msg_high = 20\nlive_msg_low = 10\nmax_pending_messages = 30\n"
        "[flow]\nsend_timeout_ms = 300\n"
    )
    broker = start_broker("--gateways", "1", config=config)
    first = durable_client(broker, raw)
    subscribe(first, "/topic/bounded", "s", **DURABLE)
    leave(first)
    producer = raw(broker)
    producer.connect()
    publish(producer, "/topic/bounded", [b"%d" % n for n in range(20)], persistent="false")
    # Its backlog reached the topic's live_msg_high: publishers wait, then are refused.
    producer.send("SEND", {"destination": "/topic/bounded", "receipt": "held"}, b"held")
    error = producer.recv(timeout=10)
    assert error.command == "ERROR"
    assert error.headers["message"] == "ResourceAllocation: /topic/bounded live_msg_high 20 reached"
    # The subscriber comes back: it gets every message kept, and publishers go on.
    back = durable_client(broker, raw)
    subscribe(back, "/topic/bounded", "s", **DURABLE)
    assert take(back, 20) == [b"%d" % n for n in range(20)]
    again = raw(broker)
    again.connect()
    publish(again, "/topic/bounded", [b"after"], persistent="false")
    assert take(back, 1) == [b"after"]


def test_non_persistent_messages_kept_for_a_subscriber_that_is_away_do_not_survive_a_restart(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1")
    first = durable_client(broker, raw)
    subscribe(first, "/topic/restart", "s", **DURABLE)
    leave(first)
    producer = raw(broker)
    producer.connect()
    publish(producer, "/topic/restart", [b"volatile"], persistent="false")
    publish(producer, "/topic/restart", [b"stored"])
    broker.stop_checked()
    broker = start_broker("--gateways", "1", data_dir=broker.data_dir)
    back = durable_client(broker, raw)
    subscribe(back, "/topic/restart", "s", **DURABLE)
    assert take(back, 1) == [b"stored"]
    back.assert_no_frame(0.3)


def reconnected(broker: BrokerProcess, raw: RawFactory) -> RawClient:
    """A client connected right after a gateway was killed, trying again (as a client's
    reconnect loop does) when its connection is reset: one made while the killed gateway
    was going was taken into its listening socket's queue."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return durable_client(broker, raw)
        except (BrokerClosed, ConnectionError):
            assert time.monotonic() < deadline, "no gateway took a connection"


def test_a_subscriber_whose_gateway_is_killed_gets_its_subscription_back_at_once(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    """Issue 30: after a kill -9 of its gateway, a durable subscriber that reconnected at
    once (through the other gateway) was refused `already active` for about a second, until
    the killed gateway's successor said Hello. The pubsub worker now sees that the holder's
    gateway is gone and lets the subscriber in, with its backlog."""
    broker = start_broker("--gateways", "2")
    subscriber = durable_client(broker, raw)
    subscribe(subscriber, "/topic/killed", "s", **DURABLE)
    producer = raw(broker)
    producer.connect()
    bodies = [b"m%d" % n for n in range(5)]
    publish(producer, "/topic/killed", bodies)
    # In its window, not acknowledged, when its gateway dies.
    assert [subscriber.recv(timeout=15).body for _ in bodies] == bodies
    title = gateway_of(broker, subscriber)
    victim = broker.workers()[title]
    victim.kill()
    # It sees its connection drop, and comes back at once: through the other gateway (the
    # killed one's successor is not listening yet).
    with pytest.raises((BrokerClosed, ConnectionError)):
        subscriber.recv(timeout=10)
    back = reconnected(broker, raw)
    back.send("SUBSCRIBE", {"destination": "/topic/killed", "id": "s", "receipt": "r", **DURABLE})
    frames: list[Frame] = []
    with contextlib.suppress(BrokerClosed):  # (after an ERROR: said below)
        while len(frames) <= len(bodies):
            frames.append(back.recv(timeout=15))
    assert [f.command for f in frames] == ["RECEIPT"] + ["MESSAGE"] * len(bodies), [
        (f.command, f.headers.get("message")) for f in frames
    ]
    assert [f.body for f in frames[1:]] == bodies
    assert all(f.headers["redelivered"] == "true" for f in frames[1:])
    for frame in frames[1:]:
        back.send("ACK", {"id": frame.headers["ack"]})
    producer = reconnected(broker, raw)  # (it may have been on the killed gateway too)
    publish(producer, "/topic/killed", [b"after"])
    assert take(back, 1) == [b"after"]
    # Its gateway's successor, when it says Hello, takes nothing from it.
    broker.wait_for_worker(title, not_pid=victim.pid)
    publish(producer, "/topic/killed", [b"later"])
    assert take(back, 1) == [b"later"]
