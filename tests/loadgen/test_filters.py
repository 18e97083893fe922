"""The selector study's plans: selector texts, message headers, which subscriber selects which
message (checked against the broker's own selector compiler), frames and tallies."""

from __future__ import annotations

import pytest

from mpbroker.loadgen.filters import (
    KINDS,
    NO_FILTER,
    FilterPlan,
    FilterTally,
    check,
    parse_int_list,
    parse_kinds,
)
from mpbroker.loadgen.wire import KeyedSendTemplate, body_prefix, make_body
from mpbroker.records import Message
from mpbroker.selector import compile_selector
from mpbroker.stomp import CLIENT_COMMANDS, Frame, FrameParser, encode_frame

TOKEN = b"12345678"


def _message(plan: FilterPlan, seq: int) -> Message:
    return Message(f"m{seq}", "/topic/t", plan.headers(seq), b"", 0)


@pytest.mark.parametrize(
    ("plan", "subscriber", "text"),
    [
        (FilterPlan(10, "simple"), 0, "ID = 'k0'"),
        (FilterPlan(10, "simple"), 7, "ID = 'k7'"),
        (
            FilterPlan(10, "and", 3, message_components=3),
            4,
            "ID = 'k4' AND a1 = 'x' AND a2 = 'x'",
        ),
        (FilterPlan(10, "or", 3), 4, "ID = 'k4' OR ID = 'k14' OR ID = 'k24'"),
        (FilterPlan(10, "in", 3), 4, "ID IN ('k4', 'k14', 'k24')"),
        # Replication 3: subscribers 0, 1, 2 share the key the messages carry.
        (FilterPlan(10, "simple", replication=3), 2, "ID = 'k0'"),
        (FilterPlan(10, "in", 2, replication=3), 3, "ID IN ('k3', 'k13')"),
        # Two keys, replication 2: subscribers 0 and 2 select k0, 1 and 3 select k1.
        (FilterPlan(10, "simple", replication=2, keys=2), 3, "ID = 'k1'"),
        (FilterPlan(3, NO_FILTER, replication=3), 1, None),
    ],
)
def test_selector_texts(plan: FilterPlan, subscriber: int, text: str | None) -> None:
    assert plan.selector(subscriber) == text


def test_messages_carry_the_id_and_the_and_properties() -> None:
    plan = FilterPlan(100, "or", 2, keys=4, message_components=3)
    assert plan.headers(0) == {"ID": "k0", "a1": "x", "a2": "x"}
    assert plan.headers(7)["ID"] == "k3"
    assert FilterPlan(5).headers(3) == {"ID": "k0"}


_PLANS = [
    FilterPlan(1, "simple"),
    FilterPlan(20, "simple"),
    FilterPlan(20, "simple", replication=4),
    FilterPlan(20, "and", 5, replication=2, message_components=5),
    FilterPlan(20, "and", 3, message_components=5),
    FilterPlan(20, "or", 5, replication=3),
    FilterPlan(20, "in", 5, replication=1),
    FilterPlan(20, "in", 1),
    FilterPlan(12, "simple", keys=12),
    FilterPlan(24, "or", 4, replication=2, keys=6),
    FilterPlan(3, NO_FILTER, replication=3),
]


@pytest.mark.parametrize("plan", _PLANS, ids=lambda p: p.label)
def test_selects_agrees_with_the_broker_selector(plan: FilterPlan) -> None:
    selectors = [plan.selector(i) for i in range(plan.subscribers)]
    compiled = [None if s is None else compile_selector(s) for s in selectors]
    for seq in range(2 * plan.keys + 1):
        message = _message(plan, seq)
        selecting = [
            i
            for i, selector in enumerate(compiled)
            if selector is None or selector.matches(message)
        ]
        assert selecting == [i for i in range(plan.subscribers) if plan.selects(i, seq)]
        # The replication grade: exactly r subscribers select each message.
        assert len(selecting) == plan.replication
    for i in range(plan.subscribers):
        selected = sum(1 for seq in range(30) if plan.selects(i, seq))
        assert plan.selected(i, 30) == selected
        assert (selected > 0) == (i in plan.selecting)
        if plan.kind != NO_FILTER:
            selector = compiled[i]
            assert selector is not None
            assert plan.filter_components == plan.components
            assert selector.text.count("'k") == (1 if plan.kind == "and" else plan.components)
    assert plan.expected_deliveries(30, topic=True) == 30 * plan.replication
    assert plan.expected_deliveries(30, topic=False) == 30


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"subscribers": 0}, "subscribers must be at least 1"),
        ({"subscribers": 5, "kind": "xor"}, "unknown filter kind 'xor'"),
        ({"subscribers": 5, "components": 2}, "a simple filter has 1 component"),
        ({"subscribers": 5, "replication": 6}, "needs at least 6 subscribers"),
        ({"subscribers": 5, "replication": 2, "keys": 3}, "needs at least 6 subscribers"),
        ({"subscribers": 5, "kind": "and", "components": 3}, "an AND filter of 3 components"),
        ({"subscribers": 5, "kind": NO_FILTER}, "r = n"),
    ],
)
def test_plans_that_do_not_fit_together(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FilterPlan(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("persistent", [False, True])
def test_keyed_frames_equal_frames_encoded_one_by_one(persistent: bool) -> None:
    plan = FilterPlan(10, "and", 3, keys=3, message_components=3)
    template = KeyedSendTemplate(
        "/topic/100%",
        key_header="ID",
        key_prefix="k",
        keys=3,
        headers=plan.fixed_headers(),
        persistent=persistent,
        token=TOKEN,
        producer=0,
        size=64,
    )
    expected = []
    for seq in range(8, 16):
        headers = {"destination": "/topic/100%", **plan.headers(seq)}
        if persistent:
            headers["persistent"] = "true"
        expected.append(encode_frame(Frame("SEND", headers, make_body(TOKEN, 0, seq, 64))))
    assert template.frames(8, 16) == b"".join(expected)
    assert template.frame_bytes == len(expected[0])
    (frame,) = FrameParser(commands=CLIENT_COMMANDS).feed(template.frame_with_receipt(5, "r5"))
    assert frame.headers["ID"] == "k2" and frame.headers["receipt"] == "r5"
    assert frame.headers["a2"] == "x"
    assert frame.body == make_body(TOKEN, 0, 5, 64)


def _body(seq: int) -> bytes:
    return make_body(TOKEN, 0, seq, 40)


def _tally(plan: FilterPlan, count: int = 10) -> FilterTally:
    return FilterTally(body_prefix(TOKEN), plan, count)


def test_a_topic_run_where_everything_arrived() -> None:
    plan = FilterPlan(6, "simple", replication=2)
    a, b = _tally(plan), _tally(plan)
    a.add(("0", _body(seq)) for seq in range(10))
    b.add(("1", _body(seq)) for seq in range(10))
    result = check([a, b], plan, topic=True, sent=10)
    assert result.ok, result.summary()
    assert (result.expected, result.received, result.missing) == (20, 20, 0)
    assert "all 20 deliveries arrived exactly once, in order" in result.summary()


def test_topic_problems_are_counted() -> None:
    plan = FilterPlan(6, "simple", replication=2)
    tally = _tally(plan)
    tally.add(("0", _body(seq)) for seq in (0, 1, 1, 3, 2))  # a duplicate, a reorder
    tally.add([("4", _body(0)), ("1", b"87654321:00000:0000000000:....")])  # unselected, foreign
    result = check([tally], plan, topic=True, sent=5)
    assert not result.ok
    assert result.duplicated == 1
    assert result.reordered == 2  # the second 1 and the 2
    assert result.unexpected == 1
    assert result.foreign == 1
    # Subscriber 0 lacks 4, subscriber 1 lacks all 5.
    assert result.missing == 6
    summary = result.summary()
    assert "6 MISSING" in summary and "1 DUPLICATED" in summary
    assert "1 NOT SELECTED" in summary and "OUT OF ORDER" in summary


def test_a_queue_divides_each_key_among_its_subscribers() -> None:
    # 2 keys, 2 consumers per key: 0 and 2 share k0 (even messages), 1 and 3 share k1.
    plan = FilterPlan(4, "simple", replication=2, keys=2)
    a, b = _tally(plan), _tally(plan)
    a.add([("0", _body(0)), ("2", _body(2)), ("1", _body(1)), ("3", _body(3))])
    b.add([("2", _body(4)), ("1", _body(5))])
    result = check([a, b], plan, topic=False, sent=6)
    assert result.ok, result.summary()
    b.add([("0", _body(4))])  # a second consumer of the same key got message 4 too
    result = check([a, b], plan, topic=False, sent=7)
    assert (result.duplicated, result.missing) == (1, 1)  # 4 twice; 6 never


def test_list_options() -> None:
    assert parse_int_list("--x", "100, 1,10,1_000,10") == (1, 10, 100, 1000)
    with pytest.raises(ValueError, match="--x takes comma-separated whole numbers"):
        parse_int_list("--x", "1,ten")
    with pytest.raises(ValueError, match="--x values must be at least 1, got 0"):
        parse_int_list("--x", "0,1")
    assert parse_kinds("--k", "in, OR,simple") == ("simple", "or", "in")
    assert parse_kinds("--k", ",".join(KINDS)) == KINDS
    with pytest.raises(ValueError, match="--k: unknown kind 'xor'"):
        parse_kinds("--k", "simple,xor")
