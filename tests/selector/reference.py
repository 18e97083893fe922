"""A reference interpreter of selector ASTs, for the property tests: it walks the tree for
every message, as plainly as the rules in docs/selectors.md read, and shares no code with
the compiler (not even the number and boolean conversions of `_values`).

Values are tagged with where they come from, since that decides conversions: ``text`` (an
identifier's text: converts), ``string`` (a literal: never converts), ``number``,
``boolean``; None is NULL / UNKNOWN.
"""

from __future__ import annotations

from typing import Any

from mpbroker.records import Message
from mpbroker.selector._ast import (
    And,
    Arithmetic,
    Between,
    BooleanLiteral,
    Comparison,
    Identifier,
    In,
    IsNull,
    Like,
    Node,
    Not,
    NumberLiteral,
    Or,
    StringLiteral,
    Unary,
)

Value = tuple[str, object] | None

DIGITS = "0123456789"


def selects(root: Node, message: Message) -> bool:
    """Whether a selector with this AST selects `message`: TRUE, not FALSE or UNKNOWN."""
    return truth(evaluate(root, message)) is True


def read_number(text: str) -> int | float | None:
    """A numeric literal of the grammar, with an optional sign: scanned by hand."""
    i = 0
    if text[:1] in ("+", "-"):
        i = 1
    digits_before = 0
    while i < len(text) and text[i] in DIGITS:
        i += 1
        digits_before += 1
    exact = True
    if i < len(text) and text[i] == ".":
        exact = False
        i += 1
        digits_after = 0
        while i < len(text) and text[i] in DIGITS:
            i += 1
            digits_after += 1
        if digits_before == 0 and digits_after == 0:
            return None
    elif digits_before == 0:
        return None
    if i < len(text) and text[i] in "eE":
        exact = False
        i += 1
        if i < len(text) and text[i] in "+-":
            i += 1
        exponent_digits = 0
        while i < len(text) and text[i] in DIGITS:
            i += 1
            exponent_digits += 1
        if exponent_digits == 0:
            return None
    if i != len(text):
        return None
    if exact:
        digits = text.lstrip("+-").lstrip("0") or "0"
        if len(digits) < 30 and abs(int(text)) <= 2**63:
            return int(text)
    return float(text)


def read_boolean(text: str) -> bool | None:
    if text.isascii() and text.upper() in ("TRUE", "FALSE"):
        return text.upper() == "TRUE"
    return None


def field(name: str, message: Message) -> Value:
    if name == "JMSMessageID":
        return ("text", message.message_id)
    if name == "JMSPriority":
        return ("number", message.priority)
    if name == "JMSTimestamp":
        return ("number", message.timestamp_ms)
    if name == "JMSExpiration":
        return ("number", message.expires_ms)
    if name == "JMSDeliveryMode":
        return ("text", "PERSISTENT" if message.persistent else "NON_PERSISTENT")
    header = {"JMSType": "type", "JMSCorrelationID": "correlation-id"}.get(name, name)
    if header in message.headers:
        return ("text", message.headers[header])
    return None


def as_number(value: Value) -> int | float | None:
    if value is None:
        return None
    tag, v = value
    if tag == "number":
        assert isinstance(v, int | float)
        return v
    if tag == "text":
        assert isinstance(v, str)
        return read_number(v)
    return None


def as_boolean(value: Value) -> bool | None:
    if value is None:
        return None
    tag, v = value
    if tag == "boolean":
        assert isinstance(v, bool)
        return v
    if tag == "text":
        assert isinstance(v, str)
        return read_boolean(v)
    return None


def truth(value: Value) -> bool | None:
    """A value used as a condition."""
    return as_boolean(value)


def compare(op: str, left: Value, right: Value) -> bool | None:
    if left is None or right is None:
        return None
    tags = {left[0], right[0]}
    a: Any
    b: Any
    if tags <= {"text", "string"}:
        a, b = left[1], right[1]
    elif "number" in tags and tags <= {"number", "text"}:
        a, b = as_number(left), as_number(right)
    elif "boolean" in tags and tags <= {"boolean", "text"}:
        if op not in ("=", "<>"):
            return None
        a, b = as_boolean(left), as_boolean(right)
    else:
        return None
    if a is None or b is None:
        return None
    if op == "=":
        return bool(a == b)
    if op == "<>":
        return bool(a != b)
    if op == "<":
        return bool(a < b)
    if op == "<=":
        return bool(a <= b)
    if op == ">":
        return bool(a > b)
    return bool(a >= b)


def and3(values: list[bool | None]) -> bool | None:
    if False in values:
        return False
    return None if None in values else True


def or3(values: list[bool | None]) -> bool | None:
    if True in values:
        return True
    return None if None in values else False


def not3(value: bool | None) -> bool | None:
    return None if value is None else not value


def boolean(value: bool | None) -> Value:
    return None if value is None else ("boolean", value)


def like(text: str, pattern: str, escape: str | None) -> bool:
    """SQL LIKE by dynamic programming over (pattern position, text position)."""
    parts: list[tuple[str, str]] = []  # ("char", c), ("one", ""), ("any", "")
    i = 0
    while i < len(pattern):
        c = pattern[i]
        # ActiveMQ's reading: the escape escapes only %, _ and itself.
        if c == escape and i + 1 < len(pattern) and pattern[i + 1] in "%_" + c:
            parts.append(("char", pattern[i + 1]))
            i += 2
            continue
        parts.append(("any", "") if c == "%" else ("one", "") if c == "_" else ("char", c))
        i += 1
    # can[j]: the parts seen so far match text[:j]
    can = [True] + [False] * len(text)
    for kind, c in parts:
        new = [False] * (len(text) + 1)
        for j in range(len(text) + 1):
            if kind == "any":
                new[j] = can[j] or (j > 0 and new[j - 1])
            elif j > 0 and can[j - 1]:
                new[j] = kind == "one" or text[j - 1] == c
        can = new
    return can[len(text)]


def arithmetic(op: str, a: int | float, b: int | float) -> int | float | None:
    try:
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        return a / b
    except (ZeroDivisionError, OverflowError):
        return None


def evaluate(node: Node, message: Message) -> Value:
    if isinstance(node, StringLiteral):
        return ("string", node.value)
    if isinstance(node, NumberLiteral):
        return ("number", node.value)
    if isinstance(node, BooleanLiteral):
        return ("boolean", node.value)
    if isinstance(node, Identifier):
        return field(node.name, message)
    if isinstance(node, Unary):
        n = as_number(evaluate(node.operand, message))
        if n is None:
            return None
        return ("number", -n if node.op == "-" else n)
    if isinstance(node, Arithmetic):
        result = as_number(evaluate(node.first, message))
        for op, operand in node.rest:
            n = as_number(evaluate(operand, message))
            if result is None or n is None:
                return None
            result = arithmetic(op, result, n)
        return None if result is None else ("number", result)
    if isinstance(node, Comparison):
        left, right = evaluate(node.left, message), evaluate(node.right, message)
        return boolean(compare(node.op, left, right))
    if isinstance(node, Between):
        x = evaluate(node.operand, message)
        low, high = evaluate(node.low, message), evaluate(node.high, message)
        inside = and3([compare(">=", x, low), compare("<=", x, high)])
        return boolean(not3(inside) if node.negated else inside)
    if isinstance(node, In):
        x = evaluate(node.operand, message)
        listed: list[Value] = [
            ("string", v) if isinstance(v, str) else ("number", v) for v in node.values
        ]
        found = or3([compare("=", x, v) for v in listed])
        return boolean(not3(found) if node.negated else found)
    if isinstance(node, Like):
        x = evaluate(node.operand, message)
        if x is None or x[0] not in ("text", "string"):
            return None
        assert isinstance(x[1], str)
        matched = like(x[1], node.pattern, node.escape)
        return boolean(not matched if node.negated else matched)
    if isinstance(node, IsNull):
        null = evaluate(node.operand, message) is None
        return boolean(not null if node.negated else null)
    if isinstance(node, Not):
        return boolean(not3(truth(evaluate(node.operand, message))))
    if isinstance(node, And):
        return boolean(and3([truth(evaluate(x, message)) for x in node.operands]))
    assert isinstance(node, Or)
    return boolean(or3([truth(evaluate(x, message)) for x in node.operands]))
