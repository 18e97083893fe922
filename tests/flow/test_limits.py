"""FlowTracker: per-destination and global store limits, changes, stopped, forgetting."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpbroker.flow import GLOBAL, OFF, FlowChange, FlowTracker, StoreLimits, Watermark

NO = Watermark(OFF, OFF)


def limits(
    messages: Watermark = NO,
    nbytes: Watermark = NO,
    global_messages: Watermark = NO,
    global_bytes: Watermark = NO,
) -> StoreLimits:
    return StoreLimits(messages, nbytes, global_messages, global_bytes)


def test_a_destination_stops_at_high_and_is_released_at_low() -> None:
    t = FlowTracker(limits(messages=Watermark(3, 1)))
    t.add("/queue/a", 2, 20)
    assert t.changes() == []
    t.add("/queue/a", 1, 10)
    assert t.changes() == [FlowChange("/queue/a", "msg_high 3")]
    assert t.changes() == []  # reported once
    assert t.stopped() == {"/queue/a": "msg_high 3"}
    t.remove("/queue/a", 1, 10)  # 2 > low: still stopped
    assert t.changes() == []
    t.remove("/queue/a", 1, 10)
    [change] = t.changes()
    assert change == FlowChange("/queue/a", "") and not change.stopped
    assert t.stopped() == {}
    assert t.counts("/queue/a") == (1, 10)


def test_reasons_name_the_limit_and_messages_come_before_bytes() -> None:
    t = FlowTracker(limits(messages=Watermark(10, 5), nbytes=Watermark(100, 50)))
    t.add("/queue/a", 1, 100)
    assert t.changes() == [FlowChange("/queue/a", "byte_high 100")]
    t.add("/queue/a", 9, 0)  # both armed now: the message limit is named
    assert t.changes() == [FlowChange("/queue/a", "msg_high 10")]
    t.remove("/queue/a", 6, 0)  # messages released, bytes still armed
    assert t.changes() == [FlowChange("/queue/a", "byte_high 100")]
    t.remove("/queue/a", 0, 60)
    assert t.changes() == [FlowChange("/queue/a", "")]


def test_global_limits_stop_every_destination_under_the_empty_name() -> None:
    t = FlowTracker(limits(global_messages=Watermark(5, 2), global_bytes=Watermark(1000, 10)))
    t.add("/queue/a", 3, 30)
    t.add("/topic/b", 2, 20)
    assert t.changes() == [FlowChange(GLOBAL, "global_msg_high 5")]
    assert t.totals == (5, 50)
    t.remove("/queue/a", 3, 30)
    assert t.changes() == [FlowChange(GLOBAL, "")]
    t.add("/queue/c", 0, 2000)
    assert t.stopped() == {GLOBAL: "global_byte_high 1000"}


def test_a_stop_and_release_between_calls_reports_nothing() -> None:
    t = FlowTracker(limits(messages=Watermark(2, 0)))
    t.add("/queue/a", 2, 0)
    t.remove("/queue/a", 2, 0)
    assert t.changes() == []


def test_changes_come_in_the_order_they_last_happened() -> None:
    t = FlowTracker(limits(messages=Watermark(2, 0), nbytes=Watermark(100, 0)))
    t.add("/queue/a", 0, 100)
    t.add("/queue/b", 2, 0)
    t.add("/queue/a", 2, 0)  # a changes reason after b stopped
    assert t.changes() == [
        FlowChange("/queue/b", "msg_high 2"),
        FlowChange("/queue/a", "msg_high 2"),
    ]


def test_removing_more_than_was_added_clamps_at_zero() -> None:
    t = FlowTracker(limits())
    t.add("/queue/a", 2, 20)
    t.add("/queue/b", 1, 10)
    t.remove("/queue/a", 5, 50)
    t.remove("/queue/never", 5, 50)
    assert t.counts("/queue/a") == (0, 0)
    assert t.totals == (1, 10)  # totals fell by what a really held


def test_idle_destinations_are_forgotten() -> None:
    t = FlowTracker(limits(messages=Watermark(10, 5)))
    for n in range(1000):
        t.add(f"/queue/{n}", 1, 1)
        t.remove(f"/queue/{n}", 1, 1)
    t.add("/queue/x", 0, 0)
    assert t.tracked == 0
    t.add("/queue/a", 1, 0)
    assert t.tracked == 1


def test_bad_arguments_are_refused() -> None:
    t = FlowTracker(limits())
    with pytest.raises(ValueError, match="global"):
        t.add(GLOBAL, 1, 1)
    with pytest.raises(ValueError, match="-1 messages"):
        t.remove("/queue/a", -1, 0)


# --- property test against a model -------------------------------------------------------


@st.composite
def watermarks(draw: st.DrawFn, top: int) -> Watermark:
    if draw(st.integers(0, 3)) == 0:
        return NO
    high = draw(st.integers(min_value=1, max_value=top))
    return Watermark(high, draw(st.integers(min_value=0, max_value=high - 1)))


DESTINATIONS = ["/queue/a", "/queue/b", "/topic/c"]
operations = st.lists(
    st.one_of(
        st.tuples(
            st.sampled_from(["add", "remove"]),
            st.sampled_from(DESTINATIONS),
            st.integers(0, 6),
            st.integers(0, 60),
        ),
        st.just(("changes", "", 0, 0)),
    ),
    max_size=120,
)


def model_arm(armed: bool, mark: Watermark, value: int) -> bool:
    if armed:
        return value > mark.low
    return mark.high != OFF and value >= mark.high


@settings(max_examples=300)
@given(watermarks(10), watermarks(100), watermarks(20), watermarks(200), operations)
def test_tracker_matches_a_model(
    msg: Watermark,
    byte: Watermark,
    gmsg: Watermark,
    gbyte: Watermark,
    ops: list[tuple[str, str, int, int]],
) -> None:
    t = FlowTracker(StoreLimits(msg, byte, gmsg, gbyte))
    counts = {d: [0, 0] for d in DESTINATIONS}
    armed = {d: [False, False] for d in [*DESTINATIONS, GLOBAL]}
    reported: dict[str, str] = {}
    # destination -> when its reason last changed: (operation, 0) for the destination an
    # operation touched, (operation, 1) for the global limits, which settle after it.
    last_change: dict[str, tuple[int, int]] = {}
    clock = 0

    def reason(d: str) -> str:
        names = (
            ("global_msg_high", "global_byte_high") if d == GLOBAL else ("msg_high", "byte_high")
        )
        marks = (gmsg, gbyte) if d == GLOBAL else (msg, byte)
        for is_armed, name, mark in zip(armed[d], names, marks, strict=True):
            if is_armed:
                return f"{name} {mark.high}"
        return ""

    for op, d, m, b in ops:
        clock += 1
        if op == "changes":
            expected = [
                FlowChange(k, reason(k))
                for k in sorted(last_change, key=last_change.__getitem__)
                if reason(k) != reported.get(k, "")
            ]
            assert t.changes() == expected
            for change in expected:
                reported[change.destination] = change.reason
            reported = {k: v for k, v in reported.items() if v}
            last_change.clear()
            continue
        if op == "add":
            counts[d][0] += m
            counts[d][1] += b
        else:
            counts[d][0] = max(0, counts[d][0] - m)
            counts[d][1] = max(0, counts[d][1] - b)
        getattr(t, op)(d, m, b)
        totals = [sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())]
        for key, values, marks in ((d, counts[d], (msg, byte)), (GLOBAL, totals, (gmsg, gbyte))):
            before = reason(key)
            armed[key] = [
                model_arm(a, mk, v) for a, mk, v in zip(armed[key], marks, values, strict=True)
            ]
            if reason(key) != before:
                last_change[key] = (clock, int(key == GLOBAL))

        assert t.counts(d) == tuple(counts[d])
        assert t.totals == tuple(totals)
        assert t.stopped() == {k: reason(k) for k in armed if reason(k)}
        # No entry survives for a destination that holds nothing and is not stopped.
        live = [k for k in DESTINATIONS if counts[k] != [0, 0] or any(armed[k])]
        assert t.tracked == len(live)


def test_destination_tables_give_matching_destinations_their_own_watermarks() -> None:
    from mpbroker.config import config_from_mapping
    from mpbroker.flow import destination_limits, store_limits

    config = config_from_mapping({"destinations": {"/queue/tiny.*": {"msg_high": 2, "msg_low": 0}}})
    tracker = FlowTracker(
        store_limits(config.vol_queue_store), destination_limits(config, "vol_queue_store")
    )
    tracker.add("/queue/tiny.a", 2, 10)
    tracker.add("/queue/normal", 2, 10)
    assert tracker.changes() == [FlowChange("/queue/tiny.a", "msg_high 2")]
    tracker.remove("/queue/tiny.a", 2, 10)
    assert tracker.changes() == [FlowChange("/queue/tiny.a", "")]


def test_reconfigure_judges_every_destination_again() -> None:
    off = Watermark(OFF, OFF)
    tracker = FlowTracker(StoreLimits(Watermark(3, 1), off, off, off))
    tracker.add("/queue/a", 3, 30)
    assert tracker.changes() == [FlowChange("/queue/a", "msg_high 3")]
    tracker.reconfigure(StoreLimits(Watermark(10, 5), off, off, off))
    assert tracker.changes() == [FlowChange("/queue/a", "")]  # 3 <= the new low
    tracker.reconfigure(StoreLimits(Watermark(2, 1), off, off, Watermark(20, 10)))
    assert tracker.changes() == [
        FlowChange("/queue/a", "msg_high 2"),
        FlowChange(GLOBAL, "global_byte_high 20"),
    ]
    tracker.reconfigure(StoreLimits(off, off, off, off))  # switched off: everyone goes
    assert sorted(c.reason for c in tracker.changes()) == ["", ""]
