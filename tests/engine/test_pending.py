"""Pending: highest priority first, FIFO within a priority, returns at the head."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mpbroker.engine._pending import Pending
from tests.factories import numbered_message


@given(st.lists(st.integers(min_value=0, max_value=9), max_size=60))
def test_pops_in_priority_then_arrival_order(priorities: list[int]) -> None:
    pending = Pending()
    messages = [numbered_message(n, priority=p) for n, p in enumerate(priorities)]
    for m in messages:
        pending.append(m)
    assert len(pending) == len(messages)
    expected = sorted(messages, key=lambda m: (-m.priority, int(m.message_id[1:])))
    assert list(pending) == expected
    assert [pending.popleft() for _ in messages] == expected
    assert not pending


@given(st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=30), st.data())
def test_returned_messages_go_back_to_the_head_in_order(
    priorities: list[int], data: st.DataObject
) -> None:
    pending = Pending()
    messages = [numbered_message(n, priority=p) for n, p in enumerate(priorities)]
    for m in messages:
        pending.append(m)
    taken = [pending.popleft() for _ in range(data.draw(st.integers(1, len(messages))))]
    pending.extendleft(taken)
    expected = sorted(messages, key=lambda m: (-m.priority, int(m.message_id[1:])))
    assert list(pending) == expected


def test_remove_where_takes_out_only_the_named() -> None:
    pending = Pending()
    for n, p in enumerate([4, 9, 4, 0]):
        pending.append(numbered_message(n, priority=p))
    removed = pending.remove_where({"m0", "m3"})
    assert sorted(m.message_id for m in removed) == ["m0", "m3"]
    assert [m.message_id for m in pending] == ["m1", "m2"]
    assert len(pending) == 2
