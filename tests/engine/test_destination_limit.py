"""The engines against broker.max_destinations: a SEND or SUBSCRIBE that would make one
destination more is refused (a Refuse naming the limit, no receipt), what exists keeps
working, and what the broker makes itself (a dead-letter queue) is never refused. Also:
what an idle queue costs (its Pending makes no deque until a message comes)."""

from __future__ import annotations

import sys
from typing import TypeVar

from mpbroker.config import QueueSettings, TopicSettings
from mpbroker.engine import Outbox, QueueEngine, TopicEngine
from mpbroker.engine._pending import Pending
from mpbroker.flow import DestinationLimit
from mpbroker.records import (
    ACK_CLIENT,
    Ack,
    Deliver,
    Nack,
    Receipt,
    Record,
    Refuse,
    Subscribe,
    Unsubscribe,
)
from tests.engine._helpers import make_message, send

GATEWAY = 0
T = TypeVar("T")


def of_type(batch: list[Record], kind: type[T]) -> list[T]:
    return [record for record in batch if isinstance(record, kind)]


def queue_engine(limit: int, **settings: object) -> tuple[QueueEngine, DestinationLimit]:
    engine = QueueEngine(QueueSettings(**settings), 0, Outbox())  # type: ignore[arg-type]
    destinations = DestinationLimit(limit)
    destinations.count_with(lambda: len(engine.queues))
    engine.destination_limit = destinations
    return engine, destinations


def topic_engine(limit: int) -> TopicEngine:
    engine = TopicEngine(TopicSettings(), 1, Outbox())
    destinations = DestinationLimit(limit)
    destinations.count_with(lambda: len(engine.topics))
    engine.destination_limit = destinations
    return engine


def subscribe(conn: int, sub: int, destination: str, receipt: str = "") -> Subscribe:
    return Subscribe(conn, sub, f"s{sub}", destination, ACK_CLIENT, 10, receipt)


def test_a_send_to_one_queue_too_many_is_refused_and_existing_ones_still_take() -> None:
    engine, destinations = queue_engine(2)
    engine.handle(GATEWAY, send(1, "m1", "/queue/a", receipt="r1"))
    engine.handle(GATEWAY, send(1, "m2", "/queue/b", receipt="r2"))
    engine.handle(GATEWAY, send(1, "m3", "/queue/c", receipt="r3"))
    out = engine.outbox.take()[GATEWAY]
    assert of_type(out, Receipt) == [Receipt(1, "r1"), Receipt(1, "r2")]
    [refuse] = of_type(out, Refuse)
    assert refuse.message == "ResourceAllocation: /queue/c broker.max_destinations 2 reached"
    assert refuse.receipt == "r3" and refuse.detail.startswith("The message was not accepted")
    assert set(engine.queues) == {"/queue/a", "/queue/b"} and engine.received == 2
    assert destinations.refused == 1
    # At the limit, the queues that exist take messages and subscribers as before.
    engine.handle(GATEWAY, send(1, "m4", "/queue/a", receipt="r4"))
    engine.handle(GATEWAY, subscribe(2, 1, "/queue/b", receipt="s1"))
    out = engine.outbox.take()[GATEWAY]
    assert of_type(out, Receipt) == [Receipt(1, "r4"), Receipt(2, "s1")]
    assert [d.message.message_id for d in of_type(out, Deliver)] == ["m2"]


def test_a_subscribe_to_one_queue_too_many_is_refused_without_a_receipt() -> None:
    engine, _ = queue_engine(1)
    engine.handle(GATEWAY, subscribe(1, 1, "/queue/a", receipt="s1"))
    engine.handle(GATEWAY, subscribe(1, 2, "/queue/b", receipt="s2"))
    out = engine.outbox.take()[GATEWAY]
    assert of_type(out, Receipt) == [Receipt(1, "s1")]
    [refuse] = of_type(out, Refuse)
    assert (refuse.message, refuse.receipt) == (
        "ResourceAllocation: /queue/b broker.max_destinations 1 reached",
        "s2",
    )
    assert refuse.detail.startswith("Nothing was subscribed")
    assert list(engine.consumers) == [(GATEWAY, 1, 1)]


def test_a_forgotten_queue_makes_room_for_another() -> None:
    engine, _ = queue_engine(1)
    engine.handle(GATEWAY, send(1, "m1", "/queue/a"))
    engine.handle(GATEWAY, subscribe(2, 1, "/queue/a"))
    [deliver] = of_type(engine.outbox.take()[GATEWAY], Deliver)
    engine.handle(GATEWAY, Ack(2, 1, deliver.message.message_id))
    assert "/queue/a" in engine.queues  # its consumer is still there
    engine.handle(GATEWAY, subscribe(2, 2, "/queue/b", receipt="no"))
    assert of_type(engine.outbox.take()[GATEWAY], Refuse)
    engine.handle(GATEWAY, Unsubscribe(2, 1))
    assert "/queue/a" not in engine.queues  # nothing held, nobody consuming: forgotten
    engine.handle(GATEWAY, send(1, "m2", "/queue/b", receipt="yes"))
    assert of_type(engine.outbox.take()[GATEWAY], Receipt) == [Receipt(1, "yes")]


def test_a_dead_letter_queue_is_made_past_the_limit() -> None:
    # The broker's own destinations are never refused: a rejected message is not lost.
    engine, destinations = queue_engine(1)
    engine.handle(GATEWAY, send(1, "m1", "/queue/a"))
    engine.handle(GATEWAY, subscribe(2, 1, "/queue/a"))
    [deliver] = of_type(engine.outbox.take()[GATEWAY], Deliver)
    engine.handle(GATEWAY, Nack(2, 1, deliver.message.message_id, requeue=False))
    assert set(engine.queues) == {"/queue/a", "/queue/DLQ.a"}
    assert destinations.count == 2 and destinations.refused == 0


def test_stored_messages_count_their_new_queue_before_they_are_stored() -> None:
    engine, destinations = queue_engine(2)
    first = send(1, "m1", "/queue/a")
    first.message.persistent = True
    second = send(1, "m2", "/queue/b", receipt="r2")
    second.message.persistent = True
    # Admitted before the group commit: the queues are made once they are stored.
    assert engine.admit(GATEWAY, first)
    assert engine.admit(GATEWAY, send(1, "m3", "/queue/a"))  # the same one: no new place
    assert destinations.reserved == {"/queue/a"}
    assert engine.admit(GATEWAY, second)
    third = send(1, "m4", "/queue/c", receipt="r4")
    assert not engine.admit(GATEWAY, third)
    [refuse] = of_type(engine.outbox.take()[GATEWAY], Refuse)
    assert refuse.receipt == "r4"
    # Stored: their queues are made and no longer reserved.
    first.message.seq, second.message.seq = 1, 2
    engine.handle(GATEWAY, first)
    engine.handle(GATEWAY, second)
    assert destinations.reserved == set() and set(engine.queues) == {"/queue/a", "/queue/b"}


def test_a_subscribe_to_one_topic_too_many_is_refused() -> None:
    engine = topic_engine(1)
    engine.handle(GATEWAY, subscribe(1, 1, "/topic/a", receipt="s1"))
    engine.handle(GATEWAY, subscribe(1, 2, "/topic/a", receipt="s2"))  # exists: fine
    engine.handle(GATEWAY, subscribe(1, 3, "/topic/b", receipt="s3"))
    out = engine.outbox.take()[GATEWAY]
    assert of_type(out, Receipt) == [Receipt(1, "s1"), Receipt(1, "s2")]
    [refuse] = of_type(out, Refuse)
    assert refuse.message == "ResourceAllocation: /topic/b broker.max_destinations 1 reached"
    # Publishing makes no destination: a topic nobody subscribes to is nothing.
    engine.handle(GATEWAY, send(1, "m1", "/topic/c", receipt="p1"))
    assert of_type(engine.outbox.take()[GATEWAY], Receipt) == [Receipt(1, "p1")]


def test_an_engine_without_a_limit_makes_every_destination() -> None:
    engine = QueueEngine(QueueSettings(), 0, Outbox())
    for n in range(50):
        engine.handle(GATEWAY, send(1, f"m{n}", f"/queue/q{n}"))
    assert len(engine.queues) == 50


def test_an_idle_queue_makes_no_deque_until_a_message_comes() -> None:
    # Ten empty deques (one per JMS priority) were most of an idle queue's memory.
    pending = Pending()
    assert sys.getsizeof(pending._levels) < 200
    assert all(level is None for level in pending._levels)
    message = make_message("m1", priority=7)
    pending.append(message)
    assert [level is not None for level in pending._levels].count(True) == 1
    assert list(pending) == [message] and pending.popleft() is message
    assert not pending and not pending.remove(message)
    assert pending.newest(4) is None and list(pending.paging_candidates()) == []
    pending.extendleft([make_message("m2", priority=2), make_message("m3", priority=9)])
    assert [m.message_id for m in pending] == ["m3", "m2"]
    assert [m.message_id for m in pending.remove_where({"m2"})] == ["m2"]
