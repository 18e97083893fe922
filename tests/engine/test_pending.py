"""Pending: highest priority first, FIFO within a priority, returns at the head."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpbroker.engine._pending import IndexedPending, Pending
from tests.factories import numbered_message

KINDS = pytest.mark.parametrize("kind", [Pending, IndexedPending])


@given(st.lists(st.integers(min_value=0, max_value=9), max_size=60))
@KINDS
def test_pops_in_priority_then_arrival_order(kind: type[Pending], priorities: list[int]) -> None:
    pending = kind()
    messages = [numbered_message(n, priority=p) for n, p in enumerate(priorities)]
    for m in messages:
        pending.append(m)
    assert len(pending) == len(messages)
    expected = sorted(messages, key=lambda m: (-m.priority, int(m.message_id[1:])))
    assert list(pending) == expected
    assert [pending.popleft() for _ in messages] == expected
    assert not pending


@given(st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=30), st.data())
@KINDS
def test_returned_messages_go_back_to_the_head_in_order(
    kind: type[Pending], priorities: list[int], data: st.DataObject
) -> None:
    pending = kind()
    messages = [numbered_message(n, priority=p) for n, p in enumerate(priorities)]
    for m in messages:
        pending.append(m)
    taken = [pending.popleft() for _ in range(data.draw(st.integers(1, len(messages))))]
    pending.extendleft(taken)
    expected = sorted(messages, key=lambda m: (-m.priority, int(m.message_id[1:])))
    assert list(pending) == expected


@KINDS
def test_remove_where_takes_out_only_the_named(kind: type[Pending]) -> None:
    pending = kind()
    for n, p in enumerate([4, 9, 4, 0]):
        pending.append(numbered_message(n, priority=p))
    removed = pending.remove_where({"m0", "m3"})
    assert sorted(m.message_id for m in removed) == ["m0", "m3"]
    assert [m.message_id for m in pending] == ["m1", "m2"]
    assert len(pending) == 2


@KINDS
def test_remove_takes_out_that_very_message_from_the_middle(kind: type[Pending]) -> None:
    pending = kind()
    messages = [numbered_message(n, priority=p) for n, p in enumerate([4, 9, 4, 0, 4])]
    for m in messages:
        pending.append(m)
    twin = numbered_message(2, priority=4)  # equal, but not the one waiting
    assert not pending.remove(twin)
    assert pending.remove(messages[2]) and not pending.remove(messages[2])
    assert [m.message_id for m in pending] == ["m1", "m0", "m4", "m3"]
    assert len(pending) == 4
    assert pending.newest(4) is messages[4]


def test_an_indexed_pending_takes_over_another_in_order() -> None:
    pending = Pending()
    for n, p in enumerate([4, 9, 4, 0]):
        pending.append(numbered_message(n, priority=p))
    indexed = IndexedPending(pending)
    assert list(indexed) == list(pending) and len(indexed) == 4
