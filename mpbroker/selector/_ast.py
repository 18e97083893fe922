"""The parsed selector: frozen nodes, and `unparse` to write one back as selector text.

Every node keeps the column its text starts at, for error messages; it takes no part in
equality, so ``parse_selector(unparse(node)) == node``. AND and OR chains are single n-ary
nodes, as are chains of + and - or of * and /: a selector of a thousand ORs is one node with
a thousand operands, not a thousand nested ones. Parentheses leave no node of their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = [
    "And",
    "Arithmetic",
    "Between",
    "BooleanLiteral",
    "Comparison",
    "Identifier",
    "In",
    "IsNull",
    "Like",
    "Node",
    "Not",
    "NumberLiteral",
    "Or",
    "StringLiteral",
    "Unary",
    "unparse",
]


@dataclass(frozen=True, slots=True)
class StringLiteral:
    """``'text'``."""

    value: str
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class NumberLiteral:
    """``57`` (an int: exact) or ``5.7``, ``7E3`` (a float: approximate). A sign written
    before a literal is folded into it: ``-5`` is ``NumberLiteral(-5)``."""

    value: int | float
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class BooleanLiteral:
    """``TRUE`` or ``FALSE``."""

    value: bool
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Identifier:
    """A JMS header field (``JMSPriority``) or a message header (``color``)."""

    name: str
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Unary:
    """``-x`` or ``+x`` of anything but a literal."""

    op: str
    operand: Node
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Arithmetic:
    """``first op1 x1 op2 x2 ...``, evaluated left to right; the ops are all of one
    precedence (``+ -`` or ``* /``)."""

    first: Node
    rest: tuple[tuple[str, Node], ...]
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Comparison:
    """``left op right``, op one of ``= <> < <= > >=``."""

    op: str
    left: Node
    right: Node
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Between:
    """``operand [NOT] BETWEEN low AND high``: ``operand >= low AND operand <= high``."""

    operand: Node
    low: Node
    high: Node
    negated: bool = False
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class In:
    """``operand [NOT] IN ('a', 5, ...)``: `operand` equal to one of the literals."""

    operand: Node
    values: tuple[str | int | float, ...]
    negated: bool = False
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Like:
    """``operand [NOT] LIKE 'pattern' [ESCAPE 'c']`` (`escape` None without ESCAPE)."""

    operand: Node
    pattern: str
    escape: str | None = None
    negated: bool = False
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class IsNull:
    """``operand IS [NOT] NULL``."""

    operand: Node
    negated: bool = False
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Not:
    """``NOT operand``."""

    operand: Node
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class And:
    """``a AND b AND ...`` (two operands or more)."""

    operands: tuple[Node, ...]
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Or:
    """``a OR b OR ...`` (two operands or more)."""

    operands: tuple[Node, ...]
    column: int = field(default=0, compare=False)


Node = (
    StringLiteral
    | NumberLiteral
    | BooleanLiteral
    | Identifier
    | Unary
    | Arithmetic
    | Comparison
    | Between
    | In
    | Like
    | IsNull
    | Not
    | And
    | Or
)

_ATOMS = (StringLiteral, NumberLiteral, BooleanLiteral, Identifier)


def _string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _number(value: int | float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):  # 1E999 parses to infinity: write it back the same way
        return "1E999" if value > 0 else "-1E999"
    return repr(value)  # the shortest text that reads back as the same float: 0.1, 1e+16


def _literal(value: str | int | float) -> str:
    return _string(value) if isinstance(value, str) else _number(value)


def _operand(node: Node) -> str:
    """`node` as an operand of an operator: in parentheses unless it is a single token."""
    if isinstance(node, _ATOMS) and not (isinstance(node, NumberLiteral) and node.value < 0):
        return unparse(node)
    return f"({unparse(node)})"


def unparse(node: Node) -> str:
    """`node` as selector text that parses back to an equal node (with parentheses around
    every operand that is not a single token, so precedence never has to be thought of)."""
    match node:
        case StringLiteral(value):
            return _string(value)
        case NumberLiteral(value):
            return _number(value)
        case BooleanLiteral(value):
            return "TRUE" if value else "FALSE"
        case Identifier(name):
            return name
        case Unary(op, operand):
            return f"{op}{_operand(operand)}"
        case Arithmetic(first, rest):
            return " ".join([_operand(first), *(f"{op} {_operand(x)}" for op, x in rest)])
        case Comparison(op, left, right):
            return f"{_operand(left)} {op} {_operand(right)}"
        case Between(operand, low, high, negated):
            word = "NOT BETWEEN" if negated else "BETWEEN"
            return f"{_operand(operand)} {word} {_operand(low)} AND {_operand(high)}"
        case In(operand, values, negated):
            word = "NOT IN" if negated else "IN"
            return f"{_operand(operand)} {word} ({', '.join(map(_literal, values))})"
        case Like(operand, pattern, escape, negated):
            word = "NOT LIKE" if negated else "LIKE"
            text = f"{_operand(operand)} {word} {_string(pattern)}"
            return text if escape is None else f"{text} ESCAPE {_string(escape)}"
        case IsNull(operand, negated):
            return f"{_operand(operand)} IS {'NOT NULL' if negated else 'NULL'}"
        case Not(operand):
            return f"NOT {_operand(operand)}"
        case And(operands):
            return " AND ".join(map(_operand, operands))
        case Or(operands):
            return " OR ".join(map(_operand, operands))
