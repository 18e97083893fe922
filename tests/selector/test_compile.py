"""Compiled selectors: SQL's three-valued logic, the type rules of text headers, every
operator, the JMS header fields, LIKE, and the fast paths agreeing with the general ones."""

from __future__ import annotations

import dataclasses
import time
from functools import partial

import pytest

from mpbroker.records import Message
from mpbroker.selector import Selector, compile_selector
from mpbroker.selector._ast import Comparison, Identifier, StringLiteral
from mpbroker.selector._compile import like_matcher
from mpbroker.selector._values import to_boolean, to_number
from tests.factories import make_message

message = partial(make_message, "ID:7")


def selects(text: str, **headers: str) -> bool:
    return compile_selector(text).matches(message(headers=headers))


def truth(text: str, msg: Message) -> bool | None:
    """The selector's three-valued result for `msg`: TRUE if it selects the message, FALSE
    if its negation does, UNKNOWN if neither."""
    if compile_selector(text).matches(msg):
        assert not compile_selector(f"NOT ({text})").matches(msg)
        return True
    if compile_selector(f"NOT ({text})").matches(msg):
        return False
    return None


# Conditions with a known truth value: t is TRUE, f FALSE, u UNKNOWN (a missing header).
CONDITIONS = {True: "t = 'yes'", False: "f = 'yes'", None: "u = 'yes'"}
TRUTHS = message(headers={"t": "yes", "f": "no"})
VALUES: list[bool | None] = [True, False, None]


@pytest.mark.parametrize("x", VALUES)
def test_not_is_sqls(x: bool | None) -> None:
    assert truth(f"NOT ({CONDITIONS[x]})", TRUTHS) == (None if x is None else not x)


@pytest.mark.parametrize(
    ("x", "y", "expected"),
    [
        (True, True, True),
        (True, False, False),
        (True, None, None),
        (False, True, False),
        (False, False, False),
        (False, None, False),
        (None, True, None),
        (None, False, False),
        (None, None, None),
    ],
)
def test_and_is_sqls(x: bool | None, y: bool | None, expected: bool | None) -> None:
    assert truth(f"{CONDITIONS[x]} AND {CONDITIONS[y]}", TRUTHS) == expected
    # The same in a longer chain, in a NOT, and with plain condition operands.
    assert truth(f"{CONDITIONS[x]} AND t = 'yes' AND {CONDITIONS[y]}", TRUTHS) == expected
    assert truth(f"NOT NOT ({CONDITIONS[x]} AND {CONDITIONS[y]})", TRUTHS) == expected


@pytest.mark.parametrize(
    ("x", "y", "expected"),
    [
        (True, True, True),
        (True, False, True),
        (True, None, True),
        (False, True, True),
        (False, False, False),
        (False, None, None),
        (None, True, True),
        (None, False, None),
        (None, None, None),
    ],
)
def test_or_is_sqls(x: bool | None, y: bool | None, expected: bool | None) -> None:
    assert truth(f"{CONDITIONS[x]} OR {CONDITIONS[y]}", TRUTHS) == expected
    assert truth(f"{CONDITIONS[x]} OR f = 'yes' OR {CONDITIONS[y]}", TRUTHS) == expected
    assert truth(f"NOT NOT ({CONDITIONS[x]} OR {CONDITIONS[y]})", TRUTHS) == expected


def test_a_missing_header_is_null_so_not_does_not_select_the_message() -> None:
    assert not selects("NOT (x = 1)")
    assert not selects("NOT (x = 'a')")
    assert not selects("NOT (x <> 'a')")
    assert not selects("x <> 'a'")
    assert selects("NOT (x = 'a')", x="b")
    assert selects("x <> 'a'", x="b")


def test_booleans_literals_and_headers_used_as_conditions() -> None:
    assert selects("TRUE") and not selects("FALSE") and selects("NOT FALSE")
    assert selects("urgent AND price > 5", urgent="true", price="6")
    assert selects("urgent", urgent="TRUE") and selects("urgent", urgent="True")
    assert truth("urgent", message(headers={"urgent": "false"})) is False
    assert truth("urgent", message(headers={"urgent": "yes"})) is None
    assert truth("urgent", message(headers={"urgent": "1"})) is None
    assert truth("urgent", message()) is None
    assert truth("JMSPriority", message()) is None  # a number is no condition


# -- comparisons and the type rules ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "headers", "expected"),
    [
        # text against a string: as strings, all six operators
        ("color = 'red'", {"color": "red"}, True),
        ("color = 'red'", {"color": "Red"}, False),
        ("color <> 'red'", {"color": "blue"}, True),
        ("color < 'red'", {"color": "blue"}, True),
        ("color <= 'blue'", {"color": "blue"}, True),
        ("color > 'red'", {"color": "blue"}, False),
        ("color >= 'b'", {"color": "blue"}, True),
        ("'red' = color", {"color": "red"}, True),
        ("'a' < color", {"color": "b"}, True),
        ("a = b", {"a": "1", "b": "1.0"}, False),  # two texts compare as text
        ("a = b", {"a": "x", "b": "x"}, True),
        ("a < b", {"a": "10", "b": "9"}, True),
        ("n = '120'", {"n": "120"}, True),
        # text against a number: read as a number when it is a numeric literal
        ("price > 100.5", {"price": "120"}, True),
        ("price > 100.5", {"price": "100.5"}, False),
        ("priority = 9", {"priority": "9"}, True),
        ("n = 1000", {"n": "1e3"}, True),
        ("n = 1000", {"n": "1E+3"}, True),
        ("n = -3", {"n": "-3"}, True),
        ("n = 3", {"n": "+3"}, True),
        ("n = 7", {"n": "007"}, True),
        ("n = 0.5", {"n": ".5"}, True),
        ("n = 7", {"n": "7."}, True),
        ("n = 5", {"n": "5.0"}, True),
        ("5 = n", {"n": "5"}, True),
        ("n > 1", {"n": "abc"}, None),
        ("n > 1", {"n": ""}, None),
        ("n > 1", {"n": " 5"}, None),
        ("n > 1", {"n": "5 "}, None),
        ("n > 1", {"n": "1_000"}, None),
        ("n > 1", {"n": "0x10"}, None),
        ("n > 1", {"n": "١٢"}, None),  # digits of another script
        ("n > 1", {"n": "1e"}, None),
        ("n > 1", {"n": "."}, None),
        ("n > 1", {"n": "inf"}, None),
        ("n > 1", {"n": "NaN"}, None),
        ("n > 1", {}, None),
        # text against a boolean: true/false in any case
        ("flag = TRUE", {"flag": "true"}, True),
        ("flag = TRUE", {"flag": "TRUE"}, True),
        ("flag = false", {"flag": "False"}, True),
        ("flag <> TRUE", {"flag": "false"}, True),
        ("flag = TRUE", {"flag": "yes"}, None),
        ("flag = TRUE", {"flag": "1"}, None),
        ("flag < TRUE", {"flag": "false"}, None),  # booleans are only equal or not
        # literals are never converted
        ("'5' = 5", {}, None),
        ("'true' = TRUE", {}, None),
        ("5 = TRUE", {}, None),
        ("n = TRUE", {"n": "5"}, None),
        ("5 = 5.0", {}, True),
        ("'a' < 'b'", {}, True),
        ("TRUE = TRUE", {}, True),
        ("TRUE <> FALSE", {}, True),
        ("(a = 1) = TRUE", {"a": "1"}, True),
        ("(a = 1) = (b = 2)", {"a": "1", "b": "3"}, False),
        ("(a = 1) = flag", {"a": "1", "flag": "TRUE"}, True),
        ("(a = 1) = TRUE", {}, None),
    ],
)
def test_comparisons_follow_the_type_rules(
    text: str, headers: dict[str, str], expected: bool | None
) -> None:
    assert truth(text, message(headers=headers)) == expected


def test_big_and_odd_numbers_in_headers() -> None:
    assert selects("n = 9223372036854775807", n="9223372036854775807")
    assert selects("n + 1 = 9223372036854775808", n="9223372036854775807")  # exact
    assert selects("n > 1E300", n="9" * 400)  # beyond a long: read as a float
    assert selects("n = 1E999", n="1e999")  # infinity
    assert selects("n = 1", n="0" * 5000 + "1")


def test_header_conversions() -> None:
    assert to_number("120") == 120 and type(to_number("120")) is int
    assert to_number("-0") == 0 and type(to_number("-0")) is int
    assert to_number("4E+10") == 4e10 and type(to_number("4E+10")) is float
    assert to_number("100.5") == 100.5
    assert to_number("-9223372036854775808") == -(2**63)
    assert type(to_number("99999999999999999999")) is float
    for bad in ["", "+", "-", ".", "e5", "1e", "1 ", "abc", "1,5", "0x1F", "²"]:
        assert to_number(bad) is None, bad
    assert [to_boolean(t) for t in ["true", "FALSE", "tRuE", "yes", "1", "", "truee"]] == [
        True,
        False,
        True,
        None,
        None,
        None,
        None,
    ]
    assert to_boolean("fal\u017fe") is None  # a long s, which upper() would make an S


# -- arithmetic -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "headers", "expected"),
    [
        ("rank / version = 61.5", {"rank": "123", "version": "2"}, True),
        ("a + b = 3", {"a": "1", "b": "2"}, True),
        ("a - b * 2 = -3", {"a": "1", "b": "2"}, True),
        ("(a - b) * 2 = -2", {"a": "1", "b": "2"}, True),
        ("a / 4 = 0.25", {"a": "1"}, True),
        ("-a = -1", {"a": "1"}, True),
        ("- -a = 1", {"a": "1"}, True),
        ("+a = 1", {"a": "1"}, True),
        ("-a = 1", {"a": "x"}, None),
        ("+a = 'x'", {"a": "x"}, None),
        ("a / 0 = 1", {"a": "1"}, None),
        ("a / 0.0 > 1", {"a": "1"}, None),
        ("a / b > 1", {"a": "0", "b": "0"}, None),
        ("a + 1 = 2", {"a": "x"}, None),
        ("a + 1 = 2", {}, None),
        ("a + 1 IS NULL", {"a": "x"}, True),
        ("a * 1E308 * 10 > 1E308", {"a": "1"}, True),  # overflow to infinity
        ("1E999 - 1E999 = 0", {}, False),  # NaN equals nothing
        ("0.1 + 0.2 = 0.3", {}, False),  # floats are floats
        ("9223372036854775807 * 9223372036854775807 / 1E-300 > 1", {}, True),
        # an int beyond a float's range divided: UNKNOWN (17 factors of 2**63 exceed 2**1024)
        (" * ".join(["9223372036854775807"] * 17) + " / 2 > 1", {}, None),
        (" * ".join(["9223372036854775807"] * 17) + " > 1E308", {}, True),
        ("JMSPriority * 2 = 8", {}, True),
        ("JMSPriority + a = 5", {"a": "1"}, True),
        ("7 / 2 = 3.5", {}, True),
        ("6 / 3 = 2", {}, True),
    ],
)
def test_arithmetic(text: str, headers: dict[str, str], expected: bool | None) -> None:
    assert truth(text, message(headers=headers)) == expected


def test_int_arithmetic_stays_exact() -> None:
    assert selects("a + 1 = 9007199254740993", a="9007199254740992")  # 2**53 + 1
    assert not selects("a + 1.0 = 9007199254740993", a="9007199254740992")


# -- BETWEEN, IN, IS NULL ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "headers", "expected"),
    [
        ("n BETWEEN 1 AND 10", {"n": "1"}, True),
        ("n BETWEEN 1 AND 10", {"n": "10"}, True),
        ("n BETWEEN 1 AND 10", {"n": "10.5"}, False),
        ("n BETWEEN 1 AND 10", {"n": "x"}, None),
        ("n BETWEEN 1 AND 10", {}, None),
        ("n NOT BETWEEN 1 AND 10", {"n": "11"}, True),
        ("n NOT BETWEEN 1 AND 10", {"n": "5"}, False),
        ("n NOT BETWEEN 1 AND 10", {}, None),
        ("n BETWEEN 'a' AND 'c'", {"n": "b"}, True),  # strings, as >= and <=
        ("n BETWEEN 'a' AND 'c'", {"n": "d"}, False),
        ("JMSPriority BETWEEN 5 AND 'c'", {}, False),  # FALSE AND UNKNOWN
        ("JMSPriority BETWEEN 1 AND 'c'", {}, None),  # TRUE AND UNKNOWN
        ("n BETWEEN 1 AND 'c'", {"n": "0"}, False),  # 0 >= 1 is FALSE
        ("n BETWEEN 1 AND 'c'", {"n": "2"}, True),  # 2 >= 1, and '2' <= 'c' as text
        ("n BETWEEN a AND b", {"n": "5", "a": "1", "b": "9"}, True),  # three texts: as text
        ("n BETWEEN a AND b", {"n": "50", "a": "1", "b": "9"}, True),
        ("n BETWEEN a + 0 AND b + 0", {"n": "50", "a": "1", "b": "9"}, False),
        ("n BETWEEN a AND 9", {"n": "5", "a": "1"}, True),
        ("n BETWEEN a AND 9", {"n": "5"}, None),
        ("JMSPriority BETWEEN 0 AND 4", {}, True),
        ("5 BETWEEN 1 AND 10", {}, True),
        ("'b' BETWEEN 'a' AND 'c'", {}, True),
        ("TRUE BETWEEN FALSE AND TRUE", {}, None),
        ("color IN ('red', 'blue')", {"color": "blue"}, True),
        ("color IN ('red', 'blue')", {"color": "green"}, False),
        ("color IN ('red', 'blue')", {}, None),
        ("color NOT IN ('red', 'blue')", {"color": "green"}, True),
        ("color NOT IN ('red', 'blue')", {"color": "red"}, False),
        ("color NOT IN ('red', 'blue')", {}, None),
        ("n IN (1, 2.5, -3)", {"n": "2.5"}, True),
        ("n IN (1, 2.5, -3)", {"n": "-3.0"}, True),
        ("n IN (1, 2.5, -3)", {"n": "1E0"}, True),
        ("n IN (1, 2.5, -3)", {"n": "4"}, False),
        ("n IN (1, 2.5, -3)", {"n": "x"}, None),  # x = 1 is UNKNOWN
        ("n IN ('x', 1)", {"n": "x"}, True),
        ("n IN ('x', 1)", {"n": "1"}, True),
        ("n IN ('x', 1)", {"n": "y"}, None),
        ("n IN ('x', 1)", {"n": "2"}, False),
        ("n NOT IN ('x', 1)", {"n": "y"}, None),
        ("JMSPriority IN (1, 4)", {}, True),
        ("JMSPriority IN ('4', 5)", {}, None),  # a number against a string: UNKNOWN
        ("JMSPriority IN ('4', 4)", {}, True),
        ("JMSPriority IN (5, 6)", {}, False),
        ("'a' IN ('a', 1)", {}, True),
        ("'b' IN ('a', 1)", {}, None),
        ("'b' IN ('a')", {}, False),
        ("(n = 1) IN (1)", {"n": "1"}, None),
        ("x IS NULL", {}, True),
        ("x IS NULL", {"x": ""}, False),
        ("x IS NOT NULL", {"x": ""}, True),
        ("x IS NOT NULL", {}, False),
        ("JMSPriority IS NULL", {}, False),
        ("JMSType IS NULL", {}, True),
        ("(x = 1) IS NULL", {}, True),
        ("(x = 1) IS NULL", {"x": "1"}, False),
        ("'a' IS NULL", {}, False),
    ],
)
def test_between_in_and_is_null(text: str, headers: dict[str, str], expected: bool | None) -> None:
    assert truth(text, message(headers=headers)) == expected


# -- LIKE --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "escape", "text", "expected"),
    [
        ("abc", None, "abc", True),
        ("abc", None, "abcd", False),
        ("a%", None, "abc", True),
        ("a%", None, "a", True),
        ("a%", None, "ba", False),
        ("%c", None, "abc", True),
        ("%b%", None, "abc", True),
        ("%b%", None, "ac", False),
        ("a_c", None, "abc", True),
        ("a_c", None, "ac", False),
        ("a_c", None, "a\nc", True),  # _ is any character, a newline too
        ("a%c", None, "a\n\nc", True),
        ("a%b%c", None, "abbcc", True),
        ("a%b%c", None, "acb", False),
        ("%a%", None, "", False),
        ("%", None, "", True),
        ("", None, "", True),
        ("_", None, "", False),
        ("%%", None, "x", True),
        ("__", None, "ab", True),
        ("a%%b", None, "ab", True),
        ("ab%ab", None, "ab", False),  # the two runs may not overlap
        ("ab%ab", None, "abab", True),
        ("_%_", None, "a", False),
        ("_%_", None, "ab", True),
        # regular expression characters are literal
        ("a.b*", None, "a.b*", True),
        ("a.b*", None, "axb", False),
        ("a.b*", None, "a.bbb", False),
        ("(x)", None, "(x)", True),
        ("(x)", None, "x", False),
        ("[", None, "[", True),
        ("[a]%", None, "[a]b", True),
        ("[a]%", None, "a", False),
        ("\\", None, "\\", True),
        ("a\\%", None, "a\\bc", True),
        ("^a$|b", None, "^a$|b", True),
        ("^a$|b", None, "b", False),
        ("x+?{2}", None, "x+?{2}", True),
        ("%.%", None, "a.b", True),
        ("%.%", None, "ab", False),
        # ESCAPE
        ("50!%", "!", "50%", True),
        ("50!%", "!", "500", False),
        ("a!_b", "!", "a_b", True),
        ("a!_b", "!", "axb", False),
        ("a!!b", "!", "a!b", True),
        # The escape escapes only %, _ and itself (ActiveMQ): before anything else it is an
        # ordinary character of the pattern.
        ("a!b", "!", "a!b", True),
        ("a!b", "!", "ab", False),
        ("a!!!b", "!", "a!!b", True),
        ("ab!", "!", "ab!", True),  # at the very end: an ordinary character
        ("\\%%", "\\", "%off", True),
        ("\\%%", "\\", "off", False),
        ("%\\_%", "\\", "a_b", True),
        ("%\\_%", "\\", "ab", False),
        # % or _ as the escape character (ActiveMQ and Artemis take them)
        ("10%%", "%", "10%", True),
        ("10%%", "%", "10", False),
        ("10%%", "%", "10%x", False),
        ("%a", "%", "a", True),  # before an ordinary character: the wildcard
        ("%a", "%", "ba", True),
        ("%a", "%", "b", False),
        ("_D7xl__", "_", "XD7xl_", True),  # ActiveMQ's SelectorTest
        ("_D7xl__", "_", "XD7xlY", False),
        ("_D7xl__", "_", "D7xl_", False),
        ("10%%x", "%", "10%x", True),
        ("10%%x", "%", "10x", False),
        ("a%", "%", "abc", True),  # at the end: the wildcard
        ("a__b", "_", "a_b", True),
        ("a__b", "_", "axb", False),
        ("a_", "_", "ab", True),
        ("%_%", "_", "x%y", False),
        ("%_%", "_", "%%", True),
        ("x.%", ".", "x%", True),
        ("x.%", ".", "x.y", False),
        ("a*%", "*", "a%", True),
    ],
)
def test_like(pattern: str, escape: str | None, text: str, expected: bool) -> None:
    assert like_matcher(pattern, escape)(text) is expected
    quoted = "'" + pattern.replace("'", "''") + "'"
    selector = f"s LIKE {quoted}" + ("" if escape is None else f" ESCAPE '{escape}'")
    assert selects(selector, s=text) is expected
    negated = selector.replace(" LIKE ", " NOT LIKE ")
    assert selects(negated, s=text) is (not expected)


def test_like_applies_to_text_only() -> None:
    assert truth("s LIKE '%'", message()) is None
    assert truth("s NOT LIKE '%'", message()) is None
    assert truth("JMSPriority LIKE '4'", message()) is None
    assert truth("(s = 1) LIKE 'TRUE'", message(headers={"s": "1"})) is None
    assert truth("'abc' LIKE 'a%'", message()) is True
    assert truth("JMSMessageID LIKE 'ID:%'", message()) is True
    assert truth("s LIKE '1%'", message(headers={"s": "12"})) is True


def test_like_patterns_cannot_make_matching_slow() -> None:
    hostile = "%a" * 60 + "%b"
    start = time.perf_counter()
    assert not like_matcher(hostile, None)("a" * 4000)
    assert like_matcher(hostile, None)("a" * 4000 + "b")
    assert not like_matcher("%_a%_a%_a%_a%_a%_a%_b", None)("a" * 4000)
    assert time.perf_counter() - start < 1.0


# -- JMS header fields --------------------------------------------------------------------------


def test_jms_header_fields_read_the_message() -> None:
    msg = make_message(
        "ID:abc-1",
        headers={"type": "order", "correlation-id": "c-9", "priority": "1"},
        persistent=True,
        priority=7,
        timestamp_ms=1_700_000_000_000,
        expires_ms=1_700_000_060_000,
    )
    for text in [
        "JMSMessageID = 'ID:abc-1'",
        "JMSPriority = 7",
        "JMSPriority > 5",
        "JMSPriority = 7.0",
        "JMSTimestamp = 1700000000000",
        "JMSType = 'order'",
        "JMSCorrelationID = 'c-9'",
        "JMSDeliveryMode = 'PERSISTENT'",
        "JMSExpiration = 1700000060000",
        "JMSExpiration > JMSTimestamp",
        "priority = 1",  # an ordinary header, not JMSPriority
        "priority = '1'",
    ]:
        assert compile_selector(text).matches(msg), text
    plain = make_message(persistent=False)
    assert compile_selector("JMSDeliveryMode = 'NON_PERSISTENT'").matches(plain)
    assert compile_selector("JMSExpiration = 0").matches(plain)  # never expires
    assert truth("JMSType = 'order'", plain) is None  # no type header: NULL
    assert truth("JMSPriority = '7'", msg) is None  # a number against a string literal
    assert compile_selector("JMSMessageID = 5").matches(make_message("5"))  # text id, number
    assert truth("JMSMessageID = 5", msg) is None
    assert truth("jmspriority = 7", msg) is None  # identifiers are case-sensitive: a header


def test_keywords_in_any_case_compile_the_same() -> None:
    msg = message(headers={"a": "5", "b": "x"})
    words = ["between", "and", "in", "not", "like", "escape", "is", "null", "or", "false"]
    template = "a {} 1 {} 9 {} b {} ('x') {} {} b {} 'y%' {} '!' {} c {} {} {} {}"
    order = [0, 1, 1, 2, 1, 3, 4, 5, 1, 6, 7, 8, 9]
    for case in (str.lower, str.upper, str.title, lambda w: w[0] + w[1:].upper()):
        text = template.format(*(case(words[i]) for i in order))
        assert compile_selector(text).matches(msg), text


# -- the fast paths agree with the general closures --------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "h = 'x'",
        "'x' = h",
        "h <> 'x'",
        "h IN ('x', 'y')",
        "h = 'x' AND g = 'y'",
        "h = 'x' AND g = 'y' AND k = 'z' AND m = 'w'",
        "h = 'x' AND h = 'y'",
        "h = 'x' AND h = 'x'",
        "h = 'x' OR h = 'y' OR g = 'y'",
        "h = 'x' OR g > 1",
        "JMSType = 'x' AND JMSCorrelationID = 'y'",
    ],
)
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"h": "x"},
        {"h": "y", "g": "y"},
        {"h": "x", "g": "y", "k": "z", "m": "w"},
        {"g": "2"},
        {"type": "x", "correlation-id": "y"},
    ],
)
def test_fast_paths_agree_with_three_valued_evaluation(text: str, headers: dict[str, str]) -> None:
    msg = message(headers=headers)
    fast = compile_selector(text).matches(msg)
    general = compile_selector(f"NOT NOT ({text})").matches(msg)  # no fast path under NOT
    assert fast is general


# -- the Selector -------------------------------------------------------------------------------


def test_a_selector_keeps_its_text_and_tree_and_is_immutable() -> None:
    selector = compile_selector("a = 'x' AND b > 1")
    assert isinstance(selector, Selector)
    assert selector.text == "a = 'x' AND b > 1"
    assert selector.conjuncts[0] == Comparison("=", Identifier("a"), StringLiteral("x"))
    assert len(selector.conjuncts) == 2
    assert compile_selector("a = 'x'").conjuncts == (selector.conjuncts[0],)
    with pytest.raises(dataclasses.FrozenInstanceError):
        selector.text = "b"  # type: ignore[misc]
    # Compiled once per text (cached), and compared by identity.
    assert selector is compile_selector("a = 'x' AND b > 1")
    assert selector != compile_selector("a = 'x' AND  b > 1")
    assert selector.matches(message(headers={"a": "x", "b": "2"})) is True
    assert selector.matches(message(headers={"a": "x"})) is False
