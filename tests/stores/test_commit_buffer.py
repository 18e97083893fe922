from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpbroker.stores import CommitBuffer


def test_flush_at_max_messages() -> None:
    buf: CommitBuffer[str] = CommitBuffer(max_delay_ms=5, max_messages=3, max_bytes=10_000)
    assert buf.add("a", 10, now_ms=0) is False
    assert buf.add("b", 10, now_ms=1) is False
    assert buf.add("c", 10, now_ms=2) is True
    assert buf.take() == ["a", "b", "c"]
    assert len(buf) == 0 and buf.bytes == 0 and buf.due_in_ms(3) is None


def test_flush_at_max_bytes() -> None:
    buf: CommitBuffer[int] = CommitBuffer(max_delay_ms=5, max_messages=100, max_bytes=250)
    assert buf.add(1, 100, 0) is False
    assert buf.add(2, 100, 0) is False
    assert buf.add(3, 50, 0) is True  # exactly max_bytes
    assert buf.take() == [1, 2, 3]


def test_oversized_item_flushes_alone() -> None:
    buf: CommitBuffer[int] = CommitBuffer(max_delay_ms=5, max_messages=100, max_bytes=250)
    assert buf.add(1, 10_000, 0) is True
    assert buf.take() == [1]


def test_delay_counts_from_the_oldest_item() -> None:
    buf: CommitBuffer[int] = CommitBuffer(max_delay_ms=5, max_messages=100, max_bytes=10_000)
    assert buf.due_in_ms(100) is None
    buf.add(1, 1, now_ms=100)
    assert buf.due_in_ms(100) == 5
    buf.add(2, 1, now_ms=103)  # a later item does not push the deadline back
    assert buf.due_in_ms(103) == 2
    assert buf.due_in_ms(105) == 0
    assert buf.due_in_ms(999) == 0  # overdue is "now", never negative
    assert buf.take() == [1, 2]
    buf.add(3, 1, now_ms=200)  # the next batch starts its own clock
    assert buf.due_in_ms(200) == 5


def test_max_messages_one_is_group_commit_off() -> None:
    buf: CommitBuffer[int] = CommitBuffer(max_delay_ms=5, max_messages=1, max_bytes=10_000)
    for i in range(3):
        assert buf.add(i, 1, 0) is True
        assert buf.take() == [i]


def test_zero_delay_is_due_at_once() -> None:
    buf: CommitBuffer[int] = CommitBuffer(max_delay_ms=0, max_messages=10, max_bytes=10)
    buf.add(1, 1, 7)
    assert buf.due_in_ms(7) == 0


@pytest.mark.parametrize(
    ("delay", "count", "size"), [(-1, 1, 1), (0, 0, 1), (0, 1, 0)], ids=["delay", "count", "bytes"]
)
def test_bad_limits_refused(delay: int, count: int, size: int) -> None:
    with pytest.raises(ValueError):
        CommitBuffer(delay, count, size)


@given(
    max_messages=st.integers(1, 20),
    max_bytes=st.integers(1, 2000),
    sizes=st.lists(st.integers(0, 500), max_size=200),
)
def test_flush_signal_exactly_at_a_limit_and_order_kept(
    max_messages: int, max_bytes: int, sizes: list[int]
) -> None:
    buf: CommitBuffer[int] = CommitBuffer(10, max_messages, max_bytes)
    taken: list[int] = []
    pending: list[int] = []
    pending_bytes = 0
    for i, size in enumerate(sizes):
        pending.append(i)
        pending_bytes += size
        expect = len(pending) >= max_messages or pending_bytes >= max_bytes
        assert buf.add(i, size, now_ms=i) is expect
        assert len(buf) == len(pending) and buf.bytes == pending_bytes
        if expect:
            batch = buf.take()
            assert batch == pending
            taken.extend(batch)
            pending, pending_bytes = [], 0
    taken.extend(buf.take())
    assert taken == list(range(len(sizes)))
