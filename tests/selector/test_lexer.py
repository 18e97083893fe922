"""The selector lexer: tokens, their values and columns, and the errors of bad text."""

from __future__ import annotations

import pytest

from mpbroker.selector import SelectorError
from mpbroker.selector._lexer import Token, describe, tokenize


def kinds(text: str) -> list[tuple[str, str | int | float | None]]:
    """(kind, value) of each token but the end, the value being the keyword or operator's
    text for those."""
    return [
        (t.kind, t.text if t.kind in ("keyword", "op") else t.value)
        for t in tokenize(text)
        if t.kind != "end"
    ]


def test_tokens_carry_their_1_based_columns_and_the_end_is_one_past_the_text() -> None:
    tokens = tokenize("color = 'red' AND price>5")
    assert [(t.kind, t.column) for t in tokens] == [
        ("ident", 1),
        ("op", 7),
        ("string", 9),
        ("keyword", 15),
        ("ident", 19),
        ("op", 24),
        ("number", 25),
        ("end", 26),
    ]


def test_every_operator_and_the_longest_one_first() -> None:
    assert [t.text for t in tokenize("= <> < <= > >= + - * / ( ) ,")][:-1] == [
        "=", "<>", "<", "<=", ">", ">=", "+", "-", "*", "/", "(", ")", ",",
    ]  # fmt: skip
    assert [t.text for t in tokenize("a<>b<=c>=d")][:-1] == ["a", "<>", "b", "<=", "c", ">=", "d"]


@pytest.mark.parametrize("word", ["and", "And", "AND", "aNd"])
def test_keywords_are_read_in_any_case(word: str) -> None:
    assert tokenize(word)[0] == Token("keyword", "AND", None, 1)


def test_every_keyword() -> None:
    words = "null true false not and or between like in is escape"
    assert [t.text for t in tokenize(words) if t.kind == "keyword"] == words.upper().split()


@pytest.mark.parametrize(
    "name", ["color", "Color", "_x", "$id", "a1_$", "JMSPriority", "prix_été", "日本", "a\u0301b"]
)
def test_identifiers_follow_javas_rules_and_keep_their_case(name: str) -> None:
    assert kinds(name) == [("ident", name)]


def test_an_identifier_that_only_looks_like_a_keyword_in_unicode_is_an_identifier() -> None:
    dotless = "\u0131n"  # a dotless i: its upper() is "IN"
    assert dotless.upper() == "IN"
    assert kinds(dotless) == [("ident", dotless)]
    assert kinds("ANDY Or_ nots") == [("ident", "ANDY"), ("ident", "Or_"), ("ident", "nots")]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("'red'", "red"),
        ("''", ""),
        ("'it''s'", "it's"),
        ("''''", "'"),
        ("'a\nb'", "a\nb"),
        ("'%_\\'", "%_\\"),
        ("'AND'", "AND"),
    ],
)
def test_strings_are_single_quoted_with_two_quotes_for_one(text: str, value: str) -> None:
    assert tokenize(text)[0] == Token("string", text, value, 1)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("57", 57),
        ("0", 0),
        ("007", 7),
        ("9223372036854775808", 2**63),
        ("7E3", 7000.0),
        ("7e3", 7000.0),
        ("57.9E2", 5790.0),
        ("7.", 7.0),
        (".5", 0.5),
        ("4E+10", 4e10),
        ("4E-10", 4e-10),
        ("7.e3", 7000.0),
        ("1E999", float("inf")),
    ],
)
def test_numbers_are_exact_ints_or_approximate_floats(text: str, value: int | float) -> None:
    token = tokenize(text)[0]
    assert token.kind == "number"
    assert token.value == value
    assert type(token.value) is type(value)


def test_a_sign_is_an_operator_not_part_of_the_number() -> None:
    assert kinds("-957 +62") == [("op", "-"), ("number", 957), ("op", "+"), ("number", 62)]
    assert kinds("a-1") == [("ident", "a"), ("op", "-"), ("number", 1)]


def test_whitespace_is_javas_and_counts_one_column_per_character() -> None:
    tokens = tokenize("a\t=\r\n\f'é'  b")
    assert [(t.text, t.column) for t in tokens] == [
        ("a", 1),
        ("=", 3),
        ("'é'", 7),
        ("b", 12),
        ("", 13),
    ]


@pytest.mark.parametrize(
    ("text", "column", "problem"),
    [
        ("a = 'red", 5, "unterminated string: no closing quote"),
        ("a = 'it''s", 5, "unterminated string: no closing quote"),
        ("'", 1, "unterminated string: no closing quote"),
        ("a # b", 3, "unexpected character '#'"),
        ('a = "red"', 5, "unexpected character '\"'"),
        ("a != b", 3, "unexpected '!=': not equal is written <>"),
        ("a\u00a0= 1", 2, "unexpected character '\\xa0'"),  # no-break space is not Java's
        ("x = ٣", 5, "unexpected character '٣'"),  # digits are ASCII
        ("a = .", 5, "unexpected character '.'"),
        ("a = 1E", 5, "malformed number '1E'"),
        ("a = 1e+", 5, "malformed number '1e+'"),
        ("a = 57abc", 5, "malformed number '57abc'"),
        ("a = 1.2.3", 5, "malformed number '1.2.3'"),
        ("a = 1_000", 5, "malformed number '1_000'"),
        (
            "a = 9223372036854775809",
            5,
            "exact number 9223372036854775809 is out of range (a 64-bit Java long)",
        ),
    ],
)
def test_bad_text_is_a_selector_error_at_its_column(text: str, column: int, problem: str) -> None:
    with pytest.raises(SelectorError) as caught:
        tokenize(text)
    assert (caught.value.column, caught.value.problem) == (column, problem)


def test_thousands_of_digits_are_out_of_range_not_a_crash() -> None:
    # int() refuses more than 4300 digits: the lexer must not get that far.
    with pytest.raises(SelectorError, match="out of range"):
        tokenize("1" * 5000)
    assert tokenize("0" * 5000 + "1")[0].value == 1


def test_describe_names_tokens_for_error_messages() -> None:
    tokens = tokenize("AND = price 'x' 5")
    assert [describe(t) for t in tokens] == [
        "AND",
        "'='",
        "identifier price",
        "string 'x'",
        "number 5",
        "end of input",
    ]
