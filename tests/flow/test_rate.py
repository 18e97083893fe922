"""RateFlow: geometric decay while armed, linear recovery after, pacing by 1/rate."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpbroker.flow import RateFlow, RateSettings

# 1000 msg/s down to 10 msg/s in 2 steps over 4 s: each step lasts 2 s.
SETTINGS = RateSettings(maximum=1000.0, minimum=10.0, interval_s=4.0, steps=2)


def test_not_controlled_until_armed() -> None:
    flow = RateFlow(SETTINGS)
    assert not flow.controlled
    assert flow.rate(0.0) is None
    flow.sent(0.0)
    assert flow.delay(0.0) == 0.0


def test_decay_is_geometric_step_by_step_and_stays_at_minimum() -> None:
    flow = RateFlow(SETTINGS)
    flow.arm(100.0)
    assert flow.controlled
    assert flow.rate(100.0) == pytest.approx(1000.0)
    assert flow.rate(101.999) == pytest.approx(1000.0)
    assert flow.rate(102.0) == pytest.approx(100.0)  # 1000 * (10/1000) ** (1/2)
    assert flow.rate(103.9) == pytest.approx(100.0)
    assert flow.rate(104.0) == 10.0
    assert flow.rate(1000.0) == 10.0


def test_five_steps_match_the_formula() -> None:
    s = RateSettings(maximum=500.0, minimum=5.0, interval_s=1.0, steps=5)
    flow = RateFlow(s)
    flow.arm(0.0)
    for k in range(6):
        assert flow.rate(k * 0.2) == pytest.approx(500.0 * (5.0 / 500.0) ** (k / 5))


def test_recovery_is_linear_and_ends_control_at_maximum() -> None:
    flow = RateFlow(SETTINGS)
    flow.arm(0.0)
    flow.disarm(10.0)  # at minimum by then
    assert flow.controlled
    assert flow.rate(10.0) == pytest.approx(10.0)
    assert flow.rate(11.9) == pytest.approx(10.0)
    assert flow.rate(12.0) == pytest.approx(505.0)  # + (1000 - 10) / 2
    assert flow.controlled
    assert flow.rate(14.0) is None
    assert not flow.controlled


def test_recovery_from_the_middle_of_the_decay() -> None:
    flow = RateFlow(SETTINGS)
    flow.arm(0.0)
    flow.disarm(2.5)  # at 100 msg/s
    assert flow.rate(2.5) == pytest.approx(100.0)
    assert flow.rate(4.5) == pytest.approx(595.0)
    assert flow.rate(6.5) is None  # 100 + 2 * 495 > 1000: done after two steps


def test_disarm_before_the_first_step_ends_control_at_once() -> None:
    flow = RateFlow(SETTINGS)
    flow.arm(0.0)
    flow.disarm(1.0)
    assert not flow.controlled
    assert flow.rate(1.0) is None


def test_rearming_during_recovery_decays_from_the_current_rate() -> None:
    flow = RateFlow(SETTINGS)
    flow.arm(0.0)
    flow.disarm(10.0)
    flow.arm(12.5)  # recovered to 505 msg/s
    assert flow.rate(12.5) == pytest.approx(505.0)
    assert flow.rate(14.5) == pytest.approx(50.5)  # the same factor per step: 0.1
    assert flow.rate(16.5) == 10.0  # floored at minimum


def test_arming_twice_does_not_restart_the_decay() -> None:
    flow = RateFlow(SETTINGS)
    flow.arm(0.0)
    flow.arm(3.0)
    assert flow.rate(4.0) == 10.0


def test_disarming_when_not_armed_changes_nothing() -> None:
    flow = RateFlow(SETTINGS)
    flow.disarm(0.0)
    assert not flow.controlled
    flow.arm(0.0)
    flow.disarm(10.0)
    flow.disarm(12.0)  # still recovering from 10.0, not restarted
    assert flow.rate(12.0) == pytest.approx(505.0)


def test_delay_spaces_messages_one_over_rate_apart() -> None:
    flow = RateFlow(SETTINGS)
    flow.arm(0.0)
    assert flow.delay(0.0) == 0.0  # nothing sent yet
    flow.sent(0.0)
    assert flow.delay(0.0) == pytest.approx(0.001)
    assert flow.delay(0.0004) == pytest.approx(0.0006)
    assert flow.delay(0.01) == 0.0
    flow.sent(4.0)  # at 10 msg/s now
    assert flow.delay(4.0) == pytest.approx(0.1)


def test_equal_minimum_and_maximum_hold_one_rate() -> None:
    flow = RateFlow(RateSettings(50.0, 50.0, 1.0, 3))
    flow.arm(0.0)
    assert flow.rate(5.0) == 50.0
    flow.disarm(5.0)
    assert not flow.controlled


@pytest.mark.parametrize(
    ("maximum", "minimum", "interval_s", "steps", "word"),
    [
        (10.0, 0.0, 1.0, 1, "minimum"),
        (10.0, 20.0, 1.0, 1, "minimum"),
        (float("inf"), 1.0, 1.0, 1, "maximum"),
        (float("nan"), 1.0, 1.0, 1, "maximum"),
        (10.0, 1.0, 0.0, 1, "interval_s"),
        (10.0, 1.0, 1.0, 0, "steps"),
    ],
)
def test_bad_settings_are_refused(
    maximum: float, minimum: float, interval_s: float, steps: int, word: str
) -> None:
    with pytest.raises(ValueError, match=word):
        RateSettings(maximum, minimum, interval_s, steps)


@st.composite
def rate_settings(draw: st.DrawFn) -> RateSettings:
    minimum = draw(st.floats(min_value=0.1, max_value=1000.0))
    factor = draw(st.floats(min_value=1.0, max_value=100.0))
    return RateSettings(
        maximum=minimum * factor,
        minimum=minimum,
        interval_s=draw(st.floats(min_value=0.01, max_value=100.0)),
        steps=draw(st.integers(min_value=1, max_value=50)),
    )


gaps = st.lists(st.floats(min_value=0.0, max_value=10.0), max_size=40)
SLACK = 1e-9  # relative: float rounding of the rate formula


@given(rate_settings(), st.floats(min_value=0.0, max_value=1e6), gaps, gaps)
def test_decay_falls_recovery_rises_and_both_stay_in_bounds(
    s: RateSettings, start: float, decay_gaps: list[float], recovery_gaps: list[float]
) -> None:
    flow = RateFlow(s)
    now = start
    flow.arm(now)
    previous = s.maximum
    for gap in decay_gaps:
        now += gap * s.interval_s / 10
        rate = flow.rate(now)
        assert rate is not None
        assert s.minimum <= rate <= s.maximum
        assert rate <= previous * (1 + SLACK)
        previous = rate
    flow.disarm(now)
    ended = False
    for gap in recovery_gaps:
        now += gap * s.interval_s / 10
        rate = flow.rate(now)
        if rate is None:
            ended = True
            assert not flow.controlled
            continue
        assert not ended, "control came back without arming"
        assert s.minimum <= rate <= s.maximum
        assert rate >= previous * (1 - SLACK)
        previous = rate
    # A full interval after disarming, recovery is over whatever the rate was.
    assert flow.rate(now + s.interval_s * (1 + 1e-6)) is None


@given(rate_settings(), st.lists(st.tuples(st.booleans(), st.floats(0.0, 10.0)), max_size=40))
def test_arm_disarm_sequences_keep_the_rate_in_bounds(
    s: RateSettings, events: list[tuple[bool, float]]
) -> None:
    flow = RateFlow(s)
    now = 0.0
    for arm, gap in events:
        now += gap * s.interval_s / 10
        if arm:
            flow.arm(now)
            assert flow.controlled
        else:
            flow.disarm(now)
        rate = flow.rate(now)
        assert (rate is None) == (not flow.controlled)
        if rate is not None:
            assert s.minimum * (1 - SLACK) <= rate <= s.maximum
        flow.sent(now)
        assert 0.0 <= flow.delay(now) <= 1.0 / s.minimum + SLACK


def test_rate_settings_come_from_destination_tables_over_the_flow_defaults() -> None:
    from mpbroker.config import config_from_mapping
    from mpbroker.flow import rate_settings_for

    config = config_from_mapping(
        {
            "flow": {"flow_maximum": 100.0, "flow_minimum": 5.0},
            "destinations": {"/queue/slow.*": {"flow_control": True, "flow_steps": 4}},
        }
    )
    settings_for = rate_settings_for(config)
    assert settings_for("/queue/other") is None  # off by default
    assert settings_for("/queue/slow.a") == RateSettings(100.0, 5.0, 60.0, 4)
