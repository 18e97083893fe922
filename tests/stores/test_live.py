"""LiveSet: the compact seq -> size set of a segment's unsettled messages, against a dict."""

from __future__ import annotations

import gc
import tracemalloc
from array import array
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpbroker.stores._live import LiveSet


class SmallTrim(LiveSet):
    """Trims its settled prefix as early as allowed, so small examples exercise trimming."""

    __slots__ = ()
    trim_min = 1


def contents(live: LiveSet) -> list[int]:
    return list(live)


def test_empty() -> None:
    live = LiveSet()
    assert len(live) == 0 and not live and live.total_size == 0
    assert contents(live) == [] and 1 not in live
    assert live.discard(1) is False
    live.extend(5, [])
    assert not live


def test_extend_discard_contains_iter() -> None:
    live = LiveSet()
    live.extend(10, [100, 200, 300])
    live.extend(13, [5])
    assert contents(live) == [10, 11, 12, 13]
    assert len(live) == 4 and live.total_size == 605
    assert 9 not in live and 10 in live and 13 in live and 14 not in live
    assert "10" not in live and None not in live
    assert live.discard(11) is True
    assert live.discard(11) is False  # settling twice is a no-op
    assert live.discard(99) is False and live.discard(-3) is False
    assert 11 not in live and contents(live) == [10, 12, 13]
    assert len(live) == 3 and live.total_size == 405
    assert repr(live) == "LiveSet(len=3, total_size=405)"


def test_gap_between_extends_holds_nothing() -> None:
    live = LiveSet()
    live.extend(1, [1])
    live.extend(5, [2, 3])
    assert contents(live) == [1, 5, 6] and live.total_size == 6
    assert all(s not in live for s in (2, 3, 4))
    assert live.discard(3) is False and len(live) == 3


def test_extend_refuses_seqs_already_added_and_changes_nothing() -> None:
    live = LiveSet()
    live.extend(1, [10, 20, 30])
    live.discard(3)  # the last slot stays: seqs are never reused while the set is not empty
    for first in (1, 3):
        with pytest.raises(ValueError, match="already added"):
            live.extend(first, [1])
    with pytest.raises(ValueError, match="out of range"):
        live.extend(4, [1, -1])
    with pytest.raises(ValueError, match="out of range"):
        live.extend(4, [1 << 64])
    assert contents(live) == [1, 2] and live.total_size == 30
    live.extend(4, [7])
    assert contents(live) == [1, 2, 4] and live.total_size == 37


def test_emptied_set_starts_afresh() -> None:
    live = LiveSet()
    live.extend(100, [1, 2])
    live.discard(100)
    live.discard(101)
    assert not live and live.total_size == 0 and contents(live) == []
    assert 100 not in live
    live.extend(3, [4])  # empty: any first seq will do
    assert contents(live) == [3] and live.total_size == 4


def test_sizes_past_32_bits() -> None:
    big = (1 << 32) + 5
    live = LiveSet()
    live.extend(1, [7, 8])
    live.extend(3, [big, 9])
    assert live.total_size == 7 + 8 + big + 9
    live.discard(1)
    live.discard(3)
    assert live.total_size == 17 and contents(live) == [2, 4]
    live.discard(2)
    live.discard(4)
    assert live.total_size == 0
    live.extend(5, [(1 << 64) - 1])
    assert live.total_size == (1 << 64) - 1


def test_extend_takes_any_sequence_of_ints() -> None:
    live = LiveSet()
    live.extend(1, (1, 2))
    live.extend(3, array("Q", [3, 1 << 40]))
    live.extend(5, array("I", [5]))
    live.extend(6, range(6, 8))
    assert contents(live) == list(range(1, 8))
    assert live.total_size == 1 + 2 + 3 + (1 << 40) + 5 + 6 + 7


def test_from_items_with_holes() -> None:
    live = LiveSet.from_items([(3, 30), (4, 40), (7, 70), (9, 90)])
    assert contents(live) == [3, 4, 7, 9] and live.total_size == 230
    assert 5 not in live and 8 not in live and 2 not in live and 10 not in live
    live.extend(10, [1])
    assert contents(live) == [3, 4, 7, 9, 10]
    with pytest.raises(ValueError):
        LiveSet.from_items([(5, 1), (4, 1)])
    assert isinstance(SmallTrim.from_items([(1, 1)]), SmallTrim)


def test_in_order_settling_trims_the_prefix() -> None:
    live = SmallTrim()
    live.extend(1, [1] * 10)
    for seq in range(1, 9):
        assert live.discard(seq)
        assert contents(live) == list(range(seq + 1, 11))
        assert seq not in live and (seq + 1) in live
    live.extend(11, [2])
    assert contents(live) == [9, 10, 11] and live.total_size == 4
    assert live.discard(0) is False and 8 not in live
    with pytest.raises(ValueError):
        live.extend(11, [1])


def _retained(build: Callable[[], object]) -> int:
    """Bytes still allocated after `build()` returns, held by what it returned."""
    if tracemalloc.is_tracing():
        pytest.skip("tracemalloc is already in use")
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = build()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del kept
    return int(after - before)


def _filled(n: int) -> LiveSet:
    live = LiveSet()
    for first in range(1, n + 1, 100):
        live.extend(first, [1000 + i for i in range(100)])
    return live


def test_a_few_bytes_per_message() -> None:
    n = 100_000
    assert len(_filled(n)) == n
    # A dict[int, int] holds ~100 bytes a message; this holds a flag byte and a 32-bit size.
    assert _retained(lambda: _filled(n)) / n < 6


def test_settled_prefix_and_emptied_sets_release_memory() -> None:
    n = 100_000

    def consumed() -> LiveSet:
        live = _filled(n)
        for seq in range(1, n - 99):
            live.discard(seq)
        return live

    assert len(consumed()) == 100
    assert _retained(consumed) < n  # well under the 5 bytes a message of the full set

    def emptied() -> LiveSet:
        live = _filled(n)
        for seq in range(n, 0, -1):  # newest first: no prefix to trim until the very end
            live.discard(seq)
        return live

    assert _retained(emptied) < 1000


# -- property test against the dict the store used to keep ------------------------------------

_SIZES = st.one_of(st.integers(0, 300), st.integers((1 << 32) - 2, 1 << 40))


@settings(max_examples=300)
@given(start=st.integers(0, 1 << 40), trim=st.booleans(), data=st.data())
def test_matches_a_dict_model(start: int, trim: bool, data: st.DataObject) -> None:
    live = SmallTrim() if trim else LiveSet()
    model: dict[int, int] = {}
    end = start  # the next seq that may be added
    for _ in range(data.draw(st.integers(0, 60), label="steps")):
        op = data.draw(st.sampled_from(["extend", "discard", "discard", "contains"]))
        if op == "extend":
            first = end + data.draw(st.integers(0, 3), label="gap")
            sizes = data.draw(st.lists(_SIZES, max_size=6), label="sizes")
            live.extend(first, sizes)
            model.update(zip(range(first, first + len(sizes)), sizes, strict=True))
            if sizes:
                end = first + len(sizes)
            if model:
                # Seqs already added are refused while anything is live; nothing changes.
                back = data.draw(st.integers(1, 3), label="back")
                with pytest.raises(ValueError):
                    live.extend(end - back, [1])
            continue
        if model and data.draw(st.booleans(), label="a live seq"):
            # Live seqs, the oldest most often (shrinks towards 0): a queue settles in order.
            keys = sorted(model)
            seq = keys[data.draw(st.integers(0, len(keys) - 1), label="index")]
        else:
            seq = data.draw(st.integers(start - 2, end + 2), label="seq")
        if op == "discard":
            assert live.discard(seq) is (model.pop(seq, None) is not None)
        else:
            assert (seq in live) is (seq in model)
        assert len(live) == len(model)
        assert bool(live) is bool(model)
        assert live.total_size == sum(model.values())
        assert contents(live) == sorted(model)
