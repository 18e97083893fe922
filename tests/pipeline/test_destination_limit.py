"""The pipelines against broker.max_destinations: each counts its destinations (a p2p
pipeline its queues; a pubsub pipeline its topics and durable subscriptions), shares the
count, and refuses one more past the limit or past MemWatch's share of max_memory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from mpbroker.config import Config, config_from_mapping
from mpbroker.memory import max_destinations
from mpbroker.pipeline import P2PPipeline, PubSubPipeline
from mpbroker.records import (
    ACK_CLIENT,
    Message,
    Receipt,
    Record,
    Refuse,
    Registered,
    Send,
    Subscribe,
)
from mpbroker.routing import Topology
from mpbroker.stores import MessageStore, TopicStore

T = TypeVar("T")


def config(max_destinations: int = 3) -> Config:
    return config_from_mapping(
        {"broker": {"max_destinations": max_destinations}, "store": {"commit_max_delay_ms": 0}}
    )


@pytest.fixture
def pipelines(tmp_path: Path) -> Iterator[Any]:
    opened: list[P2PPipeline | PubSubPipeline] = []

    def p2p(settings: Config) -> P2PPipeline:
        store = MessageStore.open(tmp_path / "p2p-0", settings.store)
        pipeline = P2PPipeline(0, 0, 1, settings, Topology(1, 1), store, None)
        pipeline.recover()
        opened.append(pipeline)
        return pipeline

    def pubsub(settings: Config) -> PubSubPipeline:
        store = TopicStore(tmp_path / "pubsub-1", tmp_path / "registry.db", settings.store)
        pipeline = PubSubPipeline(1, 0, 1, settings, store, None)
        pipeline.recover()
        opened.append(pipeline)
        return pipeline

    yield p2p, pubsub
    for pipeline in opened:
        pipeline.close()


def of_type(out: dict[int, list[Record]], kind: type[T]) -> list[T]:
    return [r for r in out.get(0, []) if isinstance(r, kind)]


def turn(pipeline: P2PPipeline | PubSubPipeline, *records: Record) -> dict[int, list[Record]]:
    for record in records:
        pipeline.receive(0, record)
    pipeline.step(memwatch_level=0)
    return pipeline.take_output()


def send(n: int, destination: str, *, persistent: bool = False) -> Send:
    message = Message(f"m{n}", destination, {}, b"x", 1000, persistent=persistent)
    return Send(1, message, f"r{n}")


def test_the_limit_is_the_setting_or_derived_from_the_budget(pipelines: Any) -> None:
    p2p, _ = pipelines
    assert p2p(config(3)).destination_limit.limit == 3
    derived = config_from_mapping({})
    assert p2p(derived).destination_limit.limit == max_destinations(derived) > 1000


def test_stored_and_volatile_sends_to_new_queues_are_refused_past_the_limit(
    pipelines: Any,
) -> None:
    p2p, _ = pipelines
    pipeline = p2p(config(3))
    # Stored ones count their queue from their admission on, before the commit.
    out = turn(
        pipeline,
        send(1, "/queue/a", persistent=True),
        send(2, "/queue/b", persistent=True),
        send(3, "/queue/c"),
        send(4, "/queue/d", persistent=True),
        send(5, "/queue/e"),
        send(6, "/queue/a"),
    )
    assert {r.receipt for r in of_type(out, Receipt)} == {"r1", "r2", "r3", "r6"}
    refused = of_type(out, Refuse)
    assert [(r.receipt, r.message) for r in refused] == [
        ("r4", "ResourceAllocation: /queue/d broker.max_destinations 3 reached"),
        ("r5", "ResourceAllocation: /queue/e broker.max_destinations 3 reached"),
    ]
    limit = pipeline.destination_limit
    assert (limit.count, limit.reserved, limit.refused) == (3, set(), 2)
    assert pipeline.statistics("p2p 0", 1, 0).destinations_refused == 2


def test_the_count_is_shared_with_the_other_pipelines(pipelines: Any) -> None:
    p2p, _ = pipelines
    pipeline = p2p(config(3))
    published: list[int] = []
    limit = pipeline.destination_limit
    limit.others = lambda: 2  # the pubsub pipeline holds two topics
    limit.publish = published.append
    out = turn(pipeline, send(1, "/queue/a"), send(2, "/queue/b"))
    assert [r.receipt for r in of_type(out, Receipt)] == ["r1"]
    assert [r.receipt for r in of_type(out, Refuse)] == ["r2"]
    assert published == [1, 2, 1]  # a counted (1); b counted (2), then taken back


def test_memory_past_its_share_refuses_new_queues_not_existing_ones(pipelines: Any) -> None:
    p2p, _ = pipelines
    pipeline = p2p(config(100))
    turn(pipeline, send(1, "/queue/a"))
    pipeline.step(memwatch_level=2, memory_permille=960)  # 96 % of max_memory
    out = turn(pipeline, send(2, "/queue/b"), send(3, "/queue/a"))
    # (`turn` stepped with 0 again only after these records were handled.)
    assert [r.receipt for r in of_type(out, Receipt)] == ["r3"]
    [refuse] = of_type(out, Refuse)
    assert refuse.message == (
        "ResourceAllocation: /queue/b refuse_destinations_percent 95 "
        "(memory at 96 % of max_memory) reached"
    )


def test_topics_and_durable_subscriptions_count_in_a_pubsub_pipeline(pipelines: Any) -> None:
    _, pubsub = pipelines
    pipeline = pubsub(config(2))
    durable = Subscribe(2, 1, "d", "/topic/a", ACK_CLIENT, 10, "d1", durable="app/d")
    out = turn(pipeline, durable)  # the durable subscription and its topic: two
    assert of_type(out, Receipt) == [Receipt(2, "d1")]
    assert pipeline.destination_limit.count == 2
    other = Subscribe(3, 1, "e", "/topic/a", ACK_CLIENT, 10, "e1", durable="app/e")
    plain = Subscribe(3, 2, "p", "/topic/b", ACK_CLIENT, 10, "p1")
    out = turn(pipeline, other, plain)
    assert [r.message for r in of_type(out, Refuse)] == [
        "ResourceAllocation: /topic/a broker.max_destinations 2 reached",
        "ResourceAllocation: /topic/b broker.max_destinations 2 reached",
    ]
    # A subscriber to the topic that exists is no new destination.
    out = turn(pipeline, Subscribe(4, 1, "q", "/topic/a", ACK_CLIENT, 10, "q1"))
    assert of_type(out, Receipt) == [Receipt(4, "q1")]


def test_a_restarted_pipeline_takes_back_its_subscriptions_whatever_the_limit(
    tmp_path: Path,
) -> None:
    store = MessageStore.open(tmp_path / "p2p-restarted", config(1).store)
    pipeline = P2PPipeline(0, 1, 1, config(1), Topology(1, 1), store, None)  # incarnation 1
    pipeline.recover()
    pipeline.step(memwatch_level=0, memory_permille=990)  # memory short too
    # The gateway registers again the subscriptions its connections held (no receipts).
    for n, destination in enumerate(("/queue/a", "/queue/b"), start=1):
        pipeline.receive(0, Subscribe(1, n, f"s{n}", destination, ACK_CLIENT, 10))
    assert not of_type(pipeline.take_output(), Refuse)
    assert set(pipeline.queue_engine.queues) == {"/queue/a", "/queue/b"}
    # Once it registered, a new one is refused as ever.
    out = turn(pipeline, Registered(0, 1), Subscribe(2, 1, "s", "/queue/c", ACK_CLIENT, 10, "r"))
    assert [r.receipt for r in of_type(out, Refuse)] == ["r"]
    pipeline.close()
