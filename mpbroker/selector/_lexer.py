"""Selector text -> tokens (JMS 1.1 §3.8.1.1), each with the 1-based column it starts at.

Keywords are matched in any case, identifiers follow Java's rules and are case-sensitive,
strings are single-quoted with ``''`` for a quote, numbers are unsigned (a sign is the
parser's unary operator).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Final

from ._errors import SelectorError

__all__ = ["KEYWORDS", "OPERATORS", "Token", "describe", "tokenize"]

KEYWORDS: Final = frozenset(
    {"NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE"}
)
# Longest first, so that "<=" is not read as "<" then "=".
OPERATORS: Final = ("<>", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "(", ")", ",")
# Java's whitespace in the JMS grammar (ActiveMQ's): not every Unicode space.
_SPACE: Final = frozenset(" \t\n\r\f")
# ASCII digits only: Python's \d (and str.isdigit) would take other scripts' digits too.
_DIGITS: Final = frozenset("0123456789")
_NUMBER: Final = re.compile(r"(?:[0-9]+(\.[0-9]*)?|(\.)[0-9]+)([eE][+-]?[0-9]+)?")
# JMS: "exact numeric literals support numbers in the range of Java long"; the magnitude of
# Long.MIN_VALUE is allowed so that -9223372036854775808 can be written.
_EXACT_MAX: Final = 2**63
# Java's Character.isJavaIdentifierStart / isJavaIdentifierPart, by Unicode category.
_START_CATEGORIES: Final = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Nl", "Sc", "Pc"})
_PART_CATEGORIES: Final = _START_CATEGORIES | {"Nd", "Mn", "Mc"}


@dataclass(frozen=True, slots=True)
class Token:
    """One token. `kind` is ``ident``, ``string``, ``number``, ``keyword``, ``op`` or
    ``end``; `text` the upper-cased word for a keyword, the operator for an operator, the
    source text otherwise; `value` the string's or number's value, the identifier's name."""

    kind: str
    text: str
    value: str | int | float | None
    column: int


def describe(token: Token) -> str:
    """How an error message names a token: ``AND``, ``')'``, ``identifier price``..."""
    if token.kind == "end":
        return "end of input"
    if token.kind == "keyword":
        return token.text
    if token.kind == "op":
        return f"'{token.text}'"
    if token.kind == "ident":
        return f"identifier {token.text}"
    if token.kind == "string":
        return f"string {token.text}"
    return f"number {token.text}"


def _is_start(char: str) -> bool:
    if char.isascii():
        return char.isalpha() or char in "_$"
    return unicodedata.category(char) in _START_CATEGORIES


def _is_part(char: str) -> bool:
    if char.isascii():
        return char.isalnum() or char in "_$"
    return unicodedata.category(char) in _PART_CATEGORIES


def tokenize(text: str) -> list[Token]:
    """Every token of `text`, ending with one ``end`` token one column past the text."""
    tokens: list[Token] = []
    i = 0
    n = len(text)
    while i < n:
        char = text[i]
        column = i + 1
        if char in _SPACE:
            i += 1
        elif char == "'":
            i = _string(text, i, tokens)
        elif char in _DIGITS or (char == "." and text[i + 1 : i + 2] in _DIGITS):
            i = _number(text, i, tokens)
        elif _is_start(char):
            j = i + 1
            while j < n and _is_part(text[j]):
                j += 1
            word = text[i:j]
            upper = word.upper()
            if word.isascii() and upper in KEYWORDS:
                tokens.append(Token("keyword", upper, None, column))
            else:
                tokens.append(Token("ident", word, word, column))
            i = j
        else:
            for op in OPERATORS:
                if text.startswith(op, i):
                    tokens.append(Token("op", op, None, column))
                    i += len(op)
                    break
            else:
                if text.startswith("!=", i):
                    raise SelectorError(column, "unexpected '!=': not equal is written <>")
                raise SelectorError(column, f"unexpected character {char!r}")
    tokens.append(Token("end", "", None, n + 1))
    return tokens


def _string(text: str, start: int, tokens: list[Token]) -> int:
    """Reads the string literal whose opening quote is at `start`; returns the index after it."""
    parts: list[str] = []
    i = start + 1
    while True:
        quote = text.find("'", i)
        if quote < 0:
            raise SelectorError(start + 1, "unterminated string: no closing quote")
        parts.append(text[i:quote])
        if text.startswith("'", quote + 1):  # '' is one quote inside the string
            parts.append("'")
            i = quote + 2
        else:
            end = quote + 1
            tokens.append(Token("string", text[start:end], "".join(parts), start + 1))
            return end


def _number(text: str, start: int, tokens: list[Token]) -> int:
    """Reads the number starting at `start`; returns the index after it."""
    match = _NUMBER.match(text, start)
    assert match is not None  # the caller saw a digit, or a dot before a digit
    end = match.end()
    if end < len(text) and (_is_part(text[end]) or text[end] == "."):
        # 1E, 57abc, 1.2.3: show the whole run, not just what parsed.
        bad_end = end
        while bad_end < len(text) and (_is_part(text[bad_end]) or text[bad_end] in ".+-"):
            if text[bad_end] in "+-" and text[bad_end - 1] not in "eE":
                break
            bad_end += 1
        raise SelectorError(start + 1, f"malformed number {text[start:bad_end]!r}")
    source = match.group()
    value: int | float
    if match.group(1) is None and match.group(2) is None and match.group(3) is None:
        # Leading zeros off and the length tested first: int() refuses over 4300 digits.
        digits = source.lstrip("0") or "0"
        if len(digits) > 19 or (value := int(digits)) > _EXACT_MAX:
            raise SelectorError(
                start + 1, f"exact number {source} is out of range (a 64-bit Java long)"
            )
    else:
        value = float(source)
    tokens.append(Token("number", source, value, start + 1))
    return end
