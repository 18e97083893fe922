"""Watermark validation and Level hysteresis: arm at >= high, disarm only at <= low."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpbroker.flow import OFF, Level, Watermark


def test_a_limit_arms_at_high_and_disarms_only_at_low() -> None:
    level = Level(Watermark(10, 4), "msg_high")
    assert [level.update(v) for v in (0, 9, 10, 11, 10, 5)] == [None] * 2 + [True] + [None] * 3
    assert level.armed
    assert (level.update(4), level.armed) == (False, False)
    assert level.update(9) is None
    assert level.update(12) is True
    assert level.reason == "msg_high 10"


def test_a_switched_off_limit_never_arms() -> None:
    mark = Watermark(OFF, OFF)
    assert not mark.enabled
    level = Level(mark, "byte_high")
    assert all(level.update(v) is None for v in (0, 1, 10**12))
    assert not level.armed


@pytest.mark.parametrize(
    ("high", "low"),
    [(OFF, 0), (OFF, 5), (10, 10), (10, 11), (10, -1), (0, 0), (-5, -6), (-2, OFF)],
)
def test_bad_watermarks_are_refused_naming_both_numbers(high: int, low: int) -> None:
    with pytest.raises(ValueError) as raised:
        Watermark(high, low)
    assert f"low {low}" in str(raised.value)
    assert f"high {high}" in str(raised.value)


def test_good_watermarks() -> None:
    assert Watermark(1, 0).enabled
    assert Watermark(10_000, 9_999).enabled


@st.composite
def watermarks(draw: st.DrawFn) -> Watermark:
    if draw(st.booleans()):
        return Watermark(OFF, OFF)
    high = draw(st.integers(min_value=1, max_value=50))
    return Watermark(high, draw(st.integers(min_value=0, max_value=high - 1)))


@given(watermarks(), st.lists(st.integers(min_value=0, max_value=60), max_size=80))
def test_level_follows_the_hysteresis_model(mark: Watermark, values: list[int]) -> None:
    level = Level(mark, "msg_high")
    armed = False
    for value in values:
        before = armed
        # Armed: only falling to low disarms. Not armed: reaching high arms, unless off.
        armed = value > mark.low if armed else (mark.high != OFF and value >= mark.high)
        change = level.update(value)
        assert level.armed == armed
        assert change == (None if armed == before else armed)
