"""PubSubPipeline: topics, durable subscriptions and their replays, with a real topic store
and no rings (the replay worker's part is played by the test)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

from mpbroker.admin import DurableRow
from mpbroker.config import Config, config_from_mapping
from mpbroker.flow import STORE_LIVE
from mpbroker.pipeline import PubSubPipeline
from mpbroker.records import (
    ACK_CLIENT,
    CONN_INCARNATION_SHIFT,
    Ack,
    ConnClosed,
    Deliver,
    FlowState,
    Hello,
    Receipt,
    Record,
    Refuse,
    ReplayBatch,
    ReplayRelease,
    ReplayRequest,
    Send,
    Subscribe,
)
from mpbroker.stores import StoreError, TopicStore
from tests.factories import make_message

T = TypeVar("T")
TOPIC = "/topic/t"
PIPELINE = 1


def config(**sections: dict[str, Any]) -> Config:
    return config_from_mapping({"store": {"commit_max_delay_ms": 0}, **sections})


@pytest.fixture
def open_pipeline(tmp_path: Path) -> Iterator[Any]:
    opened: list[PubSubPipeline] = []

    def make(settings: Config | None = None, incarnation: int = 0) -> PubSubPipeline:
        settings = settings or config()
        store = TopicStore(tmp_path / "pubsub-1", tmp_path / "registry.db", settings.store)
        pipeline = PubSubPipeline(PIPELINE, incarnation, 1, settings, store, None)
        pipeline.recover()
        opened.append(pipeline)
        return pipeline

    yield make
    for pipeline in opened:
        pipeline.close()


def of_type(out: dict[int, list[Record]], kind: type[T]) -> list[T]:
    return [r for r in out.get(0, []) if isinstance(r, kind)]


def publish(n: int, *, persistent: bool = True, receipt: str = "") -> Send:
    return Send(1, make_message(f"m{n}", TOPIC, persistent=persistent), receipt)


def durable(sub: int = 1, conn: int = 2) -> Subscribe:
    return Subscribe(conn, sub, "d", TOPIC, ACK_CLIENT, 100, durable="app/d")


def turn(pipeline: PubSubPipeline, *records: Record) -> dict[int, list[Record]]:
    for record in records:
        pipeline.receive(0, record)
    pipeline.step(memwatch_level=0)
    return pipeline.take_output()


def test_a_durable_subscriber_gets_its_backlog_through_the_replay_worker(
    open_pipeline: Any,
) -> None:
    pipeline = open_pipeline()
    assert pipeline.take_replay_records() == [ReplayRelease(PIPELINE)]  # a fresh start
    # Subscribe once and leave: the subscription is kept.
    turn(pipeline, durable())
    turn(pipeline, ConnClosed(2))
    assert pipeline.durables.stats() == [DurableRow(name="app/d", topic=TOPIC, state="inactive")]
    pipeline.take_replay_records()
    # Published while it is away: stored for it, receipted once stored.
    out = turn(pipeline, publish(1, receipt="r1"), publish(2))
    assert of_type(out, Receipt) == [Receipt(1, "r1")]
    assert of_type(out, Deliver) == []
    # It comes back: the pipeline asks the replay worker for its backlog...
    turn(pipeline, durable(sub=5, conn=3))
    [request] = pipeline.take_replay_records()
    assert isinstance(request, ReplayRequest) and request.name == "app/d"
    # ...which reads it from the store (here: the test) and sends it back.
    stored = pipeline.durables.store.messages.live()
    batch = ReplayBatch(
        "app/d",
        request.request_id,
        [m.message for m in stored],
        [],
        [max(m.seq for m in stored)] * 10,
        more=False,
    )
    pipeline.replayed(batch)
    out = turn(pipeline)
    assert [d.message.message_id for d in of_type(out, Deliver)] == ["m1", "m2"]
    # Caught up: it is live, and its place in the replay worker is given back.
    assert pipeline.take_replay_records() == [ReplayRelease(PIPELINE, "app/d")]
    out = turn(pipeline, publish(3))
    assert [d.message.message_id for d in of_type(out, Deliver)] == ["m3"]


def test_a_batch_asked_for_by_a_subscriber_since_gone_is_ignored(open_pipeline: Any) -> None:
    pipeline = open_pipeline()
    turn(pipeline, durable())
    [_, request] = pipeline.take_replay_records()
    assert isinstance(request, ReplayRequest)
    pipeline.replayed(ReplayBatch("app/d", request.request_id + 1, [], [], [0] * 10, False))
    assert of_type(turn(pipeline), Deliver) == []
    assert pipeline.durables.stats() == [DurableRow(name="app/d", topic=TOPIC, state="replaying")]


def test_a_slow_subscriber_stops_its_topics_publishers(open_pipeline: Any) -> None:
    pipeline = open_pipeline(config(topics={"live_msg_high": 2, "live_msg_low": 1}))
    turn(pipeline, Subscribe(2, 1, "s", TOPIC, ACK_CLIENT, 1))
    out = turn(pipeline, *[publish(n, persistent=False) for n in range(3)])
    assert of_type(out, FlowState) == [FlowState(PIPELINE, STORE_LIVE, TOPIC, "live_msg_high 2")]
    out = turn(pipeline, Ack(2, 1, "m0"), Ack(2, 1, "m1"))
    assert of_type(out, FlowState) == [FlowState(PIPELINE, STORE_LIVE, TOPIC, "")]


def test_statistics_show_topics_consumers_and_durable_subscriptions(open_pipeline: Any) -> None:
    pipeline = open_pipeline()
    turn(pipeline, durable(), Subscribe(2, 2, "s", TOPIC, ACK_CLIENT, 10))
    stats = pipeline.statistics("pubsub 0", 42, 7)
    assert (stats.title, stats.pid, stats.at_ms) == ("pubsub 0", 42, 7)
    assert [row.name for row in stats.destinations] == [TOPIC]
    # The durable subscription's own queue consumer, the plain subscriber, and (while the
    # durable one replays) its parked subscription keeping non-persistent messages.
    assert sorted((c.gateway, c.subscription) for c in stats.consumers) == [
        (-1, "app/d"),
        (0, "d"),
        (0, "s"),
    ]
    assert stats.durable_subscriptions == [DurableRow(name="app/d", topic=TOPIC, state="replaying")]
    assert stats.temp_store is None


def selective(selector: str, conn: int) -> Subscribe:
    return Subscribe(conn, 1, "d", TOPIC, ACK_CLIENT, 100, durable="app/d", selector=selector)


def test_a_durable_subscription_stores_only_what_its_selector_selects(open_pipeline: Any) -> None:
    pipeline = open_pipeline()
    turn(pipeline, selective("k = 'a'", 2), ConnClosed(2))
    for n, k in enumerate("abab"):
        message = make_message(f"m{n}", TOPIC, persistent=True, headers={"k": k})
        turn(pipeline, Send(1, message, f"r{n}"))
    store = pipeline.durables.store
    assert store.backlog("app/d") == 2
    assert store.selectors() == {"app/d": "k = 'a'"}


def test_a_publish_buffered_before_a_selector_change_is_not_kept_for_the_new_one(
    open_pipeline: Any,
) -> None:
    # Found in review: the publish was picked for the old subscription while it waited
    # for the group commit; the new one (same name, another selector) must not inherit it.
    pipeline = open_pipeline()
    turn(pipeline, selective("k = 'a'", 2), ConnClosed(2))
    message = make_message("m1", TOPIC, persistent=True, headers={"k": "a"})
    # In one batch: the commit comes after both.
    out = turn(pipeline, Send(1, message, "r"), selective("k = 'b'", 3))
    assert Receipt(1, "r") in out[0]
    store = pipeline.durables.store
    assert store.selectors() == {"app/d": "k = 'b'"}
    assert store.backlog("app/d") == 0


def test_after_a_clean_stop_a_durable_backlog_is_not_flagged_redelivered(
    open_pipeline: Any,
) -> None:
    first = open_pipeline()
    turn(first, durable(), ConnClosed(2))
    turn(first, publish(1), publish(2))
    first.close(clean=True)
    again = open_pipeline(incarnation=1)
    again.take_replay_records()
    turn(again, durable(sub=5, conn=3))
    [request] = again.take_replay_records()
    assert isinstance(request, ReplayRequest) and request.redeliver_below == 0
    crashed = open_pipeline(incarnation=2)  # no mark now: everything stored is flagged
    crashed.take_replay_records()
    assert crashed.durables.redeliver_below > 2


def test_a_durable_ack_the_store_cannot_record_gets_an_error_and_the_message_comes_back(
    open_pipeline: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = open_pipeline()
    turn(pipeline, durable())  # new and empty: live at once
    pipeline.replayed(ReplayBatch("app/d", 1, [], [], [0] * 10, False))
    turn(pipeline)
    out = turn(pipeline, publish(1))
    [delivery] = of_type(out, Deliver)
    store = pipeline.durables.store

    def failing_ack(*args: object) -> None:
        raise StoreError(store.registry_path, "ack", "database or disk is full (SQLITE_FULL)")

    monkeypatch.setattr(store, "ack", failing_ack)
    out = turn(pipeline, Ack(2, 1, delivery.message.message_id, receipt="a1"))
    [refusal] = of_type(out, Refuse)
    assert refusal.receipt == "a1"
    assert (
        refusal.message
        == "ACK not stored: store error: ack: database or disk is full (SQLITE_FULL)"
    )
    assert of_type(out, Receipt) == []
    # Still owed in the store, and given again (redelivered) in the meantime.
    assert store.backlog("app/d") == 1
    [again] = of_type(out, Deliver)
    assert (again.message.message_id, again.message.redelivered) == ("m1", True)


def test_a_durable_subscription_belongs_to_the_user_who_made_it(open_pipeline: Any) -> None:
    """Another user reusing the client-id and name is refused (it would read, or by
    replacing it delete, the owner's backlog); the owner comes back to it, also after a
    restart."""
    pipeline = open_pipeline()
    alice = msgspec.structs.replace(durable(conn=2), user="alice", receipt="s")
    assert of_type(turn(pipeline, alice), Receipt) == [Receipt(2, "s")]
    turn(pipeline, ConnClosed(2))
    turn(pipeline, publish(1))
    for mallory in (
        msgspec.structs.replace(durable(conn=3), user="mallory", receipt="m"),
        # The same name on another topic would replace it: refused the same.
        msgspec.structs.replace(durable(conn=3), user="mallory", destination="/topic/other"),
    ):
        [refuse] = of_type(turn(pipeline, mallory), Refuse)
        assert refuse.message == (
            "access denied: user mallory may not use durable subscription 'app/d'"
        )
        assert refuse.receipt == mallory.receipt
    pipeline.close()
    again = open_pipeline()
    back = msgspec.structs.replace(durable(conn=4), user="alice", receipt="b")
    assert of_type(turn(again, back), Receipt) == [Receipt(4, "b")]
    assert [r.name for r in again.durables.stats()] == ["app/d"]


def test_a_durable_subscription_made_before_users_is_claimed_by_the_first(
    open_pipeline: Any,
) -> None:
    pipeline = open_pipeline()
    turn(pipeline, durable(conn=2), ConnClosed(2))  # no user: belongs to nobody
    turn(pipeline, msgspec.structs.replace(durable(conn=3), user="bob"), ConnClosed(3))
    [refuse] = of_type(
        turn(pipeline, msgspec.structs.replace(durable(conn=4), user="carol")), Refuse
    )
    assert "user carol may not use durable subscription 'app/d'" in refuse.message


# -- a gateway killed while its connection held a durable subscription -------------------


def test_a_durable_subscription_held_on_a_dead_gateway_is_taken_over_at_once(
    tmp_path: Path,
) -> None:
    """After a kill -9 of a gateway, its successor's Hello takes a second or so to come;
    the subscriber reconnecting through another gateway meanwhile gets its subscription
    (and its backlog), not `already active`."""
    settings = config()
    store = TopicStore(tmp_path / "pubsub-1", tmp_path / "registry.db", settings.store)
    pipeline = PubSubPipeline(PIPELINE, 0, 2, settings, store, None)
    pipeline.recover()
    dead: set[tuple[int, int]] = set()
    asked: list[tuple[int, int]] = []

    def gone(gateway: int, incarnation: int) -> bool:
        asked.append((gateway, incarnation))
        return (gateway, incarnation) in dead

    pipeline.durables.gateway_gone = gone

    def turn_on(gateway: int, *records: Record) -> dict[int, list[Record]]:
        for record in records:
            pipeline.receive(gateway, record)
        pipeline.step(memwatch_level=0)
        return pipeline.take_output()

    def replay_all() -> None:
        [*_, request] = pipeline.take_replay_records()
        assert isinstance(request, ReplayRequest)
        stored = pipeline.durables.store.messages.live()
        upto = [max([m.seq for m in stored], default=0)] * 10
        batch = [m.message for m in stored]
        pipeline.replayed(ReplayBatch("app/d", request.request_id, batch, [], upto, more=False))

    holder = (3 << CONN_INCARNATION_SHIFT) + 1  # a connection of gateway 0's incarnation 3
    turn_on(0, durable(conn=holder), Subscribe(holder, 2, "s", TOPIC, ACK_CLIENT, 10))
    replay_all()
    out = turn_on(1, publish(1), publish(2))
    assert [d.message.message_id for d in out[0] if isinstance(d, Deliver)] == ["m1", "m2"] * 2
    # The holder's gateway runs: another gateway's subscriber is refused, as ever.
    out = turn_on(1, durable(conn=5))
    [refused] = [r for r in out[1] if isinstance(r, Refuse)]
    assert refused.message == "durable subscription 'app/d' is already active"
    assert asked == [(0, 3)]
    # Gateway 0 is killed: the subscriber comes back through gateway 1 at once.
    dead.add((0, 3))
    out = turn_on(1, Subscribe(6, 1, "d", TOPIC, ACK_CLIENT, 100, durable="app/d", receipt="r"))
    assert of_type({0: out[1]}, Refuse) == []
    assert of_type({0: out[1]}, Receipt) == [Receipt(6, "r")]
    replay_all()
    out = turn_on(1)
    delivered = [d for d in out[1] if isinstance(d, Deliver)]
    assert [d.message.message_id for d in delivered] == ["m1", "m2"]
    assert all(d.message.redelivered for d in delivered)
    # Every consumer of the dead gateway went with it (its plain subscriber too).
    assert {key[0] for key in pipeline.topics.consumers} == set()
    assert {key[0] for key in pipeline.queue_engine.consumers} == {1}
    # Its successor's Hello, when it comes, takes nothing from the new subscriber.
    turn_on(0, Hello(0, 4))
    out = turn_on(1, publish(3))
    assert [d.message.message_id for d in out[1] if isinstance(d, Deliver)] == ["m3"]
    [row] = pipeline.durables.stats()
    assert (row.state, row.unacknowledged) == ("live", 3)
    # A subscriber of the same gateway is never asked about: that gateway is alive.
    asked.clear()
    out = turn_on(1, durable(conn=7))
    assert [r.message for r in out[1] if isinstance(r, Refuse)] == [
        "durable subscription 'app/d' is already active"
    ]
    assert asked == []
    pipeline.close()
