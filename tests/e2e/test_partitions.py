"""Several p2p and pubsub workers: each destination belongs to exactly one of them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from mpbroker.routing import Topology
from tests.broker import BrokerProcess, RawClient

RawFactory = Callable[[BrokerProcess], RawClient]

CONFIG = "[broker]\np2p_workers = 3\npubsub_workers = 2\n[queues]\nmax_redeliveries = 0\n"
QUEUES = [f"/queue/part{n}" for n in range(12)]
TOPICS = [f"/topic/part{n}" for n in range(12)]


def test_destinations_spread_over_partitions_and_all_work(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    topology = Topology(3, 2)
    assert len({topology.owner(q) for q in QUEUES}) == 3, "the names should cover every p2p"
    assert len({topology.owner(t) for t in TOPICS}) == 2
    broker = start_broker("--gateways", "2", config=CONFIG)
    assert sorted(broker.workers()) == [
        "gateway 0",
        "gateway 1",
        "p2p 0",
        "p2p 1",
        "p2p 2",
        "pubsub 0",
        "pubsub 1",
    ]
    consumer = raw(broker)
    consumer.connect()
    for n, destination in enumerate(QUEUES + TOPICS):
        consumer.send("SUBSCRIBE", {"destination": destination, "id": f"s{n}", "receipt": f"s{n}"})
        assert consumer.recv().command == "RECEIPT"
    producer = raw(broker)
    producer.connect()
    for destination in QUEUES + TOPICS:
        producer.send("SEND", {"destination": destination}, destination.encode())
    got = sorted(consumer.recv().body for _ in QUEUES + TOPICS)
    assert got == sorted(d.encode() for d in QUEUES + TOPICS)


@pytest.mark.parametrize("queue", ["/queue/part1", "/queue/part2", "/queue/part5"])
def test_dead_letters_stay_in_their_queues_partition(
    start_broker: type[BrokerProcess], raw: RawFactory, queue: str
) -> None:
    topology = Topology(3, 2)
    name = queue.removeprefix("/queue/")
    assert topology.owner(f"/queue/DLQ.{name}") == topology.owner(queue)
    broker = start_broker("--gateways", "1", config=CONFIG)
    client = raw(broker)
    client.connect()
    client.send("SUBSCRIBE", {"destination": queue, "id": "q", "ack": "client-individual"})
    client.send("SUBSCRIBE", {"destination": f"/queue/DLQ.{name}", "id": "d"})
    client.send("SEND", {"destination": queue, "persistent": "true"}, b"bad")
    first = client.recv()
    client.send("NACK", {"id": first.headers["ack"]})  # max_redeliveries = 0: straight out
    letter = client.recv()
    assert (letter.headers["subscription"], letter.body) == ("d", b"bad")
