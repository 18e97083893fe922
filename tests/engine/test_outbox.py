"""Outbox.deliver: deliveries of one message share a Deliver record where order allows."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mpbroker.engine import Outbox
from mpbroker.records import Barrier, Deliver, FlowState, Receipt, Record
from tests.engine._helpers import make_message

M1 = make_message("m1", "/topic/t")
M2 = make_message("m2", "/topic/t")


def shape(out: dict[int, list[Record]], gateway: int = 0) -> list[object]:
    """Each record as (message id, targets) for a Deliver, else its type name."""
    return [
        (r.message.message_id, r.targets) if isinstance(r, Deliver) else type(r).__name__
        for r in out.get(gateway, [])
    ]


def test_deliveries_of_one_message_to_one_gateway_share_a_record() -> None:
    outbox = Outbox()
    outbox.deliver(0, 1, 10, M1)
    outbox.deliver(0, 2, 20, M1)
    outbox.deliver(1, 3, 30, M1)  # another gateway: its own record
    out = outbox.take()
    assert shape(out, 0) == [("m1", [(1, 10), (2, 20)])]
    assert shape(out, 1) == [("m1", [(3, 30)])]


def test_a_subscriber_drained_later_joins_the_records_of_the_one_before() -> None:
    outbox = Outbox()
    for message in (M1, M2):  # the first subscriber's backlog
        outbox.deliver(0, 1, 10, message)
    for message in (M1, M2):  # the second's, the same messages
        outbox.deliver(0, 2, 20, message)
    assert shape(outbox.take()) == [("m1", [(1, 10), (2, 20)]), ("m2", [(1, 10), (2, 20)])]


def test_a_delivery_never_moves_ahead_of_what_its_connection_was_sent_before() -> None:
    outbox = Outbox()
    outbox.deliver(0, 1, 10, M1)
    outbox.add(0, Receipt(2, "r"))  # to connection 2, after m1's record
    outbox.deliver(0, 2, 20, M1)  # would come before its receipt: a record of its own
    outbox.deliver(0, 3, 30, M1)  # connection 3 was sent nothing: joins the newest
    assert shape(outbox.take()) == [
        ("m1", [(1, 10)]),
        "Receipt",
        ("m1", [(2, 20), (3, 30)]),
    ]


def test_a_connections_deliveries_keep_their_order() -> None:
    outbox = Outbox()
    outbox.deliver(0, 1, 10, M1)
    outbox.deliver(0, 2, 20, M2)
    outbox.deliver(0, 2, 20, M1)  # after m2 for connection 2: cannot join m1's record
    assert shape(outbox.take()) == [("m1", [(1, 10)]), ("m2", [(2, 20)]), ("m1", [(2, 20)])]


def test_a_record_for_every_connection_fences_what_came_before() -> None:
    outbox = Outbox()
    outbox.deliver(0, 1, 10, M1)
    outbox.add(0, FlowState(5, "topics", "", "global_live_msg_high 10"))
    outbox.deliver(0, 2, 20, M1)
    assert shape(outbox.take()) == [("m1", [(1, 10)]), "FlowState", ("m1", [(2, 20)])]


def test_take_empties_the_outbox_and_what_records_may_join() -> None:
    outbox = Outbox()
    outbox.deliver(0, 1, 10, M1)
    outbox.take()
    outbox.deliver(0, 2, 20, M1)
    assert shape(outbox.take()) == [("m1", [(2, 20)])]


def test_take_runs_the_engines_deferred_work_first() -> None:
    outbox = Outbox()
    outbox.before_take = lambda: outbox.add(0, Barrier(1, 7))
    assert shape(outbox.take()) == ["Barrier"]


# Each step: (connection, message index) delivered, or (connection, None) a receipt to it.
steps = st.lists(st.tuples(st.integers(1, 3), st.one_of(st.none(), st.integers(0, 3))), max_size=30)


@given(steps)
def test_every_connection_sees_its_records_in_the_order_they_were_made(
    made: list[tuple[int, int | None]],
) -> None:
    messages = [make_message(f"m{i}", "/topic/t") for i in range(4)]
    outbox = Outbox()
    expected: dict[int, list[str]] = {}
    for conn, index in made:
        if index is None:
            outbox.add(0, Receipt(conn, f"r{len(expected.get(conn, []))}"))
            expected.setdefault(conn, []).append("receipt")
        else:
            outbox.deliver(0, conn, conn * 10, messages[index])
            expected.setdefault(conn, []).append(messages[index].message_id)
    seen: dict[int, list[str]] = {}
    for record in outbox.take().get(0, []):
        if isinstance(record, Deliver):
            for conn, _ in record.targets:
                seen.setdefault(conn, []).append(record.message.message_id)
        else:
            assert isinstance(record, Receipt)
            seen.setdefault(record.conn, []).append("receipt")
    assert seen == expected
