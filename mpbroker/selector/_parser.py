"""Selector text -> AST: a recursive-descent parser of the JMS 1.1 selector grammar.

Precedence, lowest first: OR, AND, NOT, the predicates (comparisons, [NOT] LIKE,
[NOT] BETWEEN, [NOT] IN, IS [NOT] NULL; they do not chain), + and -, * and /, unary signs.
Chains of one operator are read in a loop into one n-ary node, so only parentheses, NOT and
signs nest; their nesting is capped at `MAX_DEPTH`, which bounds this parser's recursion, the
compiler's and the compiled closures' for any text.

Besides the grammar, the parser rejects what can never be evaluated: a number or a string
where a condition is needed (``NOT 5``, ``a = 1 AND 'x'``), a condition or a string in
arithmetic (``(a = 1) + 2``, ``-'x'``). An identifier may be either: a header's text can
be a number or a boolean.
"""

from __future__ import annotations

from typing import Final

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
from ._errors import SelectorError
from ._lexer import Token, describe, tokenize

__all__ = ["MAX_DEPTH", "parse_selector"]

MAX_DEPTH: Final = 64
"""How deeply parentheses, NOT and signs may nest: far beyond any real selector, and low
enough that the deepest parse (eight frames a level), compilation and evaluation stay far
from Python's recursion limit (tests/selector/test_parser.py measures them)."""

_COMPARISONS: Final = frozenset({"=", "<>", "<", "<=", ">", ">="})
_PREDICATES: Final = frozenset({"LIKE", "BETWEEN", "IN", "IS"})
_NEGATABLE: Final = frozenset({"LIKE", "BETWEEN", "IN"})


def parse_selector(text: str) -> Node:
    """The AST of selector `text`; raises `SelectorError` if it is not a selector (an empty
    or blank text included)."""
    return _Parser(text).parse()


def _found(token: Token) -> str:
    return "" if token.kind == "end" else f", found {describe(token)}"


def _kind(node: Node) -> str:
    """What the parser knows of a node's value: ``condition``, ``number``, ``string``, or
    ``any`` for an identifier (a header's text may read as any of them)."""
    if isinstance(node, Identifier):
        return "any"
    if isinstance(node, StringLiteral):
        return "string"
    if isinstance(node, NumberLiteral | Unary | Arithmetic):
        return "number"
    return "condition"


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = tokenize(text)
        self.pos = 0
        self.depth = 0

    # -- tokens --------------------------------------------------------------------------

    @property
    def tok(self) -> Token:
        return self.tokens[self.pos]

    def advance(self) -> Token:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def at_keyword(self, word: str, offset: int = 0) -> bool:
        token = self.tokens[min(self.pos + offset, len(self.tokens) - 1)]
        return token.kind == "keyword" and token.text == word

    def at_op(self, *ops: str) -> bool:
        return self.tok.kind == "op" and self.tok.text in ops

    def enter(self, token: Token) -> None:
        """One more level of nesting, opened by `token`."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SelectorError(
                token.column,
                f"nested too deeply: more than {MAX_DEPTH} levels of parentheses, NOT and signs",
            )

    # -- kinds ---------------------------------------------------------------------------

    @staticmethod
    def condition(node: Node) -> Node:
        kind = _kind(node)
        if kind not in ("condition", "any"):
            raise SelectorError(node.column, f"expected a condition, found a {kind}")
        return node

    @staticmethod
    def number(node: Node) -> Node:
        kind = _kind(node)
        if kind not in ("number", "any"):
            raise SelectorError(node.column, f"expected a number, found a {kind}")
        return node

    # -- grammar -------------------------------------------------------------------------

    def parse(self) -> Node:
        if self.tok.kind == "end":
            raise SelectorError(1, "the selector is empty")
        node = self.or_()
        token = self.tok
        if token.kind != "end":
            if token.kind == "op" and token.text == ")":
                raise SelectorError(token.column, "unexpected ')' with no '(' to close")
            raise SelectorError(token.column, f"unexpected {describe(token)}")
        return self.condition(node)

    def or_(self) -> Node:
        first = self.and_()
        if not self.at_keyword("OR"):
            return first
        operands = [self.condition(first)]
        while self.at_keyword("OR"):
            self.advance()
            operands.append(self.condition(self.and_()))
        return Or(tuple(operands), first.column)

    def and_(self) -> Node:
        first = self.not_()
        if not self.at_keyword("AND"):
            return first
        operands = [self.condition(first)]
        while self.at_keyword("AND"):
            self.advance()
            operands.append(self.condition(self.not_()))
        return And(tuple(operands), first.column)

    def not_(self) -> Node:
        nots: list[Token] = []
        while self.at_keyword("NOT"):
            nots.append(self.advance())
            self.enter(nots[-1])
        node = self.predicate()
        if nots:
            self.condition(node)
            for token in reversed(nots):
                node = Not(node, token.column)
            self.depth -= len(nots)
        return node

    def predicate(self) -> Node:
        left = self.additive()
        token = self.tok
        node: Node
        if token.kind == "op" and token.text in _COMPARISONS:
            self.advance()
            node = Comparison(token.text, left, self.additive(), left.column)
        elif token.kind == "keyword" and (token.text in _PREDICATES or token.text == "NOT"):
            negated = token.text == "NOT"
            if negated:
                self.advance()
                if not (self.tok.kind == "keyword" and self.tok.text in _NEGATABLE):
                    raise SelectorError(
                        self.tok.column, f"expected LIKE, BETWEEN or IN after NOT{_found(self.tok)}"
                    )
            word = self.advance().text
            if word == "BETWEEN":
                node = self.between(left, negated)
            elif word == "IN":
                node = self.in_(left, negated)
            elif word == "LIKE":
                node = self.like(left, negated)
            else:
                node = self.is_null(left)
        else:
            return left
        token = self.tok
        if (token.kind == "op" and token.text in _COMPARISONS) or (
            token.kind == "keyword"
            and (
                token.text in _PREDICATES
                or (token.text == "NOT" and self.tokens[self.pos + 1].text in _NEGATABLE)
            )
        ):
            raise SelectorError(
                token.column, f"comparisons cannot be chained ({token.text}); join them with AND"
            )
        return node

    def between(self, operand: Node, negated: bool) -> Node:
        low = self.additive()
        if not self.at_keyword("AND"):
            raise SelectorError(
                self.tok.column, f"expected AND between the bounds of BETWEEN{_found(self.tok)}"
            )
        self.advance()
        return Between(operand, low, self.additive(), negated, operand.column)

    def in_(self, operand: Node, negated: bool) -> Node:
        if not self.at_op("("):
            raise SelectorError(self.tok.column, f"expected '(' after IN{_found(self.tok)}")
        self.advance()
        values: list[str | int | float] = []
        while True:
            values.append(self.in_value())
            if self.at_op(")"):
                self.advance()
                return In(operand, tuple(values), negated, operand.column)
            if not self.at_op(","):
                raise SelectorError(
                    self.tok.column, f"expected ',' or ')' in the IN list{_found(self.tok)}"
                )
            self.advance()

    def in_value(self) -> str | int | float:
        token = self.advance()
        if token.kind == "string":
            assert isinstance(token.value, str)
            return token.value
        sign = 1
        if token.kind == "op" and token.text in "+-":
            sign = -1 if token.text == "-" else 1
            token = self.advance()
        if token.kind == "number":
            assert isinstance(token.value, int | float)
            return sign * token.value
        raise SelectorError(
            token.column, f"expected a string or a number in the IN list{_found(token)}"
        )

    def like(self, operand: Node, negated: bool) -> Node:
        token = self.advance()
        if token.kind != "string":
            raise SelectorError(
                token.column, f"expected a string pattern after LIKE{_found(token)}"
            )
        assert isinstance(token.value, str)
        escape = None
        if self.at_keyword("ESCAPE"):
            self.advance()
            escape_token = self.advance()
            if escape_token.kind != "string":
                raise SelectorError(
                    escape_token.column, f"expected a string after ESCAPE{_found(escape_token)}"
                )
            assert isinstance(escape_token.value, str)
            escape = escape_token.value
            if len(escape) != 1:
                raise SelectorError(
                    escape_token.column,
                    f"the ESCAPE string must be one character, not {escape_token.text}",
                )
        return Like(operand, token.value, escape, negated, operand.column)

    def is_null(self, operand: Node) -> Node:
        negated = self.at_keyword("NOT")
        if negated:
            self.advance()
        token = self.advance()
        if not (token.kind == "keyword" and token.text == "NULL"):
            expected = "NULL after IS NOT" if negated else "NULL or NOT NULL after IS"
            raise SelectorError(token.column, f"expected {expected}{_found(token)}")
        return IsNull(operand, negated, operand.column)

    # additive and multiplicative are written out, not one function taking the operand's:
    # a level less of recursion for every parenthesis.

    def additive(self) -> Node:
        first = self.multiplicative()
        if not self.at_op("+", "-"):
            return first
        self.number(first)
        rest: list[tuple[str, Node]] = []
        while self.at_op("+", "-"):
            op = self.advance().text
            rest.append((op, self.number(self.multiplicative())))
        return Arithmetic(first, tuple(rest), first.column)

    def multiplicative(self) -> Node:
        first = self.unary()
        if not self.at_op("*", "/"):
            return first
        self.number(first)
        rest: list[tuple[str, Node]] = []
        while self.at_op("*", "/"):
            op = self.advance().text
            rest.append((op, self.number(self.unary())))
        return Arithmetic(first, tuple(rest), first.column)

    def unary(self) -> Node:
        signs: list[Token] = []
        while self.at_op("+", "-"):
            signs.append(self.advance())
            self.enter(signs[-1])
        node = self.primary()
        for sign in reversed(signs):
            if isinstance(node, NumberLiteral):  # -5 is a literal, not an operation on one
                value = -node.value if sign.text == "-" else node.value
                node = NumberLiteral(value, sign.column)
            else:
                node = Unary(sign.text, self.number(node), sign.column)
        self.depth -= len(signs)
        return node

    def primary(self) -> Node:
        token = self.tok
        if token.kind == "op" and token.text == "(":
            self.advance()
            self.enter(token)
            node = self.or_()
            if not self.at_op(")"):
                raise SelectorError(
                    self.tok.column,
                    f"expected ')' to close the '(' at column {token.column}{_found(self.tok)}",
                )
            self.advance()
            self.depth -= 1
            return node
        if token.kind == "ident":
            self.advance()
            return Identifier(token.text, token.column)
        if token.kind == "string":
            self.advance()
            assert isinstance(token.value, str)
            return StringLiteral(token.value, token.column)
        if token.kind == "number":
            self.advance()
            assert isinstance(token.value, int | float)
            return NumberLiteral(token.value, token.column)
        if token.kind == "keyword" and token.text in ("TRUE", "FALSE"):
            self.advance()
            return BooleanLiteral(token.text == "TRUE", token.column)
        if token.kind == "keyword" and token.text == "NULL":
            raise SelectorError(
                token.column, "NULL can only be tested, with IS NULL or IS NOT NULL"
            )
        if self.pos == 0:
            raise SelectorError(token.column, f"expected an expression{_found(token)}")
        after = describe(self.tokens[self.pos - 1])
        raise SelectorError(token.column, f"expected an expression after {after}{_found(token)}")
