"""Several p2p and pubsub workers: each destination belongs to exactly one of them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from mpbroker.harness import BrokerProcess, RawClient
from mpbroker.routing import Topology

RawFactory = Callable[[BrokerProcess], RawClient]

# Ten processes and their budgets exceed the default max_memory (256 MiB): raise it.
CONFIG = (
    "[broker]\np2p_workers = 3\npubsub_workers = 2\n[queues]\nmax_redeliveries = 0\n"
    '[memory]\nmax_memory = "512MiB"\n'
)
QUEUES = [f"/queue/part{n}" for n in range(12)]
TOPICS = [f"/topic/part{n}" for n in range(12)]
DURABLE_TOPICS = ["/topic/part0", "/topic/part1", "/topic/part4", "/topic/part5"]


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
        "replay 0",
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


def test_durable_subscriptions_replay_in_every_pubsub_partition_with_two_replay_workers(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    topology = Topology(3, 2)
    assert len({topology.owner(t) for t in DURABLE_TOPICS}) == 2, "both pubsub partitions"
    config = CONFIG + "[replay]\nworkers = 2\n"
    broker = start_broker("--gateways", "2", config=config)
    assert {"replay 0", "replay 1"} <= set(broker.workers())

    def subscribe(client: RawClient, n: int, destination: str) -> None:
        client.send(
            "SUBSCRIBE",
            {
                "destination": destination,
                "id": f"s{n}",
                "activemq.subscriptionName": f"d{n}",
                "receipt": f"s{n}",
            },
        )
        assert client.recv().command == "RECEIPT"

    away = raw(broker)
    away.connect(**{"client-id": "partitions"})
    for n, destination in enumerate(DURABLE_TOPICS):
        subscribe(away, n, destination)
    away.send("DISCONNECT", {"receipt": "bye"})
    assert away.recv().command == "RECEIPT"
    producer = raw(broker)
    producer.connect()
    for destination in DURABLE_TOPICS:
        producer.send(
            "SEND", {"destination": destination, "persistent": "true", "receipt": "r"}, b"x"
        )
        assert producer.recv().command == "RECEIPT"
    back = raw(broker)
    back.connect(**{"client-id": "partitions"})
    for n, destination in enumerate(DURABLE_TOPICS):
        back.send(
            "SUBSCRIBE",
            {"destination": destination, "id": f"s{n}", "activemq.subscriptionName": f"d{n}"},
        )
    got = sorted(back.recv().headers["destination"] for _ in DURABLE_TOPICS)
    assert got == sorted(DURABLE_TOPICS)
