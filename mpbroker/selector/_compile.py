"""AST -> closures: a selector is compiled once, and `Selector.matches` calls only closures.

Every sub-expression has a kind fixed by its node (`_kind`): a condition (True, False, or
None for UNKNOWN), a number (int or float, None for UNKNOWN), a string literal, or a
header's text (str, None when the header is missing). An operator's operand kinds decide,
once, how it compares or computes: text against a number is read as a number, against a
boolean as a boolean, against a string as text (see `_values`); a string literal is never
converted, so ``'5' = 5`` is UNKNOWN. SQL's three-valued logic follows: a message is selected
only when the whole selector is TRUE.

Because a selected message needs TRUE and FALSE and UNKNOWN both mean "not selected" at the
top, `matches` is built from two-valued tests where it can (`_test`): ``color = 'red'`` is
``headers.get("color") == "red"``, an AND of such equalities one dict-items comparison.
Three-valued closures (`_cond`) are used below NOT and wherever UNKNOWN can be observed.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from mpbroker.records import Message

from . import _values
from ._ast import (
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
from ._parser import parse_selector

__all__ = ["Selector", "compile_selector", "like_matcher"]

# A compiled sub-expression: a value (None: NULL/UNKNOWN), a condition, a top-level test.
Getter = Callable[[Message], Any]
Cond = Callable[[Message], bool | None]
Test = Callable[[Message], bool]

# Kinds of sub-expression (see the module docstring).
_BOOL: Final = "boolean"
_NUM: Final = "number"
_STR: Final = "string literal"
_TEXT: Final = "text"

_COMPARE: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
# `c op x` is `x swapped[op] c`: used to put a constant on the right.
_SWAPPED: Final = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_ARITHMETIC: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,  # floating-point division, also of two ints (JMS: 123 / 2 = 61.5)
}


@dataclass(frozen=True, eq=False, slots=True)
class Selector:
    """A compiled selector. ``matches(message)`` is True only when the selector is TRUE for
    the message (FALSE and UNKNOWN both leave it out). `root` is the parsed selector, whose
    top-level AND conjuncts `SelectorIndex` looks into."""

    text: str
    matches: Callable[[Message], bool]
    root: Node

    @property
    def conjuncts(self) -> tuple[Node, ...]:
        """The operands of a top-level AND, or the whole selector if it is not an AND."""
        return self.root.operands if isinstance(self.root, And) else (self.root,)


# Once per text: many subscriptions share a selector (every consumer of a worker pool, a
# re-registration after a pipeline restart), and compiling costs ~20 us. A Selector is
# immutable, so sharing one is safe; errors are not cached. Bounded small: a 4 KiB
# selector compiles to tens of KiB, and live subscriptions hold their own anyway.
@functools.lru_cache(maxsize=256)
def compile_selector(text: str) -> Selector:
    """Parses and compiles selector `text`; raises `SelectorError` if it does not parse
    (an empty or blank text included: callers treat those as "no selector" themselves)."""
    root = parse_selector(text)
    return Selector(text, _test(root), root)


# -- kinds and constants -----------------------------------------------------------------


def _kind(node: Node) -> str:
    if isinstance(node, Identifier):
        return _NUM if _values.is_numeric(node.name) else _TEXT
    if isinstance(node, StringLiteral):
        return _STR
    if isinstance(node, NumberLiteral | Unary | Arithmetic):
        return _NUM
    return _BOOL


def _header(node: Node) -> str | None:
    """The STOMP header `node` reads if it is an identifier of one, else None."""
    return _values.header_of(node.name) if isinstance(node, Identifier) else None


def _domain(left: str, right: str) -> str | None:
    """What two operands of these kinds are compared as: text, numbers, booleans, or None
    when they never compare (a string literal with a number, a number with a boolean...)."""
    kinds = {left, right}
    if kinds <= {_STR, _TEXT}:
        return _STR
    if _NUM in kinds and kinds <= {_NUM, _TEXT}:
        return _NUM
    if _BOOL in kinds and kinds <= {_BOOL, _TEXT}:
        return _BOOL
    return None


@dataclass(frozen=True, slots=True)
class _Operand:
    """An operand read in a domain: a getter, or (`get` None) the constant `value`."""

    get: Getter | None
    value: Any = None


def _const(value: Any) -> Getter:
    return lambda message: value


def _unknown(message: Message) -> None:
    return None


def _operand(node: Node, domain: str) -> _Operand:
    """`node`'s value read as a `domain` value (`_domain` guarantees it can be)."""
    if isinstance(node, StringLiteral | NumberLiteral | BooleanLiteral):
        return _Operand(None, node.value)
    if domain == _NUM:
        return _Operand(_number(node))
    if domain == _BOOL:
        return _Operand(_cond(node))
    return _Operand(_raw(node))


# -- values ------------------------------------------------------------------------------


def _raw(node: Node) -> Getter:
    """`node`'s value as it is: text for a header, a number, a condition's truth value."""
    if isinstance(node, Identifier):
        return _values.reader(node.name)
    if isinstance(node, StringLiteral | NumberLiteral | BooleanLiteral):
        return _const(node.value)
    if isinstance(node, Unary | Arithmetic):
        return _number(node)
    return _cond(node)


def _number(node: Node) -> Getter:
    """`node` as a number (None: NULL or not a number). The parser saw to it that `node`
    is a number literal, arithmetic or an identifier."""
    if isinstance(node, NumberLiteral):
        return _const(node.value)
    if isinstance(node, Identifier):
        if _values.is_numeric(node.name):
            return _values.reader(node.name)
        return _text_as(node.name, _values.to_number)
    if isinstance(node, Unary):
        return _unary(node)
    if isinstance(node, Arithmetic):
        return _arithmetic(node)
    return _unknown  # a string literal or a condition (the parser refuses both)


def _text_as(name: str, convert: Callable[[str], Any]) -> Getter:
    """Identifier `name`'s text converted, None if missing or not convertible."""
    header = _values.header_of(name)
    if header is None:
        read = _values.reader(name)

        def field_as(message: Message) -> Any:
            return convert(str(read(message)))

        return field_as

    def header_as(message: Message) -> Any:
        text = message.headers.get(header)
        return None if text is None else convert(text)

    return header_as


def _unary(node: Unary) -> Getter:
    get = _number(node.operand)
    if node.op == "+":
        return get

    def negate(message: Message) -> Any:
        value = get(message)
        return None if value is None else -value

    return negate


def _arithmetic(node: Arithmetic) -> Getter:
    first = _number(node.first)
    rest = [(_ARITHMETIC[op], _number(x)) for op, x in node.rest]

    def arithmetic(message: Message) -> Any:
        result = first(message)
        if result is None:
            return None
        try:
            for op, get in rest:
                value = get(message)
                if value is None:
                    return None
                result = op(result, value)
        except ArithmeticError:  # division by zero; an int too large for a float
            return None
        return result

    return arithmetic


# -- three-valued conditions ---------------------------------------------------------------


def _cond(node: Node) -> Cond:
    """`node` as a condition: True, False or None (UNKNOWN)."""
    match node:
        case BooleanLiteral(value):
            return _const(value)
        case Identifier(name):
            if _values.is_numeric(name):
                return _unknown
            return _text_as(name, _values.to_boolean)
        case Comparison(op, left, right):
            return _comparison(op, left, right)
        case Between(operand, low, high, negated):
            return _negated(_between(operand, low, high), negated)
        case In(operand, values, negated):
            return _negated(_in(operand, values), negated)
        case Like(operand, pattern, escape, negated):
            return _negated(_like(operand, pattern, escape), negated)
        case IsNull(operand, negated):
            return _is_null(operand, negated)
        case Not(operand):
            return _negated(_cond(operand), True)
        case And(operands):
            return _and([_cond(x) for x in operands])
        case Or(operands):
            return _or([_cond(x) for x in operands])
    return _unknown  # a number or a string literal (the parser refuses both)


def _negated(cond: Cond, negated: bool) -> Cond:
    if not negated:
        return cond

    def not_(message: Message) -> bool | None:
        value = cond(message)
        return None if value is None else not value

    return not_


def _and(conds: list[Cond]) -> Cond:
    def and_(message: Message) -> bool | None:
        result: bool | None = True
        for cond in conds:
            value = cond(message)
            if value is False:
                return False
            if value is None:
                result = None
        return result

    return and_


def _or(conds: list[Cond]) -> Cond:
    def or_(message: Message) -> bool | None:
        result: bool | None = False
        for cond in conds:
            value = cond(message)
            if value is True:
                return True
            if value is None:
                result = None
        return result

    return or_


def _comparison(op: str, left: Node, right: Node) -> Cond:
    domain = _domain(_kind(left), _kind(right))
    if domain is None or (domain == _BOOL and op not in ("=", "<>")):
        return _unknown  # booleans are only equal or not; other kinds never compare
    a, b = _operand(left, domain), _operand(right, domain)
    if a.get is None and b.get is None:
        return _const(_COMPARE[op](a.value, b.value))
    if a.get is None:  # the constant on the right
        a, b, op, left = b, a, _SWAPPED[op], right
    get = a.get
    assert get is not None
    if b.get is None:
        return _against_constant(op, left, get, b.value, domain)
    compare = _COMPARE[op]
    other = b.get

    def compares(message: Message) -> bool | None:
        value = get(message)
        if value is None:
            return None
        value2 = other(message)
        return None if value2 is None else compare(value, value2)

    return compares


def _against_constant(op: str, node: Node, get: Getter, constant: Any, domain: str) -> Cond:
    """``node op constant``, `get` reading `node` in `domain`."""
    compare = _COMPARE[op]
    header = _header(node)
    if header is not None and domain == _STR:  # the hot case: a header against a string
        if op == "=":

            def header_equals(message: Message) -> bool | None:
                text = message.headers.get(header)
                return None if text is None else text == constant

            return header_equals

        def header_compares(message: Message) -> bool | None:
            text = message.headers.get(header)
            return None if text is None else compare(text, constant)

        return header_compares
    if header is not None and domain == _NUM:  # the next: a header against a number
        to_number = _values.to_number

        def header_number_compares(message: Message) -> bool | None:
            text = message.headers.get(header)
            if text is None:
                return None
            number = to_number(text)
            return None if number is None else compare(number, constant)

        return header_number_compares

    def compares_constant(message: Message) -> bool | None:
        value = get(message)
        return None if value is None else compare(value, constant)

    return compares_constant


def _between(operand: Node, low: Node, high: Node) -> Cond:
    """``operand >= low AND operand <= high``."""
    kind = _kind(operand)
    domain = _domain(kind, _kind(low))
    if (
        isinstance(low, StringLiteral | NumberLiteral)
        and isinstance(high, StringLiteral | NumberLiteral)
        and domain in (_STR, _NUM)
        and domain == _domain(kind, _kind(high))
        and not isinstance(operand, StringLiteral | NumberLiteral)  # (rare: the general way)
    ):
        # Both bounds constants of the operand's domain: one read, one chained comparison.
        get = _operand(operand, domain).get
        assert get is not None
        lo, hi = low.value, high.value

        def between(message: Message) -> bool | None:
            value = get(message)
            return None if value is None else lo <= value <= hi

        return between
    return _and([_comparison(">=", operand, low), _comparison("<=", operand, high)])


def _in(operand: Node, values: tuple[str | int | float, ...]) -> Cond:
    """``operand = v1 OR operand = v2 ...``, by set lookups."""
    strings = frozenset(v for v in values if isinstance(v, str))
    numbers = frozenset(v for v in values if not isinstance(v, str))
    kind = _kind(operand)
    if kind == _STR:
        assert isinstance(operand, StringLiteral)
        return _const(True if operand.value in strings else None if numbers else False)
    if kind == _NUM:
        get = _number(operand)
        not_found = None if strings else False  # a number against a string is UNKNOWN

        def number_in(message: Message) -> bool | None:
            value = get(message)
            if value is None:
                return None
            return True if value in numbers else not_found

        return number_in
    if kind == _BOOL:
        return _unknown  # a boolean against strings and numbers: UNKNOWN whatever it is
    read = _raw(operand)
    if not numbers:

        def text_in(message: Message) -> bool | None:
            text = read(message)
            return None if text is None else text in strings

        return text_in
    to_number = _values.to_number

    def text_or_number_in(message: Message) -> bool | None:
        text = read(message)
        if text is None:
            return None
        if text in strings:
            return True
        number = to_number(text)
        if number is None:
            return None
        return number in numbers

    return text_or_number_in


def _like(operand: Node, pattern: str, escape: str | None) -> Cond:
    matcher = like_matcher(pattern, escape)
    kind = _kind(operand)
    if kind == _STR:
        assert isinstance(operand, StringLiteral)
        return _const(matcher(operand.value))
    if kind != _TEXT:
        return _unknown  # LIKE is for text only
    read = _raw(operand)

    def like(message: Message) -> bool | None:
        text = read(message)
        return None if text is None else matcher(text)

    return like


def _is_null(operand: Node, negated: bool) -> Cond:
    read = _raw(operand)
    if negated:
        return lambda message: read(message) is not None
    return lambda message: read(message) is None


def like_matcher(pattern: str, escape: str | None) -> Callable[[str], bool]:
    """Whether a text matches LIKE `pattern`: ``%`` any run of characters, ``_`` any one.

    The escape character makes the next character literal when that is ``%``, ``_`` or the
    escape character itself; anywhere else (before another character, or at the very end)
    it is an ordinary character of the pattern, a wildcard if it is ``%`` or ``_``: ActiveMQ
    and Artemis read it so (``'_D7xl__' ESCAPE '_'`` matches ``XD7xl_``). Plain patterns become string tests (``==``, startswith,
    ``in``); the rest a regular expression of `re.escape`d literals, whose ``%`` after the
    first are atomic lazy groups: each run between two ``%`` has a fixed length, so its
    leftmost place is always right, and no pattern can make the match backtrack badly.
    """
    # The pattern as runs between its % wildcards; in a run, None is a _ wildcard.
    runs: list[list[str | None]] = [[]]
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == escape and i + 1 < len(pattern) and pattern[i + 1] in ("%", "_", escape):
            runs[-1].append(pattern[i + 1])
            i += 2
            continue
        if char == "%":
            runs.append([])
        else:
            runs[-1].append(None if char == "_" else char)
        i += 1
    if all(None not in run for run in runs):
        texts = ["".join(filter(None, run)) for run in runs]  # (no None in them: no _)
        if len(texts) == 1:
            return texts[0].__eq__
        first, *middle, last = texts
        middle = [m for m in middle if m]
        if not middle:
            least = len(first) + len(last)
            return lambda text: (
                len(text) >= least and text.startswith(first) and text.endswith(last)
            )
        if len(middle) == 1 and not first and not last:
            inner = middle[0]
            return lambda text: inner in text
    regexes = ["".join("." if c is None else re.escape(c) for c in run) for run in runs]
    if len(regexes) == 1:
        regex = regexes[0]
    else:
        first_re, *middle_re, last_re = regexes
        regex = first_re + "".join(f"(?>.*?{r})" for r in middle_re if r) + ".*" + last_re
    fullmatch = re.compile(regex, re.DOTALL).fullmatch
    return lambda text: fullmatch(text) is not None


# -- top-level tests -------------------------------------------------------------------------


def _header_equality(node: Node) -> tuple[str, str] | None:
    """(header, string) if `node` is ``header = 'string'`` (either way round)."""
    if not (isinstance(node, Comparison) and node.op == "="):
        return None
    for ident, literal in ((node.left, node.right), (node.right, node.left)):
        if isinstance(literal, StringLiteral) and (header := _header(ident)) is not None:
            return header, literal.value
    return None


def _test(node: Node) -> Test:
    """`node` as a two-valued test: True only when it is TRUE."""
    if isinstance(node, And):
        return _test_and(node.operands)
    if isinstance(node, Or):
        return _test_or(node.operands)
    if isinstance(node, Not):
        cond = _cond(node.operand)
        return lambda message: cond(message) is False
    if isinstance(node, BooleanLiteral):
        return _const(node.value)
    if (equality := _header_equality(node)) is not None:
        return _membership(equality[0], frozenset((equality[1],)))
    if isinstance(node, In) and not node.negated and all(isinstance(v, str) for v in node.values):
        in_header = _header(node.operand)
        if in_header is not None:
            return _membership(in_header, frozenset(map(str, node.values)))
    cond = _cond(node)
    return lambda message: cond(message) is True


def _test_and(operands: tuple[Node, ...]) -> Test:
    """TRUE when every operand is TRUE. ``h = 'x'`` operands together are one check that
    the message's headers include those (header, value) pairs."""
    pairs: dict[str, str] = {}
    tests: list[Test] = []
    for x in operands:
        equality = _header_equality(x)
        if equality is None:
            tests.append(_test(x))
            continue
        header, string = equality
        if pairs.setdefault(header, string) != string:
            return _const(False)  # one header equal to two different strings
    if len(pairs) == 1:
        ((header, string),) = pairs.items()
        tests.insert(0, lambda message: message.headers.get(header) == string)
    elif pairs:
        expected = pairs.items()
        tests.insert(0, lambda message: expected <= message.headers.items())
    return _all(tests)


def _test_or(operands: tuple[Node, ...]) -> Test:
    """TRUE when some operand is TRUE. ``h = 'x' OR h = 'y'`` operands on one header are
    one set lookup."""
    sets: dict[str, set[str]] = {}
    tests: list[Test] = []
    for x in operands:
        equality = _header_equality(x)
        if equality is None:
            tests.append(_test(x))
        else:
            sets.setdefault(equality[0], set()).add(equality[1])
    for header, strings in sets.items():
        tests.insert(0, _membership(header, frozenset(strings)))
    return _any(tests)


def _membership(header: str, strings: frozenset[str]) -> Test:
    if len(strings) == 1:
        (string,) = strings
        return lambda message: message.headers.get(header) == string
    return lambda message: message.headers.get(header) in strings


def _all(tests: list[Test]) -> Test:
    if len(tests) == 1:
        return tests[0]
    if len(tests) == 2:
        a, b = tests
        return lambda message: a(message) and b(message)
    if len(tests) == 3:
        a, b, c = tests
        return lambda message: a(message) and b(message) and c(message)

    def all_(message: Message) -> bool:
        # A loop, not all() over a generator: a generator costs more than it saves here.
        for test in tests:  # noqa: SIM110
            if not test(message):
                return False
        return True

    return all_


def _any(tests: list[Test]) -> Test:
    if len(tests) == 1:
        return tests[0]
    if len(tests) == 2:
        a, b = tests
        return lambda message: a(message) or b(message)

    def any_(message: Message) -> bool:
        for test in tests:  # noqa: SIM110 (as in _all)
            if test(message):
                return True
        return False

    return any_
