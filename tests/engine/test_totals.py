"""Per-destination totals (the admin API's and /metrics' counters): what the engines count
for each event, and that totals outlive an idle queue but stay bounded."""

from __future__ import annotations

from mpbroker.config import TopicSettings
from mpbroker.engine import (
    DEQUEUED,
    ENQUEUED,
    EXPIRED,
    STOPS,
    DestinationTotals,
    Outbox,
    TopicEngine,
)
from mpbroker.flow import FlowTracker, StoreLimits, Watermark
from mpbroker.records import (
    ACK_AUTO,
    ACK_CLIENT,
    Ack,
    Credit,
    Nack,
    Send,
    Subscribe,
    Unsubscribe,
)
from tests.engine._helpers import make_message, send
from tests.engine.test_queue_engine import Q, make_engine, send_all, subscribe


def test_totals_count_by_destination_and_kind() -> None:
    totals = DestinationTotals()
    totals.add("/queue/a", ENQUEUED)
    totals.add("/queue/a", ENQUEUED, 2)
    totals.add("/queue/a", DEQUEUED)
    totals.add("/queue/b", EXPIRED)
    assert totals.of("/queue/a") == (3, 1, 0, 0, 0)
    assert totals.of("/queue/b") == (0, 0, 1, 0, 0)
    assert totals.of("/queue/none") == (0, 0, 0, 0, 0)


def test_past_the_cap_only_gone_destinations_are_forgotten() -> None:
    totals = DestinationTotals(cap=2)
    for name in ("/queue/a", "/queue/b", ""):
        totals.add(name, STOPS)
    totals.prune({"/queue/a", "/queue/b"})  # 3 > 2: /queue/... kept as they exist, "" always
    assert set(totals.counts) == {"/queue/a", "/queue/b", ""}
    totals.prune({"/queue/b"})
    assert set(totals.counts) == {"/queue/b", ""}
    totals.prune(set())  # at the cap: nothing is forgotten
    assert set(totals.counts) == {"/queue/b", ""}


def test_a_queue_counts_sends_acks_expiry_and_dead_letters() -> None:
    engine = make_engine(max_redeliveries=0)
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_CLIENT, prefetch=10))
    send_all(engine, ["m1", "m2", "m3"])
    engine.handle(0, Ack(1, 1, "m2"))  # client mode: cumulative, so m1 and m2
    engine.handle(0, Nack(1, 1, "m3"))  # max_redeliveries 0: to the dead-letter queue
    assert engine.totals.of(Q)[:4] == (3, 2, 0, 1)
    dead_letters = f"/queue/DLQ.{Q[len('/queue/') :]}"
    assert engine.totals.of(dead_letters)[ENQUEUED] == 1
    # Expiry, in a queue nobody consumes.
    engine.handle(0, Send(1, make_message("late", "/queue/x", expires_ms=5), ""))
    assert engine.expire_scan(10) == 1
    assert engine.totals.of("/queue/x")[EXPIRED] == 1
    assert "/queue/x" not in engine.queues  # forgotten while idle, its totals are not
    send_all(engine, ["again"], destination="/queue/x")
    assert engine.totals.of("/queue/x")[:3] == (2, 0, 1)


def test_an_auto_mode_delivery_is_dequeued_once_written() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_AUTO, prefetch=10))
    send_all(engine, ["m1", "m2"])
    assert engine.totals.of(Q)[DEQUEUED] == 0
    engine.handle(0, Credit(1, [(1, 2)]))
    assert engine.totals.of(Q)[DEQUEUED] == 2


def test_a_topic_counts_publishes_acks_and_live_buffer_stops() -> None:
    engine = TopicEngine(TopicSettings(live_msg_high=2, live_msg_low=1), 0, Outbox())
    engine.handle(0, Subscribe(1, 1, "s", "/topic/t", ACK_CLIENT, 1, ""))
    for n in range(4):
        engine.handle(0, send(2, f"t{n}", "/topic/t"))
    engine.outbox.take()
    assert engine.totals.of("/topic/t")[ENQUEUED] == 4
    assert engine.totals.of("/topic/t")[STOPS] == 1  # backlog 3 passed live_msg_high 2
    engine.handle(0, Ack(1, 1, "t0"))
    engine.outbox.take()
    assert engine.totals.of("/topic/t")[DEQUEUED] == 1
    engine.handle(0, Unsubscribe(1, 1, ""))


def test_a_flow_tracker_counts_each_stop_once() -> None:
    off = Watermark(-1, -1)
    tracker = FlowTracker(StoreLimits(Watermark(2, 1), off, off, off))
    for _ in range(3):
        tracker.add("/queue/a", 2, 10)  # stopped at 2 (and stays stopped at 4, 6)
    tracker.remove("/queue/a", 6, 30)
    tracker.add("/queue/a", 2, 10)
    assert tracker.stops == {"/queue/a": 2}
    tracker.prune_stops(set(), cap=1)  # 1 destination: at the cap, kept
    assert tracker.stops == {"/queue/a": 2}
    tracker.prune_stops(set(), cap=0)
    assert tracker.stops == {}


def test_nothing_counts_for_a_message_refused_by_a_full_topic_backlog() -> None:
    engine = TopicEngine(
        TopicSettings(max_pending_messages=1, live_msg_high=-1, live_msg_low=-1), 0, Outbox()
    )
    engine.handle(0, Subscribe(1, 1, "s", "/topic/t", ACK_CLIENT, 1, ""))
    engine.handle(0, send(2, "t0", "/topic/t"))  # in the window
    engine.handle(0, send(2, "t1", "/topic/t"))  # in the backlog
    engine.handle(0, send(2, "t2", "/topic/t"))  # refused: the backlog is full
    assert engine.totals.of("/topic/t")[ENQUEUED] == 2
