"""QueueEngine: point-to-point queues driven with gateway records, read through the Outbox."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from mpbroker.config import QueueSettings
from mpbroker.engine import ConsumerKey, IndexCache, Outbox, QueueEngine, no_byte_window
from mpbroker.flow import FlowTracker
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
    Message,
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

Q = "/queue/q"
PIPELINE = 3


def make_engine(
    *,
    pager: FakePager | None = None,
    index_cache: IndexCache | None = None,
    flow_volatile: FlowTracker | None = None,
    window_bytes_for: Callable[[str], int] = no_byte_window,
    **changes: Any,
) -> QueueEngine:
    return QueueEngine(
        QueueSettings(**changes),
        PIPELINE,
        Outbox(),
        pager=pager,
        index_cache=index_cache,
        flow_volatile=flow_volatile,
        window_bytes_for=window_bytes_for,
    )


def subscribe(
    conn: int,
    sub: int,
    *,
    ack_mode: int = ACK_CLIENT,
    prefetch: int = 100,
    destination: str = Q,
    receipt: str = "",
) -> Subscribe:
    return Subscribe(conn, sub, f"id-{sub}", destination, ack_mode, prefetch, receipt)


def send_all(
    engine: QueueEngine, ids: list[str], *, gateway: int = 9, destination: str = Q
) -> None:
    for message_id in ids:
        engine.handle(gateway, send(1, message_id, destination))


# -- distribution ----------------------------------------------------------------------------


def test_messages_wait_in_the_queue_until_a_consumer_subscribes() -> None:
    engine = make_engine()
    send_all(engine, ["m1", "m2"])
    assert engine.depth(Q) == 2
    assert deliveries(engine.outbox.take()) == []

    engine.handle(0, subscribe(1, 1))

    assert deliveries(engine.outbox.take()) == [(0, 1, 1, "m1"), (0, 1, 1, "m2")]
    assert engine.depth(Q) == 0


def test_a_message_sent_to_a_ready_consumer_is_delivered_at_once_to_its_gateway() -> None:
    engine = make_engine()
    engine.handle(2, subscribe(5, 7))
    engine.handle(0, send(1, "m1", body=b"hello"))
    out = engine.outbox.take()
    [(gateway, record)] = of_type(out, Deliver)
    assert gateway == 2
    assert record.targets == [(5, 7)]
    assert record.message == make_message("m1", body=b"hello")
    assert engine.delivered == 1
    assert engine.received == 1


def test_ready_consumers_are_served_round_robin() -> None:
    engine = make_engine()
    for sub in (1, 2, 3):
        engine.handle(0, subscribe(1, sub))
    send_all(engine, [f"m{i}" for i in range(6)])
    subs = [sub for _, _, sub, _ in deliveries(engine.outbox.take())]
    assert subs == [1, 2, 3, 1, 2, 3]


def test_each_message_goes_to_exactly_one_consumer() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1))
    engine.handle(1, subscribe(1, 1))
    send_all(engine, [f"m{i}" for i in range(10)])
    ids = [mid for *_, mid in deliveries(engine.outbox.take())]
    assert sorted(ids) == sorted(f"m{i}" for i in range(10))


def test_a_consumer_gets_no_more_than_its_prefetch_window() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_INDIVIDUAL, prefetch=2))
    send_all(engine, ["m1", "m2", "m3", "m4", "m5"])
    assert [mid for *_, mid in deliveries(engine.outbox.take())] == ["m1", "m2"]
    assert engine.depth(Q) == 3

    engine.handle(0, Ack(1, 1, "m1"))
    assert [mid for *_, mid in deliveries(engine.outbox.take())] == ["m3"]
    assert engine.depth(Q) == 2


def test_round_robin_skips_consumers_whose_window_is_full() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, prefetch=1))
    engine.handle(0, subscribe(1, 2, prefetch=10))
    send_all(engine, ["m1", "m2", "m3", "m4"])
    assert deliveries(engine.outbox.take()) == [
        (0, 1, 1, "m1"),
        (0, 1, 2, "m2"),
        (0, 1, 2, "m3"),
        (0, 1, 2, "m4"),
    ]


def test_messages_are_delivered_in_the_order_sent() -> None:
    engine = make_engine()
    send_all(engine, [f"m{i}" for i in range(20)])
    engine.handle(0, subscribe(1, 1))
    assert [mid for *_, mid in deliveries(engine.outbox.take())] == [f"m{i}" for i in range(20)]


def test_queues_are_independent() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, destination="/queue/a"))
    engine.handle(0, send(1, "b1", "/queue/b"))
    assert deliveries(engine.outbox.take()) == []
    assert engine.depth("/queue/b") == 1
    assert engine.depth("/queue/a") == 0
    assert engine.depth("/queue/never-used") == 0


def test_subscribe_repeated_for_the_same_handle_keeps_the_existing_consumer() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, prefetch=1))
    engine.handle(0, send(1, "m1"))
    engine.handle(0, subscribe(1, 1, prefetch=1, receipt="again"))
    engine.handle(0, send(1, "m2"))
    out = engine.outbox.take()
    assert deliveries(out) == [(0, 1, 1, "m1")]
    assert engine.depth(Q) == 1
    assert Receipt(1, "again") in out[0]


# -- acknowledgement modes -------------------------------------------------------------------


def test_auto_mode_window_is_freed_by_credit_not_by_ack() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_AUTO, prefetch=1))
    send_all(engine, ["m1", "m2"])
    engine.outbox.take()

    engine.handle(0, Ack(1, 1, "m1"))
    assert deliveries(engine.outbox.take()) == []

    engine.handle(0, Credit(1, [(1, 1)]))
    assert deliveries(engine.outbox.take()) == [(0, 1, 1, "m2")]
    assert engine.queues[Q].held_messages == 1
    assert engine.held_bytes == message_size(make_message("m2"))


def test_credit_larger_than_the_window_settles_only_what_was_delivered() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_AUTO, prefetch=2))
    send_all(engine, ["m1", "m2", "m3", "m4", "m5"])
    engine.outbox.take()

    engine.handle(0, Credit(1, [(1, 50)]))

    assert [mid for *_, mid in deliveries(engine.outbox.take())] == ["m3", "m4"]
    assert engine.queues[Q].held_messages == 3
    assert engine.depth(Q) == 1


def test_credit_for_an_unknown_or_client_mode_subscription_changes_nothing() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_CLIENT, prefetch=1))
    send_all(engine, ["m1", "m2"])
    engine.outbox.take()
    engine.handle(0, Credit(1, [(1, 1), (99, 3)]))
    engine.handle(0, Credit(42, [(1, 1)]))
    assert engine.outbox.take() == {}
    assert engine.queues[Q].held_messages == 2


def test_credit_applies_to_each_listed_subscription() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_AUTO, prefetch=1))
    engine.handle(0, subscribe(1, 2, ack_mode=ACK_AUTO, prefetch=1))
    send_all(engine, ["m1", "m2", "m3", "m4"])
    engine.outbox.take()
    engine.handle(0, Credit(1, [(1, 1), (2, 1)]))
    assert sorted(mid for *_, mid in deliveries(engine.outbox.take())) == ["m3", "m4"]


def test_client_mode_ack_is_cumulative() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_CLIENT, prefetch=3))
    send_all(engine, ["m1", "m2", "m3", "m4", "m5"])
    engine.outbox.take()

    engine.handle(0, Ack(1, 1, "m2"))

    assert [mid for *_, mid in deliveries(engine.outbox.take())] == ["m4", "m5"]
    assert engine.queues[Q].held_messages == 3


def test_client_individual_ack_settles_only_that_message() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_INDIVIDUAL, prefetch=3))
    send_all(engine, ["m1", "m2", "m3", "m4"])
    engine.outbox.take()

    engine.handle(0, Ack(1, 1, "m2"))

    assert [mid for *_, mid in deliveries(engine.outbox.take())] == ["m4"]
    # m1, m3 and m4 are still unacknowledged and come back when the consumer leaves.
    engine.handle(0, Unsubscribe(1, 1))
    engine.handle(0, subscribe(1, 2, prefetch=10))
    assert [mid for *_, mid in deliveries(engine.outbox.take())] == ["m1", "m3", "m4"]


@pytest.mark.parametrize("ack_mode", [ACK_CLIENT, ACK_INDIVIDUAL])
def test_ack_of_an_unknown_or_already_acked_id_settles_nothing(ack_mode: int) -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ack_mode, prefetch=1))
    send_all(engine, ["m1", "m2"])
    engine.outbox.take()

    engine.handle(0, Ack(1, 1, "m2"))  # queued, never delivered
    engine.handle(0, Ack(1, 1, "nope"))
    engine.handle(0, Ack(1, 2, "m1"))  # wrong subscription
    engine.handle(1, Ack(1, 1, "m1"))  # wrong gateway
    assert engine.outbox.take() == {}

    engine.handle(0, Ack(1, 1, "m1"))
    engine.handle(0, Ack(1, 1, "m1"))
    assert deliveries(engine.outbox.take()) == [(0, 1, 1, "m2")]
    assert engine.queues[Q].held_messages == 1


def test_settled_messages_leave_the_store_accounting() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_CLIENT))
    engine.handle(0, send(1, "m1", body=b"x" * 10))
    engine.handle(0, send(1, "m2", body=b"y" * 20))
    assert engine.held_bytes == 30
    engine.handle(0, Ack(1, 1, "m1"))
    assert engine.held_bytes == 20
    engine.handle(0, Ack(1, 1, "m2"))
    assert engine.held_bytes == 0
    assert engine.queues[Q].held_messages == 0


# -- redelivery ------------------------------------------------------------------------------


def test_nack_puts_the_message_back_first_marked_redelivered() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_INDIVIDUAL, prefetch=1))
    send_all(engine, ["m1", "m2"])
    engine.outbox.take()

    engine.handle(0, Nack(1, 1, "m1"))

    [message] = delivered_messages(engine.outbox.take())
    assert message.message_id == "m1"
    assert message.redelivered
    assert engine.depth(Q) == 1


def test_nack_with_requeue_false_dead_letters_at_once_and_the_next_message_follows() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_INDIVIDUAL, prefetch=1))
    send_all(engine, ["m1", "m2"])
    engine.outbox.take()
    engine.handle(0, Nack(1, 1, "m1", "r", requeue=False))
    out = engine.outbox.take()
    assert [m.message_id for m in delivered_messages(out)] == ["m2"]
    assert Receipt(1, "r") in out[0]
    [letter] = engine.queues["/queue/DLQ.q"].pending
    assert letter.message_id == "m1"
    assert letter.headers["dead-letter-reason"] == "rejected: NACK with requeue:false"
    assert letter.headers["original-destination"] == Q
    assert engine.queues[Q].held_messages == 1  # m2, in the window
    # On the dead-letter queue itself, requeue:false drops it: there is nowhere further.
    engine.handle(0, subscribe(1, 2, ack_mode=ACK_INDIVIDUAL, destination="/queue/DLQ.q"))
    engine.outbox.take()
    engine.handle(0, Nack(1, 2, "m1", requeue=False))
    assert engine.outbox.take() == {}
    assert engine.depth("/queue/DLQ.q") == 0


def test_client_mode_nack_is_cumulative_and_keeps_the_original_order() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_CLIENT, prefetch=3))
    send_all(engine, ["m1", "m2", "m3", "m4"])
    engine.outbox.take()

    engine.handle(0, Nack(1, 1, "m2"))

    messages = delivered_messages(engine.outbox.take())
    assert [(m.message_id, m.redelivered) for m in messages] == [("m1", True), ("m2", True)]
    assert engine.depth(Q) == 1  # m4 still waits behind the redelivered ones


def test_nack_redelivers_to_another_ready_consumer() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_INDIVIDUAL, prefetch=1))
    engine.handle(0, subscribe(2, 1, ack_mode=ACK_INDIVIDUAL, prefetch=1))
    engine.handle(0, send(1, "m1"))
    engine.outbox.take()
    engine.handle(0, Nack(1, 1, "m1"))
    assert deliveries(engine.outbox.take()) == [(0, 2, 1, "m1")]


def test_nack_in_auto_mode_is_ignored() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_AUTO, prefetch=1))
    engine.handle(0, send(1, "m1"))
    engine.outbox.take()
    engine.handle(0, Nack(1, 1, "m1"))
    assert engine.outbox.take() == {}
    assert engine.depth(Q) == 0


@pytest.mark.parametrize("ack_mode", [ACK_AUTO, ACK_CLIENT, ACK_INDIVIDUAL])
def test_unsubscribe_requeues_unsettled_messages_at_the_head_in_order(ack_mode: int) -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ack_mode, prefetch=3))
    send_all(engine, ["m1", "m2", "m3", "m4", "m5"])
    engine.outbox.take()

    engine.handle(0, Unsubscribe(1, 1, receipt="r"))
    out = engine.outbox.take()
    assert out == {0: [Receipt(1, "r")]}
    assert engine.depth(Q) == 5

    engine.handle(1, subscribe(1, 1, prefetch=10))
    messages = delivered_messages(engine.outbox.take())
    assert [(m.message_id, m.redelivered) for m in messages] == [
        ("m1", True),
        ("m2", True),
        ("m3", True),
        ("m4", False),
        ("m5", False),
    ]


def test_conn_closed_requeues_the_messages_of_every_consumer_of_that_connection() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_AUTO, prefetch=1))
    engine.handle(0, subscribe(1, 2, ack_mode=ACK_CLIENT, prefetch=1))
    send_all(engine, ["m1", "m2"])
    engine.outbox.take()

    engine.handle(0, ConnClosed(1))

    assert engine.outbox.take() == {}
    assert engine.depth(Q) == 2
    assert engine.queues[Q].held_messages == 2
    engine.handle(0, subscribe(2, 1))
    messages = delivered_messages(engine.outbox.take())
    assert sorted((m.message_id, m.redelivered) for m in messages) == [("m1", True), ("m2", True)]


def test_conn_closed_leaves_other_connections_and_gateways_alone() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, prefetch=1))
    engine.handle(0, subscribe(2, 1, prefetch=1))
    engine.handle(1, subscribe(1, 1, prefetch=1))  # same conn id on another gateway
    send_all(engine, ["m1", "m2", "m3"])
    engine.outbox.take()

    engine.handle(0, ConnClosed(1))

    assert engine.depth(Q) == 1
    assert set(engine.consumers) == {(0, 2, 1), (1, 1, 1)}


def test_gateway_hello_requeues_client_mode_and_drops_auto_mode_deliveries() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_CLIENT, prefetch=1, destination="/queue/c"))
    engine.handle(0, subscribe(1, 2, ack_mode=ACK_AUTO, prefetch=1, destination="/queue/a"))
    engine.handle(1, subscribe(1, 1, ack_mode=ACK_CLIENT, prefetch=1, destination="/queue/x"))
    engine.handle(0, send(1, "c1", "/queue/c", body=b"12345"))
    engine.handle(0, send(1, "a1", "/queue/a", body=b"123"))
    engine.handle(0, send(1, "x1", "/queue/x", body=b"1"))
    engine.outbox.take()

    engine.handle(0, Hello(0, 1))

    assert engine.outbox.take() == {}
    assert engine.depth("/queue/c") == 1
    # The auto-mode delivery may already have reached its client: at most once.
    assert engine.depth("/queue/a") == 0
    assert "/queue/a" not in engine.queues
    assert engine.held_bytes == 5 + 1
    assert set(engine.consumers) == {(1, 1, 1)}
    engine.handle(2, subscribe(1, 1, destination="/queue/c"))
    [message] = delivered_messages(engine.outbox.take())
    assert (message.message_id, message.redelivered) == ("c1", True)


def test_removed_consumer_with_nothing_queued_forgets_the_queue() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1))
    engine.handle(0, send(1, "m1"))
    engine.handle(0, Ack(1, 1, "m1"))
    engine.handle(0, Unsubscribe(1, 1))
    assert Q not in engine.queues
    assert engine.consumers == {}


def test_unsubscribe_of_an_unknown_subscription_only_answers_the_receipt() -> None:
    engine = make_engine()
    engine.handle(0, Unsubscribe(1, 1, receipt="r"))
    engine.handle(0, ConnClosed(5))
    engine.handle(0, Hello(0, 2))
    assert engine.outbox.take() == {0: [Receipt(1, "r")]}


# -- limits ----------------------------------------------------------------------------------


def test_max_messages_refuses_a_send_naming_the_limit() -> None:
    engine = make_engine(max_messages=2)
    send_all(engine, ["m1", "m2"], gateway=0)
    engine.outbox.take()

    engine.handle(0, send(4, "m3", receipt="r3"))

    [(gateway, refuse)] = of_type(engine.outbox.take(), Refuse)
    assert gateway == 0
    assert refuse.conn == 4
    assert refuse.receipt == "r3"
    assert "max_messages 2" in refuse.message
    assert Q in refuse.message
    assert refuse.detail
    assert engine.depth(Q) == 2
    assert engine.received == 2


def test_max_messages_counts_delivered_but_unsettled_messages() -> None:
    engine = make_engine(max_messages=2)
    engine.handle(0, subscribe(1, 1))
    send_all(engine, ["m1", "m2", "m3"], gateway=0)
    out = engine.outbox.take()
    assert [mid for *_, mid in deliveries(out)] == ["m1", "m2"]
    assert len(of_type(out, Refuse)) == 1

    engine.handle(0, Ack(1, 1, "m1"))
    engine.handle(0, send(1, "m4", receipt="ok"))
    out = engine.outbox.take()
    assert of_type(out, Refuse) == []
    assert Receipt(1, "ok") in out[0]


def test_max_messages_is_per_queue() -> None:
    engine = make_engine(max_messages=1)
    engine.handle(0, send(1, "a1", "/queue/a"))
    engine.handle(0, send(1, "b1", "/queue/b"))
    assert of_type(engine.outbox.take(), Refuse) == []


def test_max_bytes_is_shared_by_all_queues_of_the_engine() -> None:
    engine = make_engine(max_bytes=10)
    engine.handle(0, send(1, "a1", "/queue/a", body=b"x" * 6))
    engine.handle(0, send(1, "b1", "/queue/b", body=b"x" * 4))
    engine.handle(0, send(1, "b2", "/queue/b", body=b"x"))

    [(_, refuse)] = of_type(engine.outbox.take(), Refuse)
    assert "max_bytes 10" in refuse.message
    assert "/queue/b" in refuse.message
    assert engine.held_bytes == 10


def test_max_bytes_room_returns_once_messages_are_settled() -> None:
    engine = make_engine(max_bytes=10)
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_AUTO))
    engine.handle(0, send(1, "m1", body=b"x" * 10))
    engine.handle(0, send(1, "m2", body=b"x"))
    assert len(of_type(engine.outbox.take(), Refuse)) == 1
    engine.handle(0, Credit(1, [(1, 1)]))
    engine.handle(0, send(1, "m3", body=b"x" * 10))
    assert of_type(engine.outbox.take(), Refuse) == []


def test_message_size_counts_body_and_header_text() -> None:
    message = Message("id", Q, {"ab": "cde", "f": ""}, b"12345", 0)
    assert message_size(message) == 5 + 5 + 1


# -- receipts and barriers -------------------------------------------------------------------


def test_every_record_with_a_receipt_is_answered_on_its_gateway() -> None:
    engine = make_engine()
    engine.handle(1, subscribe(3, 1, prefetch=1, receipt="sub"))
    engine.handle(1, send(3, "m1", receipt="send"))
    engine.handle(1, Nack(3, 1, "m1", receipt="nack"))
    engine.handle(1, Ack(3, 1, "m1", receipt="ack"))
    engine.handle(1, Unsubscribe(3, 1, receipt="unsub"))
    receipts = [r.receipt for _, r in of_type(engine.outbox.take(), Receipt)]
    assert receipts == ["sub", "send", "nack", "ack", "unsub"]


def test_receipt_and_delivery_for_one_gateway_travel_in_one_batch() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1))
    engine.outbox.take()
    engine.handle(0, send(2, "m1", receipt="r"))
    out = engine.outbox.take()
    assert list(out) == [0]
    assert sorted(type(r).__name__ for r in out[0]) == ["Deliver", "Receipt"]


def test_barrier_is_answered_with_barrier_done_naming_the_pipeline() -> None:
    engine = make_engine()
    engine.handle(4, Barrier(8, 77))
    assert engine.outbox.take() == {4: [BarrierDone(8, 77, PIPELINE)]}


@pytest.mark.parametrize(
    "record",
    [PipelineHello(0, 1), Deliver([(1, 1)], make_message("m")), Receipt(1, "r")],
    ids=lambda r: type(r).__name__,
)
def test_records_a_p2p_pipeline_does_not_handle_are_refused(record: Record) -> None:
    engine = make_engine()
    with pytest.raises(ValueError, match=type(record).__name__):
        engine.handle(0, record)


# -- stateful property -----------------------------------------------------------------------

DESTINATIONS = ("/queue/a", "/queue/b")
GATEWAYS = st.integers(0, 1)
CONNS = st.integers(1, 2)
SUBS = st.integers(1, 2)
MAX_MESSAGES = 4
MAX_BYTES = 160


class QueueEngineMachine(RuleBasedStateMachine):
    """Random traffic against a model that knows where every accepted message must be.

    The model mirrors the spec, not the dispatch algorithm: for single-consumer events
    (send, ack, nack, credit, subscribe, unsubscribe) every delivery must come from the head
    of its queue; for events that remove several consumers at once (ConnClosed, Hello) the
    model checks which messages survive and takes the positions the engine chose.
    """

    @initialize()
    def start(self) -> None:
        self.engine = QueueEngine(
            QueueSettings(
                prefetch=3, max_messages=MAX_MESSAGES, max_bytes=MAX_BYTES, max_redeliveries=-1
            ),
            PIPELINE,
            Outbox(),
        )
        self.max_bytes = MAX_BYTES
        self.next_id = 0
        self.messages: dict[str, Message] = {}
        self.pending: dict[str, deque[str]] = {d: deque() for d in DESTINATIONS}
        self.held: dict[ConsumerKey, list[str]] = {}
        self.modes: dict[ConsumerKey, int] = {}
        self.prefetch: dict[ConsumerKey, int] = {}
        self.dest_of: dict[ConsumerKey, str] = {}
        self.redelivered: set[str] = set()
        self.settled: set[str] = set()
        self.dropped: set[str] = set()

    # -- model helpers --------------------------------------------------------------------

    def live(self) -> set[str]:
        return {m for q in self.pending.values() for m in q} | {
            m for held in self.held.values() for m in held
        }

    def queue_count(self, destination: str) -> int:
        return len(self.pending[destination]) + sum(
            len(h) for k, h in self.held.items() if self.dest_of[k] == destination
        )

    def requeue(self, key: ConsumerKey, ids: list[str]) -> None:
        self.pending[self.dest_of[key]].extendleft(reversed(ids))
        self.redelivered.update(ids)

    def forget_consumer(self, key: ConsumerKey) -> None:
        del self.held[key], self.modes[key], self.prefetch[key], self.dest_of[key]

    def handle_strict(self, gateway: int, record: Record) -> dict[int, list[Record]]:
        """Handle a record whose deliveries must all come from the heads of the queues.

        The outbox groups records by gateway, so the global order of deliveries is lost:
        what was delivered from a queue must be a prefix of it, in queue order within
        each gateway's batch.
        """
        self.engine.handle(gateway, record)
        out = self.engine.outbox.take()
        taken: dict[str, list[str]] = {d: [] for d in DESTINATIONS}
        for gw, batch in out.items():
            last: dict[str, int] = {}
            for item in batch:
                if isinstance(item, Deliver):
                    [(conn, sub)] = item.targets
                    key = (gw, conn, sub)
                    mid = item.message.message_id
                    destination = item.message.destination
                    assert key in self.held, f"delivery to unknown consumer {key}"
                    assert self.dest_of[key] == destination
                    waiting = list(self.pending[destination])
                    assert mid in waiting, f"{mid} delivered but not waiting in {waiting}"
                    position = waiting.index(mid)
                    assert position > last.get(destination, -1), "out of queue order"
                    last[destination] = position
                    self.check_delivered_copy(item.message)
                    self.held[key].append(mid)
                    taken[destination].append(mid)
        for destination, mids in taken.items():
            pending = self.pending[destination]
            head = [pending.popleft() for _ in range(len(mids))]
            assert sorted(head) == sorted(mids), f"{mids} is not the head of the queue"
        self.assert_model_matches_engine()
        return out

    def handle_reconciled(
        self, gateway: int, record: Record, removed: list[ConsumerKey], survivors: set[str]
    ) -> None:
        """Handle a record that removes several consumers, then adopt the engine's layout."""
        before = {k: list(h) for k, h in self.held.items() if k not in removed}
        self.engine.handle(gateway, record)
        out = self.engine.outbox.take()
        new_by_key: dict[ConsumerKey, list[str]] = {k: [] for k in before}
        for gw, batch in out.items():
            for item in batch:
                assert isinstance(item, Deliver), item
                [(conn, sub)] = item.targets
                key = (gw, conn, sub)
                self.check_delivered_copy(item.message)
                if key in new_by_key:
                    assert item.message.message_id not in before[key]
                    new_by_key[key].append(item.message.message_id)
                else:
                    assert key in removed, f"delivery to unknown consumer {key}"
        for key in removed:
            self.forget_consumer(key)
        for key, held in before.items():
            now = list(self.engine.consumers[key].unacked)
            assert now == held + new_by_key[key]
            self.held[key] = now
        for destination in DESTINATIONS:
            queue = self.engine.queues.get(destination)
            self.pending[destination] = deque(
                m.message_id for m in (queue.pending if queue else ())
            )
        assert self.live() == survivors
        self.assert_model_matches_engine()

    def check_delivered_copy(self, message: Message) -> None:
        original = self.messages[message.message_id]
        assert message.redelivered == (message.message_id in self.redelivered)
        assert (message.destination, message.headers, message.body) == (
            original.destination,
            original.headers,
            original.body,
        )

    def assert_model_matches_engine(self) -> None:
        engine = self.engine
        assert set(engine.consumers) == set(self.held)
        for key, held in self.held.items():
            assert list(engine.consumers[key].unacked) == held
        for destination in DESTINATIONS:
            queue = engine.queues.get(destination)
            pending = [m.message_id for m in queue.pending] if queue else []
            assert pending == list(self.pending[destination])

    # -- rules ----------------------------------------------------------------------------

    @rule(
        gateway=GATEWAYS,
        conn=CONNS,
        sub=SUBS,
        destination=st.sampled_from(DESTINATIONS),
        ack_mode=st.sampled_from([ACK_AUTO, ACK_CLIENT, ACK_INDIVIDUAL]),
        prefetch=st.integers(1, 3),
    )
    def subscribe(
        self, gateway: int, conn: int, sub: int, destination: str, ack_mode: int, prefetch: int
    ) -> None:
        key = (gateway, conn, sub)
        if key not in self.held:
            self.held[key] = []
            self.modes[key] = ack_mode
            self.prefetch[key] = prefetch
            self.dest_of[key] = destination
        record = Subscribe(conn, sub, f"s{sub}", destination, ack_mode, prefetch, "r")
        out = self.handle_strict(gateway, record)
        assert Receipt(conn, "r") in out[gateway]

    @rule(
        gateway=GATEWAYS,
        conn=CONNS,
        destination=st.sampled_from(DESTINATIONS),
        body=st.integers(0, 60),
        headers=st.dictionaries(st.sampled_from(["k", "type"]), st.text(max_size=3), max_size=2),
    )
    def send(
        self, gateway: int, conn: int, destination: str, body: int, headers: dict[str, str]
    ) -> None:
        self._send(gateway, conn, destination, body, headers)

    @rule(gateway=GATEWAYS, conn=CONNS, destination=st.sampled_from(DESTINATIONS))
    def send_small(self, gateway: int, conn: int, destination: str) -> None:
        self._send(gateway, conn, destination, 1, {})

    def _send(
        self, gateway: int, conn: int, destination: str, body: int, headers: dict[str, str]
    ) -> None:
        self.next_id += 1
        mid = f"m{self.next_id}"
        message = Message(mid, destination, headers, bytes(body), 0)
        size = message_size(message)
        live_bytes = sum(message_size(self.messages[m]) for m in self.live())
        if self.queue_count(destination) >= MAX_MESSAGES:
            refusal = f"max_messages {MAX_MESSAGES}"
        elif live_bytes + size > self.max_bytes:
            refusal = f"max_bytes {self.max_bytes}"
        else:
            refusal = ""
            # A copy: the engine pages bodies out of the messages it holds in place.
            self.messages[mid] = msgspec.structs.replace(message)
            self.pending[destination].append(mid)
        out = self.handle_strict(gateway, Send(conn, message, "r"))
        refusals = of_type(out, Refuse)
        if refusal:
            [(gw, refuse)] = refusals
            assert gw == gateway
            assert refusal in refuse.message
            assert refuse.receipt == "r"
            assert Receipt(conn, "r") not in out.get(gateway, [])
        else:
            assert refusals == []
            assert Receipt(conn, "r") in out[gateway]

    def _pick_key(self, data: st.DataObject, keys: list[ConsumerKey]) -> ConsumerKey:
        """One of `keys`, now and then any handle (records for unknown ones are ignored)."""
        if not keys or data.draw(st.integers(0, 7), label="stray") == 0:
            return data.draw(st.tuples(GATEWAYS, CONNS, SUBS), label="key")
        return data.draw(st.sampled_from(keys), label="key")

    def _settlement(self, data: st.DataObject) -> tuple[ConsumerKey, str]:
        key = self._pick_key(data, sorted(k for k, held in self.held.items() if held))
        held = self.held.get(key, [])
        choices = [*held, *held, "unknown-id", *sorted(self.live())]
        return key, data.draw(st.sampled_from(choices), label="message_id")

    def _settled_by(self, key: ConsumerKey, mid: str) -> list[str]:
        held = self.held.get(key, [])
        if key not in self.held or self.modes[key] == ACK_AUTO or mid not in held:
            return []
        if self.modes[key] == ACK_CLIENT:
            return held[: held.index(mid) + 1]
        return [mid]

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        key, mid = self._settlement(data)
        settled = self._settled_by(key, mid)
        for m in settled:
            self.held[key].remove(m)
        self.settled.update(settled)
        gateway, conn, sub = key
        self.handle_strict(gateway, Ack(conn, sub, mid))

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def nack(self, data: st.DataObject) -> None:
        key, mid = self._settlement(data)
        requeued = self._settled_by(key, mid)
        for m in requeued:
            self.held[key].remove(m)
        if requeued:
            self.requeue(key, requeued)
        gateway, conn, sub = key
        self.handle_strict(gateway, Nack(conn, sub, mid))

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def credit(self, data: st.DataObject) -> None:
        gateway, conn, _ = self._pick_key(data, sorted(k for k, h in self.held.items() if h))
        subs = data.draw(st.lists(SUBS, unique=True, max_size=2), label="subs")
        pairs: list[tuple[int, int]] = []
        for sub in subs:
            key = (gateway, conn, sub)
            held = self.held.get(key, [])
            # A gateway never credits more deliveries than it was sent.
            count = data.draw(st.integers(0, len(held)), label="count")
            pairs.append((sub, count))
            if key in self.held and self.modes[key] == ACK_AUTO:
                self.settled.update(held[:count])
                del held[:count]
        self.handle_strict(gateway, Credit(conn, pairs))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def unsubscribe(self, data: st.DataObject) -> None:
        key = self._pick_key(data, sorted(self.held))
        gateway, conn, sub = key
        if key in self.held:
            self.requeue(key, self.held[key])
            self.forget_consumer(key)
        self.handle_strict(gateway, Unsubscribe(conn, sub))

    @precondition(lambda self: self.held)
    @rule(gateway=GATEWAYS, conn=CONNS)
    def conn_closed(self, gateway: int, conn: int) -> None:
        removed = [k for k in self.held if k[:2] == (gateway, conn)]
        for key in removed:
            self.redelivered.update(self.held[key])
        self.handle_reconciled(gateway, ConnClosed(conn), removed, self.live())

    @precondition(lambda self: self.held)
    @rule(gateway=GATEWAYS)
    def hello(self, gateway: int) -> None:
        removed = [k for k in self.held if k[0] == gateway]
        dropped = {m for k in removed if self.modes[k] == ACK_AUTO for m in self.held[k]}
        for key in removed:
            if self.modes[key] != ACK_AUTO:
                self.redelivered.update(self.held[key])
        self.dropped |= dropped
        self.handle_reconciled(gateway, Hello(gateway, 1), removed, self.live() - dropped)

    @rule(gateway=GATEWAYS, conn=CONNS, token=st.integers(0, 5))
    def barrier(self, gateway: int, conn: int, token: int) -> None:
        self.engine.handle(gateway, Barrier(conn, token))
        assert self.engine.outbox.take() == {gateway: [BarrierDone(conn, token, PIPELINE)]}

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def every_accepted_message_is_in_exactly_one_place_or_settled(self) -> None:
        places: list[str] = []
        for queue in self.engine.queues.values():
            places += [m.message_id for m in queue.pending]
            for consumer in queue.consumers:
                places += list(consumer.unacked)
        assert len(places) == len(set(places)), "a message is in two places"
        assert set(places) == self.live()
        assert set(places).isdisjoint(self.settled | self.dropped)
        assert set(self.messages) == set(places) | self.settled | self.dropped

    @invariant()
    def no_consumer_exceeds_its_prefetch(self) -> None:
        for key, consumer in self.engine.consumers.items():
            assert len(consumer.unacked) <= self.prefetch[key]

    @invariant()
    def held_accounting_matches_the_contents(self) -> None:
        total = 0
        for queue in self.engine.queues.values():
            unacked = [m for c in queue.consumers for m in c.unacked.values()]
            assert queue.held_messages == len(queue.pending) + len(unacked)
            total += sum(message_size(m) for m in [*queue.pending, *unacked])
        assert self.engine.held_bytes == total

    @invariant()
    def redelivered_flags_are_set_only_on_returned_messages(self) -> None:
        for queue in self.engine.queues.values():
            for message in queue.pending:
                assert message.redelivered == (message.message_id in self.redelivered)

    @invariant()
    def no_message_waits_while_a_consumer_of_its_queue_has_room(self) -> None:
        for queue in self.engine.queues.values():
            if queue.pending:
                assert all(not c.ready for c in queue.consumers)


QueueEngineMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    # Health checks judge how fast data is generated, which a busy CI machine can fail;
    # they say nothing about the engine.
    suppress_health_check=list(HealthCheck),
)
test_queue_engine_keeps_its_invariants = QueueEngineMachine.TestCase


class PagingQueueEngineMachine(QueueEngineMachine):
    """The same traffic with flow-to-disk: bodies paged out at random moments (at enqueue
    while paging is on, and by page_out) must come back intact and in order, and the
    memory accounting must count only bodies in memory. (Paged bytes leave memory, so the
    max_bytes refusal is taken out of the model here.)"""

    @initialize()
    def start(self) -> None:
        super().start()
        self.max_bytes = 10**9
        self.pager = FakePager(room=6)
        self.engine = QueueEngine(
            QueueSettings(
                prefetch=3, max_messages=MAX_MESSAGES, max_bytes=self.max_bytes, max_redeliveries=-1
            ),
            PIPELINE,
            Outbox(),
            pager=self.pager,
        )

    @rule(on=st.booleans())
    def switch_paging(self, on: bool) -> None:
        self.engine.paging = on

    @rule(max_bytes=st.integers(1, 200))
    def page_out(self, max_bytes: int) -> None:
        before = self.engine.held_bytes
        paged = self.engine.page_out(max_bytes)
        assert self.engine.held_bytes == before - paged
        self.assert_model_matches_engine()

    @invariant()
    def paged_bodies_are_in_the_pager(self) -> None:
        keys = {m.temp_key: m for q in self.engine.queues.values() for m in q.pending if m.temp_key}
        assert keys.keys() == self.pager.bodies.keys()
        for key, message in keys.items():
            original = self.messages[message.message_id]
            # The body is on disk; the headers stay in memory too, for selectors.
            assert (message.body, message.headers) == (b"", original.headers)
            assert decode_page(self.pager.bodies[key]) == (original.headers, original.body)
        assert self.engine.paged_messages == len(keys)
        # What is on disk: the bodies. (The header text stays in memory, in held_bytes:
        # message_size of a paged message counts it, and the base invariant checks that.)
        assert self.engine.paged_bytes == sum(m.size - message_size(m) for m in keys.values())


PagingQueueEngineMachine.TestCase.settings = QueueEngineMachine.TestCase.settings
test_paging_keeps_the_queue_engine_invariants = PagingQueueEngineMachine.TestCase


def test_gateway_hello_never_drops_a_client_mode_message() -> None:
    # Both consumers go away together: the client-mode message must not be handed to the
    # auto consumer (and then dropped with it) on the way out.
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_CLIENT, prefetch=1))
    engine.handle(0, subscribe(1, 2, ack_mode=ACK_AUTO, prefetch=1))
    engine.handle(9, send(1, "m1"))
    engine.outbox.take()
    engine.handle(0, Hello(0, 1))
    assert engine.depth(Q) == 1
    assert engine.held_bytes == message_size(make_message("m1"))


def test_a_refused_send_leaves_no_queue_behind() -> None:
    engine = make_engine(max_bytes=4)
    engine.handle(0, send(1, "m1", "/queue/new", body=b"12345"))
    assert "/queue/new" not in engine.queues


def test_expired_messages_are_dropped_on_read_and_by_the_scan() -> None:
    engine = make_engine()
    engine.tick(10_000)
    expired = make_message("old")
    expired.expires_ms = 5_000
    engine.handle(9, Send(1, expired))
    later = make_message("later")
    later.expires_ms = 20_000
    engine.handle(9, Send(1, later))
    assert engine.expire_scan(10_000) == 1
    assert engine.depth(Q) == 1
    engine.tick(30_000)  # `later` has expired by the time a consumer comes
    engine.handle(0, subscribe(1, 1))
    assert delivered_messages(engine.outbox.take()) == []
    assert engine.depth(Q) == 0 and engine.held_bytes == 0
    assert engine.expired == 2


def test_a_message_returned_too_often_goes_to_the_dead_letter_queue() -> None:
    engine = make_engine(max_redeliveries=2)
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_INDIVIDUAL))
    engine.handle(9, send(1, "m1"))
    for _ in range(3):  # delivered, then NACKed three times: the third return is one too many
        [message] = delivered_messages(engine.outbox.take())
        engine.handle(0, Nack(1, 1, message.message_id))
    assert engine.depth(Q) == 0
    dead = engine.queues["/queue/DLQ.q"].pending
    [letter] = list(dead)
    assert letter.message_id == "m1" and not letter.redelivered
    assert letter.headers["original-destination"] == Q
    assert letter.headers["dead-letter-reason"] == "max_redeliveries 2 exceeded (3 deliveries)"
    assert letter.size == message_size(letter)  # its own headers counted, not the original's
    # A dead letter that fails again stays in its dead-letter queue.
    engine.handle(0, subscribe(1, 2, ack_mode=ACK_INDIVIDUAL, destination="/queue/DLQ.q"))
    for _ in range(4):
        [message] = delivered_messages(engine.outbox.take())
        engine.handle(0, Nack(1, 2, message.message_id))
    assert engine.depth("/queue/DLQ.q") + len(engine.consumers[(0, 1, 2)].unacked) == 1


def test_a_connection_the_broker_closed_for_a_store_failure_returns_its_messages_uncounted() -> (
    None
):
    engine = make_engine(max_redeliveries=1)
    stored = make_message("s1")
    stored.persistent, stored.seq = True, 7
    engine.handle(9, Send(1, stored))
    for conn in range(1, 6):
        engine.handle(0, subscribe(conn, 1, ack_mode=ACK_INDIVIDUAL))
        [message] = delivered_messages(engine.outbox.take())
        assert message.message_id == "s1" and message.redelivered == (conn > 1)
        # The broker refused an ACK of this connection (its store could not write it):
        # the ERROR ends the connection, and the delivery comes back flagged, uncounted.
        engine.closing_for_broker_failure(0, conn)
        engine.handle(0, ConnClosed(conn))
        assert engine.take_effects().flagged == [(Q, 7)]
    assert engine.depth(Q) == 1 and "/queue/DLQ.q" not in engine.queues
    assert not engine.closed_by_broker
    # A connection that ends by itself counts as ever: the second return is one too many.
    for conn in (10, 11):
        engine.handle(0, subscribe(conn, 1, ack_mode=ACK_INDIVIDUAL))
        assert len(delivered_messages(engine.outbox.take())) == 1
        engine.handle(0, ConnClosed(conn))
    assert engine.depth(Q) == 0
    [(original, letter, outcome)] = engine.take_effects().dead_letters
    assert (original.seq, letter.destination, outcome) == (7, "/queue/DLQ.q", "dead-lettered")


def test_a_move_the_store_could_not_record_leaves_the_message_in_its_queue() -> None:
    engine = make_engine(max_redeliveries=0)
    stored = make_message("s1")
    stored.persistent, stored.seq = True, 7
    engine.handle(9, Send(1, stored))
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_INDIVIDUAL))
    [message] = delivered_messages(engine.outbox.take())
    engine.handle(0, Nack(1, 1, message.message_id))
    [(original, _, _)] = engine.take_effects().dead_letters
    assert engine.depth(Q) == 0 and engine.queues[Q].held_messages == 0
    # The copy could not be stored: the original is back, as it was, and delivered again.
    engine.unmove([original])
    assert engine.queues[Q].held_messages == 1
    [again] = delivered_messages(engine.outbox.take())
    assert (again.message_id, again.seq, again.redelivered, again.deliveries) == ("s1", 7, True, 1)
    assert "/queue/DLQ.q" not in engine.queues


def test_stored_messages_beyond_the_index_cache_wait_paged_and_come_back_whole() -> None:
    stored: dict[int, Message] = {}
    engine = make_engine(index_cache=IndexCache(stored.__getitem__, max_entries=2))
    for n in range(1, 6):
        message = make_message(f"m{n}", body=b"body%d" % n, headers={"k": str(n)})
        message.persistent, message.seq = True, n
        stored[n] = message
        engine.handle(9, Send(1, message))
    waiting = list(engine.queues[Q].pending)
    assert [m.paged for m in waiting] == [False, False, True, True, True]
    # Only the body stays in the store: selectors read the headers.
    assert all(m.body == b"" and m.headers == {"k": m.message_id[1:]} for m in waiting if m.paged)
    assert engine.cached == 2 and engine.held_bytes == 0  # persistent: not VolQueue memory
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_INDIVIDUAL, prefetch=10))
    got = delivered_messages(engine.outbox.take())
    assert [(m.body, m.headers, m.paged) for m in got] == [
        (b"body%d" % n, {"k": str(n)}, False) for n in range(1, 6)
    ]
    assert engine.cached == 0
    engine.handle(0, Nack(1, 1, "m5"))  # back in the queue, body and all, and out again
    [again] = delivered_messages(engine.outbox.take())
    assert (again.body, again.redelivered) == (b"body5", True)
    assert engine.cached == 0


# -- flow control ----------------------------------------------------------------------------


def test_flow_trackers_count_what_each_queue_holds_until_it_is_settled() -> None:
    from mpbroker.flow import FlowChange, StoreLimits, Watermark

    off = Watermark(-1, -1)
    flow = FlowTracker(StoreLimits(Watermark(3, 1), off, off, off))
    engine = make_engine(flow_volatile=flow)
    send_all(engine, ["a", "b", "c"])
    assert flow.changes() == [FlowChange(Q, "msg_high 3")]
    engine.handle(9, subscribe(1, 1, prefetch=10))
    assert flow.changes() == []  # delivered but unacknowledged: still held
    engine.handle(9, Ack(1, 1, "b"))  # client mode: a and b
    assert flow.changes() == [FlowChange(Q, "")]
    assert flow.counts(Q)[0] == 1


def test_a_byte_window_makes_a_consumer_not_ready_before_its_message_window() -> None:
    window = 2 * make_message("x", body=b"b" * 100).size
    engine = make_engine(window_bytes_for=lambda destination: window)
    engine.handle(9, subscribe(1, 1, prefetch=100))
    for n in range(5):
        engine.handle(9, send(1, f"m{n}", Q, body=b"b" * 100))
    consumer = engine.consumers[(9, 1, 1)]
    assert list(consumer.unacked) == ["m0", "m1"] and not consumer.ready
    engine.handle(9, Ack(1, 1, "m0"))  # client mode: room for one more
    assert list(consumer.unacked) == ["m1", "m2"]
    assert consumer.unacked_bytes == 2 * consumer.unacked["m1"].size


# -- flow-to-disk ----------------------------------------------------------------------------


def test_while_paging_a_message_left_waiting_has_its_body_paged_out_and_back_at_delivery() -> None:
    pager = FakePager(room=100)
    engine = make_engine(pager=pager)
    engine.paging = True
    send_all(engine, ["m1", "m2"])
    waiting = list(engine.queues[Q].pending)
    assert [(m.body, m.headers) for m in waiting] == [(b"", {}), (b"", {})]
    assert all(m.temp_key for m in waiting)
    assert (engine.paged_messages, engine.paged_bytes) == (2, 8)
    assert engine.held_bytes == sum(message_size(m) for m in waiting)  # headers only
    engine.handle(0, subscribe(1, 1, prefetch=10))
    got = delivered_messages(engine.outbox.take())
    assert [(m.message_id, m.body, m.temp_key) for m in got] == [
        ("m1", b"body", 0),
        ("m2", b"body", 0),
    ]
    assert pager.bodies == {} and (engine.paged_messages, engine.paged_bytes) == (0, 0)


def test_a_message_taken_at_once_by_a_ready_consumer_is_never_paged() -> None:
    pager = FakePager(room=100)
    engine = make_engine(pager=pager)
    engine.paging = True
    engine.handle(0, subscribe(1, 1, prefetch=10))
    send_all(engine, ["m1"])
    assert pager.next_key == 1  # nothing was written


def test_page_out_takes_the_newest_bodies_first_and_stops_when_the_pager_is_full() -> None:
    engine = make_engine(pager=FakePager(room=2))
    send_all(engine, ["m1", "m2", "m3", "m4"])
    assert engine.page_out(100) == 8  # two bodies of 4 bytes: then no room
    assert [bool(m.temp_key) for m in engine.queues[Q].pending] == [False, False, True, True]


def test_page_out_does_not_rescan_a_paged_backlog() -> None:
    engine = make_engine(pager=FakePager(room=100))
    send_all(engine, ["m1", "m2", "m3"])
    engine.page_out(4)  # m3
    send_all(engine, ["m4", "m5"])
    engine.page_out(8)  # m5, m4: newer than the paged m3
    assert [bool(m.temp_key) for m in engine.queues[Q].pending] == [False, False, True, True, True]
    engine.page_out(4)  # then the older ones, newest first
    assert [bool(m.temp_key) for m in engine.queues[Q].pending] == [False, True, True, True, True]


def test_an_expired_paged_message_is_dropped_from_the_pager_without_reading_it() -> None:
    pager = FakePager(room=100)
    engine = make_engine(pager=pager)
    engine.paging = True
    message = make_message("m1")
    message.expires_ms = 5
    engine.handle(9, Send(1, message))
    assert len(pager.bodies) == 1
    assert engine.expire_scan(10) == 1
    assert pager.bodies == {} and engine.paged_bytes == 0 and engine.held_bytes == 0


def test_the_index_cache_also_stops_at_its_byte_budget() -> None:
    stored: dict[int, Message] = {}
    engine = make_engine(index_cache=IndexCache(stored.__getitem__, max_entries=100, max_bytes=10))
    for n in range(1, 5):
        message = make_message(f"m{n}", body=b"four")
        message.persistent, message.seq = True, n
        stored[n] = message
        engine.handle(9, Send(1, message))
    assert [m.paged for m in engine.queues[Q].pending] == [False, False, True, True]
    assert (engine.cached, engine.cached_bytes) == (2, 8)


def test_redelivered_stored_messages_count_in_the_index_cache_again_with_their_bytes() -> None:
    stored: dict[int, Message] = {}
    engine = make_engine(index_cache=IndexCache(stored.__getitem__, max_entries=100, max_bytes=10))
    for n in (1, 2):
        message = make_message(f"m{n}", body=b"four")
        message.persistent, message.seq = True, n
        stored[n] = message
        engine.handle(9, Send(1, message))
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_INDIVIDUAL, prefetch=10))
    assert (engine.cached, engine.cached_bytes) == (0, 0)
    engine.handle(0, Unsubscribe(1, 1))  # both come back, with their bodies
    assert (engine.cached, engine.cached_bytes) == (2, 8)


def test_an_ack_of_stored_messages_waits_for_the_store_and_others_are_answered_at_once() -> None:
    engine = make_engine()
    engine.handle(0, subscribe(1, 1, ack_mode=ACK_INDIVIDUAL))
    stored = make_message("s1")
    stored.persistent, stored.seq = True, 7
    engine.handle(9, Send(1, stored))
    send_all(engine, ["v1"])
    engine.outbox.take()
    engine.handle(0, Ack(1, 1, "v1", receipt="rv"))
    engine.handle(0, Ack(1, 1, "s1", receipt="rs"))
    assert of_type(engine.outbox.take(), Receipt) == [(0, Receipt(1, "rv"))]
    [waiting] = engine.take_effects().acks
    assert (waiting.gateway, waiting.conn, waiting.receipt, waiting.frame) == (0, 1, "rs", "ACK")
    assert [m.seq for m in waiting.messages] == [7]
    # The store could not settle it: back at the head of the queue, redelivered, but not
    # counted against max_redeliveries (the store failed, not the consumer); the store is
    # told to flag it.
    engine.unsettle(Q, waiting.messages)
    [again] = delivered_messages(engine.outbox.take())
    assert (again.message_id, again.redelivered, again.deliveries) == ("s1", True, 0)
    assert engine.queues[Q].held_messages == 1
    assert engine.take_effects().flagged == [(Q, 7)]
