"""Messages far larger than the rings (issue 5): 3 MiB bodies through 64 KiB rings, which
carry them in fragments, on a queue, a topic and a durable subscription's replay."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import pytest

from mpbroker.harness import BrokerProcess, RawClient
from mpbroker.stomp import SERVER_COMMANDS, FrameLimits, FrameParser

MiB = 1 << 20
RING_BYTES = 64 * 1024
CONFIG = f"""
[rings]
capacity_bytes = {RING_BYTES}

[stomp]
max_frame_bytes = {4 * MiB}
"""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data_dir = tmp_path_factory.mktemp("data")
    with BrokerProcess("--gateways", "2", data_dir=data_dir, config=CONFIG) as proc:
        yield proc


@pytest.fixture
def raw(raw: Callable[[BrokerProcess], RawClient]) -> Callable[[BrokerProcess], RawClient]:
    """RawClients that take frames up to 8 MiB from the broker (the codec's default is 1 MiB)."""

    def make(proc: BrokerProcess) -> RawClient:
        client = raw(proc)
        client.parser = FrameParser(FrameLimits(max_frame_bytes=8 * MiB), commands=SERVER_COMMANDS)
        return client

    return make


RawFactory = Callable[[BrokerProcess], RawClient]


def body(n: int) -> bytes:
    """3 MiB of bytes that differ per message and per offset (NULs included)."""
    return random.Random(n).randbytes(3 * MiB)


def subscribe(client: RawClient, destination: str, sub_id: str, **headers: str) -> None:
    client.send(
        "SUBSCRIBE", {"destination": destination, "id": sub_id, "receipt": sub_id, **headers}
    )
    assert client.recv().headers["receipt-id"] == sub_id


def send(client: RawClient, destination: str, payload: bytes, **headers: str) -> None:
    client.send("SEND", {"destination": destination, "receipt": "sent", **headers}, payload)
    frame = client.recv(timeout=30)
    assert frame.command == "RECEIPT", frame


def take(client: RawClient, count: int) -> list[bytes]:
    bodies = []
    for _ in range(count):
        frame = client.recv(timeout=30)
        assert frame.command == "MESSAGE", frame
        if frame.headers.get("ack"):
            client.send("ACK", {"id": frame.headers["ack"]})
        bodies.append(frame.body)
    return bodies


@pytest.mark.parametrize("persistent", ["false", "true"])
def test_a_queue_delivers_messages_larger_than_its_rings(
    broker: BrokerProcess, raw: RawFactory, persistent: str
) -> None:
    queue = f"/queue/big-{persistent}"
    producer = raw(broker)
    producer.connect()
    sent = [body(n) for n in range(3)]
    for payload in sent:
        send(producer, queue, payload, persistent=persistent)
    consumer = raw(broker)
    consumer.connect()
    subscribe(consumer, queue, "q", ack="client-individual")
    got = take(consumer, len(sent))
    assert [len(b) for b in got] == [3 * MiB] * 3
    assert got == sent


def test_every_topic_subscriber_gets_messages_larger_than_its_rings(
    broker: BrokerProcess, raw: RawFactory
) -> None:
    subscribers = [raw(broker) for _ in range(3)]
    for i, client in enumerate(subscribers):
        client.connect()
        subscribe(client, "/topic/big", f"s{i}")
    producer = raw(broker)
    producer.connect()
    sent = [body(10 + n) for n in range(2)]
    for payload in sent:
        send(producer, "/topic/big", payload)
    for i, client in enumerate(subscribers):
        assert take(client, len(sent)) == sent, f"subscriber {i}"
    # Small messages still pass, after and between the big ones.
    send(producer, "/topic/big", b"small")
    for client in subscribers:
        assert take(client, 1) == [b"small"]


def test_a_durable_subscriber_gets_a_replay_batch_larger_than_the_rings(
    broker: BrokerProcess, raw: RawFactory
) -> None:
    topic = "/topic/big-durable"
    headers = {
        "ack": "client-individual",
        "activemq.subscriptionName": "d",
    }
    away = raw(broker)
    away.connect(**{"client-id": "big"})
    subscribe(away, topic, "s", **headers)
    away.send("DISCONNECT", {"receipt": "bye"})
    assert away.recv().command == "RECEIPT"
    away.close()
    producer = raw(broker)
    producer.connect()
    sent = [body(20 + n) for n in range(2)]
    for payload in sent:
        send(producer, topic, payload, persistent="true")
    back = raw(broker)
    back.connect(**{"client-id": "big"})
    subscribe(back, topic, "s", **headers)
    assert take(back, len(sent)) == sent
    broker.wait_for_log(r"replayed 2 messages in \d+ batches", timeout=30)
