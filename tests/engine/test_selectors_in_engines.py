"""Selectors in the engines: queue lanes (no head-of-line blocking, backlog scans, paged
messages keep their headers), topic filtering through the index (non-matching subscribers
see nothing, cost nothing), and a stateful model of a queue with selector consumers."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mpbroker.config import QueueSettings, TopicSettings
from mpbroker.engine import ConsumerKey, IndexCache, Outbox, QueueEngine, TopicEngine
from mpbroker.native import compiled_modules
from mpbroker.records import (
    ACK_AUTO,
    ACK_CLIENT,
    ACK_INDIVIDUAL,
    Ack,
    Credit,
    Deliver,
    Message,
    Nack,
    Receipt,
    Refuse,
    Send,
    Subscribe,
    Unsubscribe,
)
from mpbroker.selector import compile_selector
from tests.engine._helpers import FakePager, deliveries, make_message, of_type

Q = "/queue/q"
T = "/topic/t"
GW = 0


def queue_engine(**changes: Any) -> QueueEngine:
    pager = changes.pop("pager", None)
    index_cache = changes.pop("index_cache", None)
    return QueueEngine(QueueSettings(**changes), 1, Outbox(), pager=pager, index_cache=index_cache)


def topic_engine(**changes: Any) -> TopicEngine:
    return TopicEngine(TopicSettings(**changes), 1, Outbox())


def subscribe(
    sub: int,
    selector: str = "",
    *,
    destination: str = Q,
    prefetch: int = 100,
    ack_mode: int = ACK_CLIENT,
    conn: int = 1,
    receipt: str = "",
) -> Subscribe:
    return Subscribe(
        conn, sub, f"s{sub}", destination, ack_mode, prefetch, receipt, selector=selector
    )


def message(mid: str, destination: str = Q, **headers: str) -> Message:
    return make_message(mid, destination, headers=headers)


def publish(engine: QueueEngine | TopicEngine, *messages: Message) -> None:
    for m in messages:
        engine.handle(GW, Send(1, m))


def delivered_to(engine: QueueEngine | TopicEngine) -> dict[int, list[str]]:
    """Message ids delivered per subscription handle since the last call."""
    got: dict[int, list[str]] = {}
    for _, _, sub, mid in deliveries(engine.outbox.take()):
        got.setdefault(sub, []).append(mid)
    return got


# -- queues ---------------------------------------------------------------------------------


def test_a_queue_consumer_gets_only_the_messages_its_selector_selects() -> None:
    engine = queue_engine()
    engine.handle(GW, subscribe(1, "color = 'red'"))
    engine.handle(GW, subscribe(2, "color = 'blue'"))
    engine.outbox.take()
    publish(engine, message("r1", color="red"), message("b1", color="blue"))
    publish(engine, message("g1", color="green"), message("r2", color="red"))
    assert delivered_to(engine) == {1: ["r1", "r2"], 2: ["b1"]}
    # Nobody selects the green one: it waits, in the queue, for someone who does.
    assert [m.message_id for m in engine.queues[Q].pending] == ["g1"]
    engine.handle(GW, subscribe(3, "color = 'green'"))
    assert delivered_to(engine) == {3: ["g1"]}
    assert engine.depth(Q) == 0


def test_a_rare_match_is_served_promptly_behind_a_backlog_nobody_selects() -> None:
    engine = queue_engine(max_messages=100_000)
    engine.handle(GW, subscribe(1, "n = 99", prefetch=1, ack_mode=ACK_INDIVIDUAL))
    engine.outbox.take()
    publish(engine, *(message(f"m{i}", n=str(i % 100)) for i in range(1000)))
    got: list[str] = delivered_to(engine)[1]
    while len(got) < 10:
        engine.handle(GW, Ack(1, 1, got[-1]))
        got += delivered_to(engine).get(1, [])
    assert got == [f"m{i}" for i in range(99, 1000, 100)]
    assert engine.depth(Q) == 990
    assert all(m.headers["n"] != "99" for m in engine.queues[Q].pending)


def test_consumers_with_disjoint_selectors_are_served_in_parallel() -> None:
    engine = queue_engine()
    for sub in range(4):
        engine.handle(GW, subscribe(sub, f"k = '{sub}'", prefetch=2, ack_mode=ACK_INDIVIDUAL))
    engine.outbox.take()
    # A burst for consumer 0 fills its window; the others still get theirs at once.
    publish(engine, *(message(f"a{i}", k="0") for i in range(5)))
    publish(engine, message("b", k="1"), message("c", k="2"), message("d", k="3"))
    assert delivered_to(engine) == {0: ["a0", "a1"], 1: ["b"], 2: ["c"], 3: ["d"]}


def test_a_plain_consumer_and_a_selector_consumer_share_a_queue() -> None:
    engine = queue_engine()
    engine.handle(GW, subscribe(1, "urgent", prefetch=10))
    engine.handle(GW, subscribe(2, prefetch=10))
    engine.outbox.take()
    publish(engine, message("u1", urgent="true"), message("p1"), message("u2", urgent="TRUE"))
    got = delivered_to(engine)
    # Every message goes to exactly one consumer; the selector consumer only gets urgent ones.
    assert sorted(got.get(1, []) + got.get(2, [])) == ["p1", "u1", "u2"]
    assert set(got.get(1, [])) <= {"u1", "u2"}


def test_consumers_with_overlapping_selectors_share_what_they_both_select() -> None:
    # Found in review: the plain lane (or the older lane) took everything while it had room.
    for first, second in (("", "k = 'a'"), ("k = 'a'", ""), ("k IN ('a', 'b')", "k = 'a'")):
        engine = queue_engine()
        engine.handle(GW, subscribe(1, first))
        engine.handle(GW, subscribe(2, second))
        engine.outbox.take()
        publish(engine, *(message(f"m{i}", k="a") for i in range(50)))
        got = delivered_to(engine)
        assert sorted(got) == [1, 2] and len(got[1]) + len(got[2]) == 50, (first, second)
        assert abs(len(got[1]) - len(got[2])) <= 2, (first, second, got)


@pytest.mark.skipif(
    "mpbroker.engine._queue" in compiled_modules(),
    reason="counts calls by replacing a method, which a compiled engine does not look up",
)
def test_a_nack_looks_only_at_the_lanes_that_get_messages_back() -> None:
    engine = queue_engine()
    for sub in range(50):
        engine.handle(GW, subscribe(sub, f"k = '{sub}'", prefetch=1, ack_mode=ACK_INDIVIDUAL))
    engine.outbox.take()
    publish(engine, message("a", k="7"), message("b", k="7"))
    assert delivered_to(engine) == {7: ["a"]}
    drained: list[object] = []
    drain = engine._drain
    engine._drain = lambda queue, lane: (drained.append(lane), drain(queue, lane))[1]  # type: ignore[method-assign]
    engine.handle(GW, Nack(1, 7, "a"))
    assert delivered_to(engine) == {7: ["a"]}
    assert len(drained) == 1  # its own lane, not all 50


def test_a_new_selector_scans_the_backlog_in_order_with_priorities() -> None:
    engine = queue_engine()
    publish(engine, message("x1", x="1"), message("y1", y="1"))
    high = msgspec.structs.replace(message("x2", x="2"), priority=9)
    publish(engine, high, message("x3", x="3"))
    engine.handle(GW, subscribe(1, "x IS NOT NULL"))
    assert delivered_to(engine) == {1: ["x2", "x1", "x3"]}
    assert [m.message_id for m in engine.queues[Q].pending] == ["y1"]


def test_nacked_and_returned_messages_come_back_to_the_lanes_that_select_them() -> None:
    engine = queue_engine()
    engine.handle(GW, subscribe(1, "k = 'a'", prefetch=1, ack_mode=ACK_INDIVIDUAL))
    engine.outbox.take()
    publish(engine, message("a1", k="a"), message("a2", k="a"))
    assert delivered_to(engine) == {1: ["a1"]}
    engine.handle(GW, Nack(1, 1, "a1"))
    assert delivered_to(engine) == {1: ["a1"]}  # back at the head, to the same lane
    engine.handle(GW, Unsubscribe(1, 1))
    engine.handle(GW, subscribe(2, "k = 'a'", prefetch=5))
    assert delivered_to(engine) == {2: ["a1", "a2"]}


def test_the_last_consumer_of_a_selector_leaving_keeps_its_messages_queued() -> None:
    engine = queue_engine()
    engine.handle(GW, subscribe(1, "k = 'a'", prefetch=1))
    engine.outbox.take()
    publish(engine, message("a1", k="a"), message("a2", k="a"))
    engine.handle(GW, Unsubscribe(1, 1))
    queue = engine.queues[Q]
    assert queue.lanes == {} and queue.lanes_of == {}
    assert [m.message_id for m in queue.pending] == ["a1", "a2"]
    assert queue.pending.__len__() == 2


def test_a_paged_message_keeps_its_headers_for_selectors() -> None:
    pager = FakePager()
    engine = queue_engine(pager=pager)
    engine.paging = True
    publish(engine, message("m1", k="a"), message("m2", k="b"))
    assert all(m.temp_key for m in engine.queues[Q].pending)
    assert [m.headers for m in engine.queues[Q].pending] == [{"k": "a"}, {"k": "b"}]
    engine.handle(GW, subscribe(1, "k = 'b'"))
    [delivered] = [r.message for _, r in of_type(engine.outbox.take(), Deliver)]
    assert (delivered.message_id, delivered.body, delivered.temp_key) == ("m2", b"body", 0)
    assert len(pager.bodies) == 1  # m1's page is still there, never read


def test_an_index_only_message_keeps_its_headers_and_is_read_only_when_delivered() -> None:
    loads: list[int] = []
    stored = {
        seq: msgspec.structs.replace(
            message(f"m{seq}", k="a" if seq == 2 else "b"), persistent=True, seq=seq
        )
        for seq in (1, 2)
    }

    def load(seq: int) -> Message:
        loads.append(seq)
        return stored[seq]

    engine = queue_engine(index_cache=IndexCache(load, max_entries=0))
    for seq in (1, 2):
        engine.restore(stored[seq])
    assert all(m.paged and m.headers for m in engine.queues[Q].pending)
    engine.handle(GW, subscribe(1, "k = 'a'"))
    assert delivered_to(engine) == {1: ["m2"]}
    assert loads == [2]


def test_a_selector_the_engine_cannot_compile_is_refused_not_ignored() -> None:
    engine = queue_engine()
    engine.handle(GW, subscribe(1, "color = ", receipt="r"))
    [(_, refuse)] = of_type(engine.outbox.take(), Refuse)
    assert refuse.message.startswith("selector error at column")
    assert refuse.receipt == "r"
    assert engine.consumers == {}


# -- topics ---------------------------------------------------------------------------------


def test_topic_subscribers_get_only_what_their_selectors_select() -> None:
    engine = topic_engine()
    engine.handle(GW, subscribe(1, "ID = 'k1'", destination=T))
    engine.handle(GW, subscribe(2, "ID IN ('k1', 'k2')", destination=T))
    engine.handle(GW, subscribe(3, destination=T))
    engine.handle(GW, subscribe(4, "price > 100.5", destination=T))
    engine.outbox.take()
    publish(engine, message("a", T, ID="k1"), message("b", T, ID="k2", price="120"))
    publish(engine, message("c", T, price="100"))
    assert delivered_to(engine) == {1: ["a"], 2: ["a", "b"], 3: ["a", "b", "c"], 4: ["b"]}


def test_a_subscriber_that_does_not_select_a_message_does_not_count_in_the_live_buffer() -> None:
    engine = topic_engine(max_pending_messages=2)
    engine.handle(GW, subscribe(1, "k = 'slow'", destination=T, prefetch=1))
    engine.handle(GW, subscribe(2, "k = 'fast'", destination=T, prefetch=1000))
    engine.outbox.take()
    publish(engine, message("s1", T, k="slow"), message("s2", T, k="slow"))
    publish(engine, message("s3", T, k="slow"))
    assert engine.live_total == 2  # s2, s3 wait for the slow one
    # The slow subscriber's backlog is full, but these are not for it: they go through.
    publish(engine, *(message(f"f{i}", T, k="fast") for i in range(10)))
    out = engine.outbox.take()
    assert of_type(out, Refuse) == []
    assert [mid for *_, mid in deliveries(out)] == ["s1", *(f"f{i}" for i in range(10))]
    assert engine.live_total == 2
    # One more for it is refused, naming the limit.
    engine.handle(GW, Send(1, message("s4", T, k="slow"), "r"))
    [(_, refuse)] = of_type(engine.outbox.take(), Refuse)
    assert "max_pending_messages" in refuse.message


def test_topic_index_is_dropped_with_its_last_selector_subscriber() -> None:
    engine = topic_engine()
    engine.handle(GW, subscribe(1, "ID = 'x'", destination=T))
    engine.handle(GW, subscribe(2, destination=T))
    assert T in engine.indexes
    engine.handle(GW, Unsubscribe(1, 1))
    assert T not in engine.indexes and T not in engine.plain
    engine.outbox.take()
    publish(engine, message("a", T))
    assert delivered_to(engine) == {2: ["a"]}


def test_many_non_matching_topic_subscribers_are_not_evaluated() -> None:
    engine = topic_engine()
    for sub in range(2000):
        engine.handle(GW, subscribe(sub, f"ID = 'k{sub}'", destination=T))
    engine.outbox.take()
    index = engine.indexes[T]
    m = message("a", T, ID="k7")
    assert index.candidates(m) == [engine.consumers[(GW, 1, 7)]]
    publish(engine, m)
    assert delivered_to(engine) == {7: ["a"]}


# -- a queue with selector consumers, against a model ---------------------------------------

SELECTORS = ["", "k = 'a'", "k = 'b'", "k IN ('a', 'b')", "NOT k = 'a'", "k IS NULL", "n > 1"]
KEYS = st.sampled_from([(GW, c, s) for c in (1, 2) for s in (1, 2, 3)])


class SelectorQueueMachine(RuleBasedStateMachine):
    """Random consumers with selectors, sends, acks, nacks, credits and departures on one
    queue: every delivery is selected by its consumer, every message is in exactly one
    place, and no waiting message is selected by a consumer with room (no head-of-line
    blocking, nothing starved)."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = queue_engine(max_messages=10_000)
        self.selectors: dict[ConsumerKey, str] = {}
        self.modes: dict[ConsumerKey, int] = {}
        self.sent: dict[str, Message] = {}
        self.settled: set[str] = set()
        self.next_id = 0

    def _take(self) -> None:
        out = self.engine.outbox.take()
        for gateway, batch in out.items():
            for record in batch:
                if isinstance(record, Deliver):
                    [(conn, sub)] = record.targets
                    text = self.selectors[(gateway, conn, sub)]
                    if text:
                        assert compile_selector(text).matches(self.sent[record.message.message_id])
                else:
                    assert isinstance(record, Receipt), record

    @rule(
        key=KEYS,
        selector=st.sampled_from(SELECTORS),
        prefetch=st.integers(1, 3),
        mode=st.sampled_from([ACK_AUTO, ACK_CLIENT, ACK_INDIVIDUAL]),
    )
    def subscribe(self, key: ConsumerKey, selector: str, prefetch: int, mode: int) -> None:
        if key in self.selectors:
            return
        self.selectors[key] = selector
        self.modes[key] = mode
        _, conn, sub = key
        self.engine.handle(
            GW, subscribe(sub, selector, prefetch=prefetch, ack_mode=mode, conn=conn)
        )
        self._take()

    @rule(
        k=st.sampled_from([None, "a", "b", "c"]),
        n=st.sampled_from([None, "0", "2", "x"]),
        priority=st.sampled_from([4, 4, 9]),
    )
    def send(self, k: str | None, n: str | None, priority: int) -> None:
        self.next_id += 1
        headers = {name: v for name, v in (("k", k), ("n", n)) if v is not None}
        m = msgspec.structs.replace(message(f"m{self.next_id}", **headers), priority=priority)
        self.sent[m.message_id] = msgspec.structs.replace(m)
        self.engine.handle(GW, Send(1, m))
        self._take()

    @precondition(lambda self: self.selectors)
    @rule(data=st.data(), nack=st.booleans())
    def settle(self, data: st.DataObject, nack: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.selectors)))
        consumer = self.engine.consumers[key]
        if not consumer.unacked:
            return
        mid = data.draw(st.sampled_from(list(consumer.unacked)))
        _, conn, sub = key
        if self.modes[key] == ACK_AUTO:
            self.engine.handle(GW, Credit(conn, [(sub, 1)]))
        else:
            self.engine.handle(GW, (Nack if nack else Ack)(conn, sub, mid))
        self._take()

    @precondition(lambda self: self.selectors)
    @rule(data=st.data())
    def unsubscribe(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.selectors)))
        del self.selectors[key], self.modes[key]
        _, conn, sub = key
        self.engine.handle(GW, Unsubscribe(conn, sub))
        self._take()

    @invariant()
    def every_message_is_in_exactly_one_place(self) -> None:
        queue = self.engine.queues.get(Q)
        waiting = [m.message_id for m in queue.pending] if queue else []
        held = [mid for c in self.engine.consumers.values() for mid in c.unacked]
        assert len(waiting) + len(held) == len(set(waiting) | set(held))
        if queue is not None:
            assert queue.held_messages == len(waiting) + len(held)

    @invariant()
    def lanes_hold_exactly_the_waiting_messages_they_select(self) -> None:
        queue = self.engine.queues.get(Q)
        if queue is None:
            return
        for text, lane in queue.lanes.items():
            selector = compile_selector(text)
            assert list(lane.pending) == [m for m in queue.pending if selector.matches(m)]
        texts = {t for t in self.selectors.values() if t}
        assert set(queue.lanes) == texts

    @invariant()
    def no_waiting_message_is_selected_by_a_consumer_with_room(self) -> None:
        queue = self.engine.queues.get(Q)
        if queue is None:
            return
        for key, consumer in self.engine.consumers.items():
            if not consumer.ready:
                continue
            text = self.selectors[key]
            selector = compile_selector(text) if text else None
            for m in queue.pending:
                assert selector is not None and not selector.matches(m), (key, m.message_id)


SelectorQueueMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
test_a_queue_with_selector_consumers_keeps_its_invariants = SelectorQueueMachine.TestCase
