"""SelectorIndex: which conjunct files a selector where, what a message's values look up,
order, removal, and that non-matching selectors cost a message nothing."""

from __future__ import annotations

from functools import partial

import pytest

from mpbroker.selector import SelectorIndex, compile_selector
from mpbroker.selector._index import NULL, _placement
from tests.factories import make_message

message = partial(make_message, "ID:1")


def index_of(*texts: str) -> SelectorIndex[str]:
    """An index whose items are the selectors' texts."""
    index: SelectorIndex[str] = SelectorIndex()
    for text in texts:
        index.add(text, compile_selector(text))
    return index


@pytest.mark.parametrize(
    ("text", "placement"),
    [
        ("ID = 'k1'", ("ID", ("k1",))),
        ("'k1' = ID", ("ID", ("k1",))),
        ("n = 5", ("n", (5,))),
        ("n = 5.0", ("n", (5.0,))),
        ("n = -2", ("n", (-2,))),
        ("flag = TRUE", ("flag", (("boolean", True),))),
        ("FALSE = flag", ("flag", (("boolean", False),))),
        ("c IN ('a', 'b', 'a')", ("c", ("a", "b"))),
        ("c IN ('5', 5, 5.0)", ("c", ("5", 5))),
        ("c IS NULL", ("c", (NULL,))),
        ("JMSPriority = 4", ("JMSPriority", (4,))),
        ("JMSType = 'order'", ("JMSType", ("order",))),
        # the best conjunct of a top-level AND: =, then the shortest IN, then IS NULL
        ("c IS NULL AND d IN (1, 2) AND e = 'x' AND f > 1", ("e", ("x",))),
        ("c IS NULL AND d IN (1, 2, 3) AND e IN ('x', 'y')", ("e", ("x", "y"))),
        ("f > 1 AND c IS NULL", ("c", (NULL,))),
        # an OR whose every operand pins one property: as an IN
        ("ID = 'k1' OR ID = 'k2'", ("ID", ("k1", "k2"))),
        ("(ID = 'k1' AND a > 1) OR ID IN ('k2', 'k1')", ("ID", ("k1", "k2"))),
        # not indexable: evaluated for every message
        ("ID <> 'k1'", None),
        ("NOT ID = 'k1'", None),
        ("ID = 'k1' OR other = 'k2'", None),
        ("ID = 'k1' OR a > 1", None),
        ("c NOT IN ('a')", None),
        ("c IS NOT NULL", None),
        ("a = b", None),
        ("a + 0 = 1", None),
        ("c LIKE 'a'", None),
        ("TRUE", None),
    ],
)
def test_each_selector_is_filed_under_its_most_selective_conjunct(
    text: str, placement: tuple[str, tuple[object, ...]] | None
) -> None:
    assert _placement(compile_selector(text)) == placement


def test_matching_finds_exactly_the_matching_items_among_few_candidates() -> None:
    index: SelectorIndex[int] = SelectorIndex()
    for i in range(1000):
        index.add(i, compile_selector(f"ID = 'k{i}'"))
    assert index.matching(message(headers={"ID": "k42"})) == [42]
    assert index.candidates(message(headers={"ID": "k42"})) == [42]
    assert index.matching(message(headers={"ID": "zzz"})) == []
    assert index.candidates(message(headers={"ID": "zzz"})) == []
    assert index.candidates(message()) == []


def test_a_header_is_looked_up_as_text_number_and_boolean() -> None:
    index = index_of(
        "v = '5.0'", "v = 5", "v = 5.0", "v = TRUE", "v = 'true'", "v IS NULL", "v IN ('x', 7)"
    )
    assert index.matching(message(headers={"v": "5.0"})) == ["v = '5.0'", "v = 5", "v = 5.0"]
    assert index.matching(message(headers={"v": "5"})) == ["v = 5", "v = 5.0"]
    assert index.matching(message(headers={"v": "5e0"})) == ["v = 5", "v = 5.0"]
    assert index.matching(message(headers={"v": "true"})) == ["v = TRUE", "v = 'true'"]
    assert index.matching(message(headers={"v": "TRUE"})) == ["v = TRUE"]
    assert index.matching(message(headers={"v": "1"})) == []  # 1 is no boolean key
    assert index.matching(message()) == ["v IS NULL"]
    assert index.matching(message(headers={"v": "7.0"})) == ["v IN ('x', 7)"]
    assert index.matching(message(headers={"v": "x"})) == ["v IN ('x', 7)"]


def test_jms_fields_are_looked_up_by_their_values() -> None:
    index = index_of(
        "JMSPriority = 7",
        "JMSPriority IN (1, 2)",
        "JMSPriority = '7'",  # never TRUE: never a candidate
        "JMSType = 'order'",
        "JMSType IS NULL",
        "JMSDeliveryMode = 'PERSISTENT'",
        "JMSMessageID = 'ID:1'",
        "JMSMessageID IS NULL",
    )
    msg = make_message("ID:1", headers={"type": "order"}, priority=7, persistent=True)
    expected = [
        "JMSPriority = 7",
        "JMSType = 'order'",
        "JMSDeliveryMode = 'PERSISTENT'",
        "JMSMessageID = 'ID:1'",
    ]
    assert index.candidates(msg) == expected
    assert index.matching(msg) == expected
    assert index.matching(make_message("x", priority=2)) == [
        "JMSPriority IN (1, 2)",
        "JMSType IS NULL",
    ]


def test_the_other_conjuncts_still_decide() -> None:
    index = index_of("ID = 'k' AND n > 5", "ID = 'k' AND NOT n > 5")
    msg = message(headers={"ID": "k", "n": "9"})
    assert index.candidates(msg) == ["ID = 'k' AND n > 5", "ID = 'k' AND NOT n > 5"]
    assert index.matching(msg) == ["ID = 'k' AND n > 5"]
    assert index.matching(message(headers={"ID": "k"})) == []  # n missing: UNKNOWN both ways


def test_items_come_out_in_the_order_they_were_added_across_buckets() -> None:
    index = index_of(
        "a = 'x'", "b <> 'q'", "c IS NULL", "a IN ('y', 'x')", "b = 'y'", "a = 'x' AND b = 'y'"
    )
    msg = message(headers={"a": "x", "b": "y"})
    assert index.matching(msg) == [
        "a = 'x'",
        "b <> 'q'",
        "c IS NULL",
        "a IN ('y', 'x')",
        "b = 'y'",
        "a = 'x' AND b = 'y'",
    ]
    assert index.candidates(msg) == index.matching(msg)


def test_an_item_under_several_keys_comes_out_once() -> None:
    index = index_of("v IN ('5', 5, 'x')")
    assert index.matching(message(headers={"v": "5"})) == ["v IN ('5', 5, 'x')"]
    assert index.candidates(message(headers={"v": "5"})) == ["v IN ('5', 5, 'x')"]


def test_remove_add_again_len_and_contains() -> None:
    index: SelectorIndex[str] = SelectorIndex()
    a, b, c = (compile_selector(t) for t in ("k = 'x'", "k = 'x' OR TRUE", "k IS NULL"))
    index.add("a", a)
    index.add("b", b)
    index.add("c", c)
    assert len(index) == 3 and "a" in index and "z" not in index and 5 not in index
    index.remove("a")
    index.remove("a")  # absent: nothing happens
    index.remove("never added")
    assert len(index) == 2 and "a" not in index
    assert index.matching(message(headers={"k": "x"})) == ["b"]
    index.add("a", a)  # back, after the others
    assert index.matching(message(headers={"k": "x"})) == ["b", "a"]
    index.add("b", c)  # a new selector replaces the old, and the item moves to the end
    assert len(index) == 3
    assert index.matching(message(headers={"k": "x"})) == ["a"]
    assert index.matching(message()) == ["c", "b"]
    for item in ("a", "b", "c"):
        index.remove(item)
    assert len(index) == 0
    assert index.candidates(message()) == []
    # Nothing is left behind: no property, no bucket, no always-evaluated item.
    assert not index._properties and not index._always and not index._entries


def test_items_may_be_any_hashable_and_share_a_selector() -> None:
    selector = compile_selector("k = 'x'")
    index: SelectorIndex[tuple[int, int]] = SelectorIndex()
    index.add((0, 1), selector)
    index.add((0, 2), selector)
    assert index.matching(message(headers={"k": "x"})) == [(0, 1), (0, 2)]
    index.remove((0, 1))
    assert index.matching(message(headers={"k": "x"})) == [(0, 2)]


def test_a_message_looks_up_only_the_indexed_properties() -> None:
    """The cost of a message: one read per indexed property, whatever the number of items."""
    index: SelectorIndex[int] = SelectorIndex()
    for i in range(10_000):
        index.add(i, compile_selector(f"ID = 'k{i}' AND n > {i % 7}"))
    assert len(index._properties) == 1
    assert len(index._properties["ID"].buckets) == 10_000
    assert index.candidates(message(headers={"ID": "k9999", "n": "9"})) == [9999]
    assert index.matching(message(headers={"ID": "k9999", "n": "9"})) == [9999]
    assert index.matching(message(headers={"ID": "k9999", "n": "1"})) == []


def test_an_or_that_pins_one_property_is_indexed_like_an_in() -> None:
    index: SelectorIndex[str] = SelectorIndex()
    index.add("or", compile_selector("ID = 'a' OR ID = 'b' OR ID IN ('c', 'd')"))
    index.add("mixed", compile_selector("(ID = 'e' AND x > 1) OR ID = 'f'"))
    index.add("two-props", compile_selector("ID = 'a' OR other = 'b'"))
    for n in range(100):
        index.add(f"noise{n}", compile_selector(f"ID = 'n{n}' OR ID = 'm{n}'"))
    # (The OR over two properties cannot be indexed: it is always a candidate.)
    for value, expected in (("a", ["or"]), ("d", ["or"]), ("f", ["mixed"]), ("z", [])):
        got = index.candidates(make_message(headers={"ID": value}))
        assert got == [*expected, "two-props"], value
    assert index.matching(make_message(headers={"ID": "e", "x": "2"})) == ["mixed"]
    assert index.matching(make_message(headers={"ID": "e"})) == []
