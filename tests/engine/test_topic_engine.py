"""TopicEngine: every subscriber gets every message, in order, with a bounded backlog."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mpbroker.config import TopicSettings
from mpbroker.engine import Outbox, TopicEngine
from mpbroker.flow import ExpiryPolicy, FlowChange
from mpbroker.records import (
    ACK_AUTO,
    ACK_CLIENT,
    ACK_INDIVIDUAL,
    Ack,
    Barrier,
    BarrierDone,
    ConnClosed,
    Credit,
    Deliver,
    Hello,
    Nack,
    PipelineHello,
    Receipt,
    Record,
    Refuse,
    Send,
    Subscribe,
    Unsubscribe,
    decode_page,
    message_size,
)
from tests.engine._helpers import (
    FakePager,
    delivered_messages,
    deliveries,
    make_message,
    of_type,
    send,
)

T = "/topic/t"
PIPELINE = 5


def make_engine(*, pager: FakePager | None = None, **changes: Any) -> TopicEngine:
    return TopicEngine(TopicSettings(**changes), PIPELINE, Outbox(), pager=pager)


def flow_changes(engine: TopicEngine) -> list[FlowChange]:
    """The stop changes since the last call (the engine's effects, taken)."""
    return engine.take_effects().flow_changes


def subscribe(
    conn: int,
    sub: int,
    *,
    ack_mode: int = ACK_AUTO,
    prefetch: int = 100,
    destination: str = T,
    receipt: str = "",
) -> Subscribe:
    return Subscribe(conn, sub, f"id-{sub}", destination, ack_mode, prefetch, receipt)


def publish(engine: TopicEngine, ids: list[str], *, gateway: int = 9, destination: str = T) -> None:
    for message_id in ids:
        engine.handle(gateway, send(1, message_id, destination))


def ids_for(out: dict[int, list[Record]], gateway: int, conn: int, sub: int) -> list[str]:
    return [mid for g, c, s, mid in deliveries(out) if (g, c, s) == (gateway, conn, sub)]


# -- fan-out ---------------------------------------------------------------------------------


def test_every_subscriber_gets_every_message_in_order() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1))
    engine.handle(0, subscribe(2, 1))
    engine.handle(1, subscribe(1, 1))
    publish(engine, ["m1", "m2", "m3"])
    out = engine.outbox.take()
    for key in [(0, 1, 1), (0, 2, 1), (1, 1, 1)]:
        assert ids_for(out, *key) == ["m1", "m2", "m3"]
    assert engine.received == 3
    assert engine.delivered == 9


def test_one_deliver_record_per_gateway_carries_all_its_targets() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1))
    engine.handle(0, subscribe(2, 4))
    engine.handle(1, subscribe(1, 1))
    engine.handle(9, send(3, "m1", T, receipt="r"))
    out = engine.outbox.take()
    assert out[0] == [Deliver([(1, 1), (2, 4)], make_message("m1", T))]
    assert out[1] == [Deliver([(1, 1)], make_message("m1", T))]
    assert out[9] == [Receipt(3, "r")]


def test_a_message_published_to_no_one_is_accepted_and_receipted() -> None:
    engine = make_engine()
    engine.handle(0, send(1, "m1", T, receipt="r"))
    assert engine.outbox.take() == {0: [Receipt(1, "r")]}
    assert engine.received == 1
    assert engine.delivered == 0


def test_subscribers_get_only_messages_published_after_they_subscribed() -> None:
    engine = make_engine()
    publish(engine, ["early"])
    engine.handle(0, subscribe(1, 1))
    publish(engine, ["late"])
    assert [mid for *_, mid in deliveries(engine.outbox.take())] == ["late"]


def test_topics_are_independent() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, destination="/topic/a"))
    publish(engine, ["b1"], destination="/topic/b")
    assert deliveries(engine.outbox.take()) == []


def test_subscribe_repeated_for_the_same_handle_keeps_one_subscriber() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1))
    engine.handle(0, subscribe(1, 1, receipt="again"))
    publish(engine, ["m1"])
    out = engine.outbox.take()
    assert Receipt(1, "again") in out[0]
    assert deliveries(out) == [(0, 1, 1, "m1")]


# -- windows and backlog ---------------------------------------------------------------------


def test_a_full_window_keeps_later_messages_in_the_subscribers_backlog() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, prefetch=2))
    engine.handle(0, subscribe(2, 1, prefetch=10))
    publish(engine, ["m1", "m2", "m3", "m4"])
    out = engine.outbox.take()
    assert ids_for(out, 0, 1, 1) == ["m1", "m2"]
    assert ids_for(out, 0, 2, 1) == ["m1", "m2", "m3", "m4"]


def test_credit_drains_the_backlog_in_order() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, prefetch=1))
    publish(engine, ["m1", "m2", "m3"])
    engine.outbox.take()

    engine.handle(0, Credit(1, [(1, 1)]))
    assert ids_for(engine.outbox.take(), 0, 1, 1) == ["m2"]
    engine.handle(0, Credit(1, [(1, 5)]))
    assert ids_for(engine.outbox.take(), 0, 1, 1) == ["m3"]


def test_new_messages_queue_behind_the_backlog_even_when_the_window_has_room() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, prefetch=2))
    publish(engine, ["m1", "m2", "m3", "m4"])
    engine.handle(0, Credit(1, [(1, 1)]))  # window room for one: m3 goes, m4 still waits
    # In the same batch, before the backlog is drained (when the batch's output is
    # taken): behind the backlog, although the window has room.
    publish(engine, ["m5"])
    first = ids_for(engine.outbox.take(), 0, 1, 1)
    engine.handle(0, Credit(1, [(1, 2)]))
    assert first + ids_for(engine.outbox.take(), 0, 1, 1) == ["m1", "m2", "m3", "m4", "m5"]


def test_client_mode_ack_frees_the_window_cumulatively() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_CLIENT, prefetch=2))
    publish(engine, ["m1", "m2", "m3", "m4"])
    engine.outbox.take()
    engine.handle(0, Ack(1, 1, "m2", receipt="r"))
    out = engine.outbox.take()
    assert ids_for(out, 0, 1, 1) == ["m3", "m4"]
    assert Receipt(1, "r") in out[0]


def test_client_individual_ack_frees_one_slot() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_INDIVIDUAL, prefetch=2))
    publish(engine, ["m1", "m2", "m3", "m4"])
    engine.outbox.take()
    engine.handle(0, Ack(1, 1, "m2"))
    assert ids_for(engine.outbox.take(), 0, 1, 1) == ["m3"]


def test_ack_in_auto_mode_and_credit_in_client_mode_free_nothing() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_AUTO, prefetch=1))
    engine.handle(0, subscribe(1, 2, ack_mode=ACK_CLIENT, prefetch=1))
    publish(engine, ["m1", "m2"])
    engine.outbox.take()
    engine.handle(0, Ack(1, 1, "m1"))
    engine.handle(0, Credit(1, [(2, 1), (77, 1)]))
    engine.handle(0, Ack(1, 2, "unknown"))
    assert engine.outbox.take() == {}


def test_backlog_overflow_refuses_the_publish_naming_the_limit() -> None:
    engine = make_engine(max_pending_messages=2)
    engine.handle(0, subscribe(1, 1, prefetch=1))  # slow subscriber
    engine.handle(0, subscribe(2, 1, prefetch=100))
    publish(engine, ["m1", "m2", "m3"])
    engine.outbox.take()

    engine.handle(4, send(6, "m4", T, receipt="r4"))

    out = engine.outbox.take()
    [(gateway, refuse)] = of_type(out, Refuse)
    assert (gateway, refuse.conn, refuse.receipt) == (4, 6, "r4")
    assert "max_pending_messages 2" in refuse.message
    assert T in refuse.message
    assert "id-1" in refuse.detail
    # Refused as a whole: not even the subscriber with room got it.
    assert deliveries(out) == []
    assert engine.received == 3


def test_backlog_has_room_again_once_drained() -> None:
    engine = make_engine(max_pending_messages=1)
    engine.handle(0, subscribe(1, 1, prefetch=1))
    publish(engine, ["m1", "m2", "m3"])
    assert len(of_type(engine.outbox.take(), Refuse)) == 1
    engine.handle(0, Credit(1, [(1, 1)]))
    publish(engine, ["m4"])
    out = engine.outbox.take()
    assert of_type(out, Refuse) == []
    assert ids_for(out, 0, 1, 1) == ["m2"]


def test_subscribers_given_room_in_one_batch_are_drained_together() -> None:
    engine = make_engine()
    for conn in (1, 2, 3):  # three auto-ack subscribers of one gateway, windows of 2
        engine.handle(0, subscribe(conn, 1, prefetch=2))
    publish(engine, [f"m{n}" for n in range(6)])  # two each in the windows, four waiting
    engine.outbox.take()
    # Written: subscriber 3 the first of its two, the others both (one batch of credits).
    engine.handle(0, Credit(3, [(1, 1)]))
    engine.handle(0, Credit(1, [(1, 2)]))
    engine.handle(0, Credit(2, [(1, 2)]))
    out = engine.outbox.take()
    # One record per message: the subscribers furthest behind went first, and the others'
    # deliveries of the same messages joined their records.
    assert [(r.message.message_id, sorted(r.targets)) for _, r in of_type(out, Deliver)] == [
        ("m2", [(1, 1), (2, 1), (3, 1)]),
        ("m3", [(1, 1), (2, 1)]),
    ]
    assert ids_for(out, 0, 3, 1) == ["m2"]
    engine.handle(0, Credit(3, [(1, 2)]))
    assert ids_for(engine.outbox.take(), 0, 3, 1) == ["m3", "m4"]


def test_a_drain_waiting_for_the_batch_comes_first_when_a_stop_would_arm() -> None:
    # Found in review: the deferred drain let a publish in the same batch arm the live
    # buffer's stop on a backlog that draining at once would have shortened.
    engine = make_engine(live_msg_high=4, live_msg_low=1)
    engine.handle(0, subscribe(1, 1, prefetch=2))
    publish(engine, ["m1", "m2", "m3", "m4", "m5"])  # two in the window, three waiting
    engine.outbox.take()
    assert flow_changes(engine) == []
    engine.handle(0, Credit(1, [(1, 2)]))  # room for two: one left waiting once drained
    publish(engine, ["m6"])  # two waiting, not four: no stop
    assert flow_changes(engine) == []
    assert ids_for(engine.outbox.take(), 0, 1, 1) == ["m3", "m4"]


def test_a_drain_waiting_for_the_batch_comes_first_when_a_backlog_is_full() -> None:
    engine = make_engine(max_pending_messages=1)
    engine.handle(0, subscribe(1, 1, prefetch=1))
    publish(engine, ["m1", "m2"])  # m1 in the window, m2 waits: the backlog is full
    engine.outbox.take()
    engine.handle(0, Credit(1, [(1, 1)]))  # room in the window, m2 not moved yet
    publish(engine, ["m3"])  # taken: the drain that makes room in the backlog went first
    out = engine.outbox.take()
    assert of_type(out, Refuse) == []
    assert ids_for(out, 0, 1, 1) == ["m2"]


# -- redelivery ------------------------------------------------------------------------------


def test_nack_redelivers_to_that_subscriber_before_its_backlog() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_INDIVIDUAL, prefetch=1))
    engine.handle(0, subscribe(2, 1, ack_mode=ACK_INDIVIDUAL, prefetch=1))
    publish(engine, ["m1", "m2"])
    engine.outbox.take()

    engine.handle(0, Nack(1, 1, "m1", receipt="r"))

    out = engine.outbox.take()
    [message] = delivered_messages(out)
    assert ids_for(out, 0, 1, 1) == ["m1"]
    assert message.redelivered
    assert Receipt(1, "r") in out[0]
    engine.handle(0, Ack(1, 1, "m1"))
    [message] = delivered_messages(engine.outbox.take())
    assert (message.message_id, message.redelivered) == ("m2", False)


def test_client_mode_nack_redelivers_every_settled_message_in_order() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_CLIENT, prefetch=3))
    publish(engine, ["m1", "m2", "m3"])
    engine.outbox.take()
    engine.handle(0, Nack(1, 1, "m2"))
    messages = delivered_messages(engine.outbox.take())
    assert [(m.message_id, m.redelivered) for m in messages] == [("m1", True), ("m2", True)]


def test_nack_of_an_unknown_message_changes_nothing() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_CLIENT, prefetch=1))
    publish(engine, ["m1"])
    engine.outbox.take()
    engine.handle(0, Nack(1, 1, "nope"))
    engine.handle(0, Nack(1, 9, "m1"))
    assert engine.outbox.take() == {}


# -- subscribers going away ------------------------------------------------------------------


def test_unsubscribed_subscribers_get_nothing_more() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1))
    engine.handle(0, subscribe(1, 2))
    engine.handle(0, Unsubscribe(1, 1, receipt="r"))
    assert engine.outbox.take() == {0: [Receipt(1, "r")]}
    publish(engine, ["m1"])
    assert deliveries(engine.outbox.take()) == [(0, 1, 2, "m1")]


def test_last_unsubscribe_forgets_the_topic() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1))
    engine.handle(0, Unsubscribe(1, 1))
    engine.handle(0, Unsubscribe(1, 1))  # twice: harmless
    assert engine.topics == {}
    assert engine.consumers == {}


def test_conn_closed_removes_only_that_connections_subscribers() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1))
    engine.handle(0, subscribe(1, 2))
    engine.handle(0, subscribe(2, 1))
    engine.handle(1, subscribe(1, 1))
    engine.handle(0, ConnClosed(1))
    assert engine.outbox.take() == {}
    publish(engine, ["m1"])
    assert deliveries(engine.outbox.take()) == [(0, 2, 1, "m1"), (1, 1, 1, "m1")]


def test_gateway_hello_removes_every_subscriber_of_that_gateway() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_CLIENT, prefetch=1))
    engine.handle(0, subscribe(2, 1))
    engine.handle(1, subscribe(1, 1))
    publish(engine, ["m1", "m2"])
    engine.outbox.take()
    engine.handle(0, Hello(0, 1))
    assert engine.outbox.take() == {}
    publish(engine, ["m3"])
    assert deliveries(engine.outbox.take()) == [(1, 1, 1, "m3")]
    assert set(engine.consumers) == {(1, 1, 1)}


# -- receipts, barriers, unknown records -----------------------------------------------------


def test_subscribe_and_unsubscribe_receipts_answer_on_their_gateway() -> None:
    engine = make_engine()
    engine.handle(3, subscribe(1, 1, receipt="s"))
    engine.handle(3, Unsubscribe(1, 1, receipt="u"))
    assert engine.outbox.take() == {3: [Receipt(1, "s"), Receipt(1, "u")]}


def test_barrier_is_answered_with_barrier_done_naming_the_pipeline() -> None:
    engine = make_engine()
    engine.handle(2, Barrier(4, 11))
    assert engine.outbox.take() == {2: [BarrierDone(4, 11, PIPELINE)]}


@pytest.mark.parametrize(
    "record",
    [PipelineHello(0, 1), Deliver([(1, 1)], make_message("m", T)), Receipt(1, "r")],
    ids=lambda r: type(r).__name__,
)
def test_records_a_pubsub_pipeline_does_not_handle_are_refused(record: Record) -> None:
    with pytest.raises(ValueError, match=type(record).__name__):
        make_engine().handle(0, record)


# -- property --------------------------------------------------------------------------------

Step = tuple[str, int, int]


@settings(max_examples=150, deadline=None)
@given(
    prefetches=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    steps=st.lists(
        st.tuples(st.sampled_from(["publish", "credit"]), st.integers(0, 2), st.integers(0, 4)),
        max_size=40,
    ),
    limit=st.integers(1, 4),
)
def test_each_subscriber_receives_exactly_the_accepted_messages_in_order(
    prefetches: list[int], steps: list[Step], limit: int
) -> None:
    engine = make_engine(max_pending_messages=limit)
    for sub, prefetch in enumerate(prefetches):
        engine.handle(sub % 2, subscribe(1, sub, prefetch=prefetch))
    received: dict[tuple[int, int, int], list[str]] = {}
    in_window = {sub: 0 for sub in range(len(prefetches))}
    accepted: list[str] = []
    for number, (action, which, count) in enumerate(steps):
        if action == "publish":
            engine.handle(7, send(1, f"m{number}", T))
        else:
            sub = which % len(prefetches)
            count = min(count, in_window[sub])  # a gateway credits only what it was sent
            engine.handle(sub % 2, Credit(1, [(sub, count)]))
            in_window[sub] -= count
        out = engine.outbox.take()
        if action == "publish" and not of_type(out, Refuse):
            accepted.append(f"m{number}")
        for gateway, conn, sub, mid in deliveries(out):
            received.setdefault((gateway, conn, sub), []).append(mid)
            in_window[sub] += 1
            assert in_window[sub] <= prefetches[sub]
    # Drain everything, then every subscriber must hold the accepted sequence exactly.
    for sub in range(len(prefetches)):
        while in_window[sub]:
            engine.handle(sub % 2, Credit(1, [(sub, in_window[sub])]))
            in_window[sub] = 0
            for gateway, conn, s, mid in deliveries(engine.outbox.take()):
                received.setdefault((gateway, conn, s), []).append(mid)
                in_window[s] += 1
    for sub in range(len(prefetches)):
        assert received.get((sub % 2, 1, sub), []) == accepted


# -- flow control ----------------------------------------------------------------------------


def test_a_slow_subscriber_arms_its_topics_live_watermark_until_it_catches_up() -> None:
    engine = make_engine(live_msg_high=3, live_msg_low=1)
    engine.handle(9, subscribe(1, 1, ack_mode=ACK_CLIENT, prefetch=1))
    for n in range(4):  # one in the window, three waiting
        engine.handle(9, send(2, f"m{n}", T))
    assert flow_changes(engine) == [FlowChange(T, "live_msg_high 3")]
    assert engine.live_stops() == {T: "live_msg_high 3"}
    engine.handle(9, Ack(1, 1, "m0"))  # two waiting: still over low
    assert flow_changes(engine) == []  # (m1 delivered: the backlog drains when taken)
    engine.handle(9, Ack(1, 1, "m1"))  # one waiting: low
    assert flow_changes(engine) == [FlowChange(T, "")]
    assert engine.live_stops() == {}


def test_backlog_bytes_over_all_topics_arm_the_global_live_byte_watermark() -> None:
    engine = make_engine(global_live_byte_high=30, global_live_byte_low=10)
    engine.handle(9, subscribe(1, 1, ack_mode=ACK_CLIENT, prefetch=1, destination="/topic/a"))
    engine.handle(9, send(2, "a0", "/topic/a", body=bytes(20)))  # in the window
    engine.handle(9, send(2, "a1", "/topic/a", body=bytes(20)))  # waiting: 20 bytes
    assert flow_changes(engine) == [] and engine.live_bytes == 20
    engine.handle(9, send(2, "a2", "/topic/a", body=bytes(20)))  # 40 bytes waiting
    assert flow_changes(engine) == [FlowChange("", "global_live_byte_high 30")]
    assert engine.live_stops() == {"": "global_live_byte_high 30"}
    engine.handle(9, Unsubscribe(1, 1))
    assert flow_changes(engine) == [FlowChange("", "")] and engine.live_bytes == 0


def test_backlogs_over_all_topics_arm_the_global_live_watermark() -> None:
    engine = make_engine(
        live_msg_high=10, live_msg_low=5, global_live_msg_high=3, global_live_msg_low=1
    )
    engine.handle(9, subscribe(1, 1, ack_mode=ACK_CLIENT, prefetch=1, destination="/topic/a"))
    engine.handle(9, subscribe(1, 2, ack_mode=ACK_CLIENT, prefetch=1, destination="/topic/b"))
    for n in range(2):  # one in each window, then one waiting in each backlog
        engine.handle(9, send(2, f"a{n}", "/topic/a"))
        engine.handle(9, send(2, f"b{n}", "/topic/b"))
    assert flow_changes(engine) == []  # 2 waiting
    engine.handle(9, send(2, "a2", "/topic/a"))
    assert flow_changes(engine) == [FlowChange("", "global_live_msg_high 3")]
    assert engine.live_stops() == {"": "global_live_msg_high 3"}
    engine.handle(9, Unsubscribe(1, 1))  # its two waiting messages go with it: 1 left
    assert flow_changes(engine) == [FlowChange("", "")]


# -- flow-to-disk ----------------------------------------------------------------------------


def slow_subscribers(engine: TopicEngine, count: int, topic: str = "/topic/a") -> None:
    for sub in range(1, count + 1):
        engine.handle(9, subscribe(1, sub, ack_mode=ACK_CLIENT, prefetch=1, destination=topic))


def test_while_paging_a_message_left_in_backlogs_is_written_once_and_read_back_by_each() -> None:
    pager = FakePager()
    engine = make_engine(pager=pager)
    slow_subscribers(engine, 2)
    engine.handle(9, send(2, "a0", "/topic/a", body=b"first"))  # into both windows
    engine.paging = True
    engine.handle(9, send(2, "a1", "/topic/a", body=b"second"))  # waits in both backlogs
    assert pager.writes == 1 and engine.paged_messages == 1
    assert engine.paged_bytes == 2 * len(b"second")  # per waiting entry, as live_bytes
    assert engine.live_bytes == 2 * (
        message_size(make_message("a1", "/topic/a", body=b"second")) - 6
    )
    engine.outbox.take()
    engine.handle(9, Ack(1, 1, "a0"))
    engine.handle(9, Ack(1, 2, "a0"))
    got = delivered_messages(engine.outbox.take())
    assert [(m.message_id, m.body, m.temp_key) for m in got] == [("a1", b"second", 0)] * 2
    assert pager.bodies == {} and engine.paged_messages == 0
    assert engine.live_bytes == 0 and engine.paged_bytes == 0


def test_page_out_moves_waiting_bodies_and_a_departing_subscriber_gives_its_share_back() -> None:
    pager = FakePager()
    engine = make_engine(pager=pager)
    slow_subscribers(engine, 2)
    for n in range(4):  # one in each window, three waiting in each backlog
        engine.handle(9, send(2, f"a{n}", "/topic/a", body=b"%d" % n * 10))
    before = engine.live_bytes
    # Sub 1's backlog picks a3 and a2 (newest first); sub 2 pages the same two.
    assert engine.page_out(15) == 40
    assert pager.writes == 2 and engine.live_bytes == before - 40
    assert engine.page_out(1000) == 20 and pager.writes == 3  # a1, the last in memory
    engine.handle(9, Unsubscribe(1, 2))
    assert len(pager.bodies) == 3  # subscriber 1 still waits for all three
    engine.outbox.take()
    got = []
    for n in range(4):
        engine.handle(9, Ack(1, 1, f"a{n}"))
        # What each ACK made room for is delivered when the output is taken (a worker
        # takes it after each batch), before the client can acknowledge it.
        got += delivered_messages(engine.outbox.take())
    assert [m.body for m in got] == [b"%d" % n * 10 for n in range(1, 4)]
    assert pager.bodies == {} and engine.live_bytes == 0 and engine.paged_bytes == 0


def test_page_out_stops_when_the_pager_is_full() -> None:
    engine = make_engine(pager=FakePager(room=1))
    slow_subscribers(engine, 1)
    for n in range(3):
        engine.handle(9, send(2, f"a{n}", "/topic/a", body=b"xxxx"))
    assert engine.page_out(1000) == 4
    assert [bool(m.temp_key) for m in engine.consumers[(9, 1, 1)].pending] == [False, True]


class TopicPagingMachine(RuleBasedStateMachine):
    """Random publishes, acks, departures and paging: every delivered body is the one
    published, and the memory accounting counts exactly the bodies in memory."""

    @initialize()
    def start(self) -> None:
        self.pager = FakePager(room=8)
        self.engine = make_engine(pager=self.pager, max_pending_messages=1000)
        self.bodies: dict[str, bytes] = {}
        self.subs: set[int] = set()
        self.next_id = 0

    @rule(sub=st.integers(1, 3))
    def subscribe(self, sub: int) -> None:
        if sub not in self.subs:
            self.subs.add(sub)
            self.engine.handle(9, subscribe(1, sub, ack_mode=ACK_CLIENT, prefetch=1))

    @rule(sub=st.integers(1, 3))
    def unsubscribe(self, sub: int) -> None:
        if sub in self.subs:
            self.subs.discard(sub)
            self.engine.handle(9, Unsubscribe(1, sub))

    @rule(size=st.integers(0, 30))
    def publish(self, size: int) -> None:
        self.next_id += 1
        mid = f"m{self.next_id}"
        self.bodies[mid] = bytes([self.next_id % 256]) * size
        self.engine.handle(9, send(2, mid, T, body=self.bodies[mid]))

    @rule(sub=st.integers(1, 3))
    def ack_all(self, sub: int) -> None:
        consumer = self.engine.consumers.get((9, 1, sub))
        if consumer is not None and consumer.unacked:
            self.engine.handle(9, Ack(1, sub, list(consumer.unacked)[-1]))

    @rule(on=st.booleans())
    def switch_paging(self, on: bool) -> None:
        self.engine.paging = on

    @rule(max_bytes=st.integers(1, 100))
    def page_out(self, max_bytes: int) -> None:
        self.engine.page_out(max_bytes)

    @invariant()
    def delivered_bodies_are_the_published_ones(self) -> None:
        for message in delivered_messages(self.engine.outbox.take()):
            assert message.body == self.bodies[message.message_id]
            assert message.temp_key == 0

    @invariant()
    def backlogged_lists_exactly_the_subscribers_with_a_backlog(self) -> None:
        engine = self.engine
        expected: dict[str, set[int]] = {}
        for consumer in engine.consumers.values():
            if consumer.pending:
                expected.setdefault(consumer.destination, set()).add(id(consumer))
        assert {t: {id(c) for c in cs} for t, cs in engine.backlogged.items()} == expected

    @invariant()
    def accounting_counts_the_bodies_in_memory(self) -> None:
        engine = self.engine
        entries = [m for c in engine.consumers.values() for m in c.pending]
        assert engine.live_total == len(entries)
        assert engine.live_bytes == sum(message_size(m) for m in entries)
        keys = {m.temp_key for m in entries if m.temp_key}
        assert keys == engine.page_refs.keys() == self.pager.bodies.keys()
        for m in entries:
            if m.temp_key:
                assert decode_page(self.pager.bodies[m.temp_key])[1] == self.bodies[m.message_id]


TopicPagingMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)
)
test_topic_paging_keeps_its_invariants = TopicPagingMachine.TestCase


def test_a_topic_nack_with_requeue_false_drops_the_message_for_that_subscriber() -> None:
    engine = TopicEngine(TopicSettings(), 1, Outbox())
    engine.handle(0, Subscribe(1, 1, "s", "/topic/t", ACK_INDIVIDUAL, 10))
    engine.handle(0, Send(1, make_message("m1", "/topic/t")))
    engine.outbox.take()
    engine.handle(0, Nack(1, 1, "m1", requeue=False))
    assert engine.outbox.take() == {}
    assert engine.consumers[(0, 1, 1)].unacked == {} and engine.live_total == 0


# -- expiry in the live buffer ----------------------------------------------------------------


def expiring(engine: TopicEngine, message_id: str, expires_ms: int, **headers: str) -> None:
    message = make_message(message_id, T, headers=headers)
    message.expires_ms = expires_ms
    engine.handle(9, Send(1, message))


def test_an_expired_backlog_entry_is_dropped_on_its_way_to_a_slow_subscriber() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_INDIVIDUAL, prefetch=1))
    engine.tick(1_000)
    expiring(engine, "m1", 0)
    expiring(engine, "m2", 1_500)  # waits behind m1, expires while it waits
    expiring(engine, "m3", 0)
    assert ids_for(engine.outbox.take(), 0, 1, 1) == ["m1"]
    assert engine.live_total == 2
    engine.tick(2_000)
    engine.handle(0, Ack(1, 1, "m1"))
    assert ids_for(engine.outbox.take(), 0, 1, 1) == ["m3"]
    assert (engine.live_total, engine.live_bytes, engine.expired) == (0, 0, 1)
    assert engine.backlogged == {}


def test_a_message_expired_before_it_reaches_anyone_is_not_delivered() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1))
    engine.tick(5_000)
    expiring(engine, "late", 4_000)
    assert deliveries(engine.outbox.take()) == []
    assert engine.expired == 1


def test_the_expiry_scan_empties_expired_entries_from_every_backlog_and_logs_them() -> None:
    policy = ExpiryPolicy("log", ("%properties%",), "")
    pager = FakePager()
    engine = TopicEngine(
        TopicSettings(), PIPELINE, Outbox(), pager=pager, expiry_for=lambda topic: policy
    )
    for sub in (1, 2):
        engine.handle(0, subscribe(1, sub, ack_mode=ACK_INDIVIDUAL, prefetch=1))
    expiring(engine, "first", 0)
    engine.paging = True  # the rest wait paged: the log policy reads them back
    expiring(engine, "old", 1_500, color="red")
    expiring(engine, "young", 9_000)
    engine.outbox.take()
    assert engine.live_total == 4 and len(pager.bodies) == 2
    assert engine.expire_scan(2_000) == 2
    assert engine.live_total == 2 and len(pager.bodies) == 1  # old's page is gone
    lines = engine.take_effects().expiry_log
    assert len(lines) == 2 and all("color" in line and "red" in line for line in lines)
    engine.tick(2_000)
    engine.handle(0, Ack(1, 1, "first"))
    assert ids_for(engine.outbox.take(), 0, 1, 1) == ["young"]


# -- parked durable subscriptions (their subscriber is away) ---------------------------------

PARKED = (-1, 0, 1)


def kept(message_id: str, after: int, *, persistent: bool = False, expires_ms: int = 0) -> Send:
    record = send(1, message_id, T)
    record.message.kept_after = after
    record.message.persistent = persistent
    record.message.expires_ms = expires_ms
    return record


def test_a_parked_subscription_keeps_non_persistent_messages_only_and_is_never_delivered() -> None:
    engine = make_engine()
    engine.park(PARKED, "sub", T, None)
    engine.handle(0, subscribe(1, 1))
    for record in (kept("n1", 0), kept("p1", 0, persistent=True), kept("n2", 1)):
        engine.handle(9, record)
    # The live subscriber got all three; nothing was addressed to the parked one.
    assert [d for d in deliveries(engine.outbox.take()) if d[0] != 9] == [
        (0, 1, 1, "n1"),
        (0, 1, 1, "p1"),
        (0, 1, 1, "n2"),
    ]
    assert len(engine.consumers[PARKED].pending) == engine.live_total == 2
    # Taken in order, up to the persistent message stored after them.
    assert [m.message_id for m in engine.take_parked(PARKED, 1)] == ["n1"]
    assert [m.message_id for m in engine.unpark(PARKED)] == ["n2"]
    assert PARKED not in engine.consumers
    assert engine.live_total == 0 and engine.live_bytes == 0


def test_a_parked_backlog_counts_in_the_watermarks_and_expires() -> None:
    engine = make_engine(live_msg_high=2, live_msg_low=1, max_pending_messages=3)
    engine.park(PARKED, "sub", T, None, [make_message("w0", T)])
    engine.tick(1_000)
    engine.handle(9, kept("n1", 0, expires_ms=2_000))
    assert flow_changes(engine) == [FlowChange(T, "live_msg_high 2")]
    engine.tick(3_000)
    assert [m.message_id for m in engine.unpark(PARKED)] == ["w0"]  # n1 expired meanwhile
    assert engine.expired == 1
    assert flow_changes(engine) == [FlowChange(T, "")]


def test_a_parked_backlog_is_paged_and_read_back_whole() -> None:
    pager = FakePager()
    engine = make_engine(pager=pager)
    engine.park(PARKED, "sub", T, None)
    engine.paging = True
    engine.handle(9, kept("n1", 0))
    [stub] = engine.consumers[PARKED].pending
    assert stub.temp_key and stub.body == b""
    [whole] = engine.unpark(PARKED)
    assert (whole.message_id, whole.body, whole.temp_key) == ("n1", b"body", 0)
    assert not pager.bodies
