"""The selector parser: the tree of every construct, precedence, n-ary chains, every error
with its column, and the nesting limit that keeps hostile text from recursing too deep."""

from __future__ import annotations

import inspect
import pickle
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from mpbroker.selector import SelectorError, compile_selector, parse_selector
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
    unparse,
)
from mpbroker.selector._parser import MAX_DEPTH
from tests.factories import make_message

a, b, c = Identifier("a"), Identifier("b"), Identifier("c")


def n(value: int | float) -> NumberLiteral:
    return NumberLiteral(value)


def s(value: str) -> StringLiteral:
    return StringLiteral(value)


@pytest.mark.parametrize(
    ("text", "tree"),
    [
        ("a", a),
        ("TRUE", BooleanLiteral(True)),
        ("false", BooleanLiteral(False)),
        ("a = 'x'", Comparison("=", a, s("x"))),
        ("'x' <> a", Comparison("<>", s("x"), a)),
        ("a < 1", Comparison("<", a, n(1))),
        ("a <= 1.5", Comparison("<=", a, n(1.5))),
        ("a > -957", Comparison(">", a, n(-957))),
        ("a >= +62", Comparison(">=", a, n(62))),
        ("a = b", Comparison("=", a, b)),
        ("a = TRUE", Comparison("=", a, BooleanLiteral(True))),
        ("a BETWEEN 1 AND 2", Between(a, n(1), n(2))),
        ("a NOT BETWEEN b AND c + 1", Between(a, b, Arithmetic(c, (("+", n(1)),)), True)),
        ("a IN ('x')", In(a, ("x",))),
        ("a IN ('x', 5, -2, +1.5, 'it''s')", In(a, ("x", 5, -2, 1.5, "it's"))),
        ("a NOT IN (1)", In(a, (1,), True)),
        ("a LIKE 'x%'", Like(a, "x%")),
        ("a NOT LIKE '_'", Like(a, "_", None, True)),
        ("a LIKE 'x!%' ESCAPE '!'", Like(a, "x!%", "!")),
        ("a like 'x' escape '%'", Like(a, "x", "%")),
        ("a IS NULL", IsNull(a)),
        ("a is not null", IsNull(a, True)),
        ("NOT a", Not(a)),
        ("NOT NOT a", Not(Not(a))),
        ("-a = 1", Comparison("=", Unary("-", a), n(1))),
        ("+a = 1", Comparison("=", Unary("+", a), n(1))),
        ("- -a = 1", Comparison("=", Unary("-", Unary("-", a)), n(1))),
        ("- -5 = a", Comparison("=", n(5), a)),
        ("-(5) = a", Comparison("=", n(-5), a)),
        ("a + 1 * 2 = 3", Comparison("=", Arithmetic(a, (("+", Arithmetic(n(1), (("*", n(2)),))),)), n(3))),
        ("a - b + c = 0", Comparison("=", Arithmetic(a, (("-", b), ("+", c))), n(0))),
        ("a / b * c = 0", Comparison("=", Arithmetic(a, (("/", b), ("*", c))), n(0))),
        ("(a - b) - c = 0", Comparison("=", Arithmetic(Arithmetic(a, (("-", b),)), (("-", c),)), n(0))),
        ("a - (b - c) = 0", Comparison("=", Arithmetic(a, (("-", Arithmetic(b, (("-", c),))),)), n(0))),
        ("a * -b = 0", Comparison("=", Arithmetic(a, (("*", Unary("-", b)),)), n(0))),
        ("((a))", a),
        ("(a = 1) = (b = 2)", Comparison("=", Comparison("=", a, n(1)), Comparison("=", b, n(2)))),
        ("'x' LIKE 'x'", Like(s("x"), "x")),
        ("a + 1 IS NULL", IsNull(Arithmetic(a, (("+", n(1)),)))),
    ],
)  # fmt: skip
def test_each_construct_parses_to_its_tree(text: str, tree: Node) -> None:
    assert parse_selector(text) == tree


def test_precedence_or_then_and_then_not_then_comparisons() -> None:
    x, y, z = (Comparison("=", name, n(1)) for name in (a, b, c))
    assert parse_selector("a = 1 OR b = 1 AND c = 1") == Or((x, And((y, z))))
    assert parse_selector("a = 1 AND b = 1 OR c = 1") == Or((And((x, y)), z))
    assert parse_selector("NOT a = 1 AND b = 1") == And((Not(x), y))
    assert parse_selector("NOT (a = 1 AND b = 1)") == Not(And((x, y)))
    assert parse_selector("a = 1 AND (b = 1 OR c = 1)") == And((x, Or((y, z))))
    assert parse_selector("a BETWEEN 1 AND 2 AND b = 1") == And((Between(a, n(1), n(2)), y))
    assert parse_selector("a = 1 AND NOT b = 1 OR NOT NOT c = 1") == Or(
        (And((x, Not(y))), Not(Not(z)))
    )


def test_chains_of_one_operator_are_one_n_ary_node() -> None:
    terms = [Comparison("=", a, n(i)) for i in range(5)]
    assert parse_selector(" OR ".join(f"a = {i}" for i in range(5))) == Or(tuple(terms))
    assert parse_selector(" AND ".join(f"a = {i}" for i in range(5))) == And(tuple(terms))
    # Parentheses keep their grouping: (x OR y) OR z is not flattened.
    assert parse_selector("(a = 0 OR a = 1) OR a = 2") == Or((Or(tuple(terms[:2])), terms[2]))


def test_nodes_know_the_column_they_start_at() -> None:
    tree = parse_selector("x = 1 AND NOT  y LIKE 'a' OR -z > 2")
    assert isinstance(tree, Or) and tree.column == 1
    conjunction, negative = tree.operands
    assert isinstance(conjunction, And) and isinstance(negative, Comparison)
    assert [op.column for op in conjunction.operands] == [1, 11]
    assert negative.column == 30 and negative.left.column == 30
    assert isinstance(negative.left, Unary) and negative.left.operand.column == 31


def test_keywords_in_any_case() -> None:
    assert parse_selector("a not between 1 and 2 or b Is Not Null") == Or(
        (Between(a, n(1), n(2), True), IsNull(b, True))
    )


@pytest.mark.parametrize(
    ("text", "column", "problem"),
    [
        ("", 1, "the selector is empty"),
        ("   ", 1, "the selector is empty"),
        ("color = 'red' AND", 18, "expected an expression after AND"),
        ("color = 'red' AND   ", 21, "expected an expression after AND"),
        ("color = 'red' OR", 17, "expected an expression after OR"),
        ("NOT", 4, "expected an expression after NOT"),
        ("a =", 4, "expected an expression after '='"),
        ("a = )", 5, "expected an expression after '=', found ')'"),
        ("a + * 2 = 1", 5, "expected an expression after '+', found '*'"),
        ("AND a", 1, "expected an expression, found AND"),
        ("()", 2, "expected an expression after '(', found ')'"),
        ("(a = 1", 7, "expected ')' to close the '(' at column 1"),
        ("((a = 1) AND b", 15, "expected ')' to close the '(' at column 1"),
        ("(a = 1 b", 8, "expected ')' to close the '(' at column 1, found identifier b"),
        ("a = 1)", 6, "unexpected ')' with no '(' to close"),
        ("a = 1 b = 2", 7, "unexpected identifier b"),
        ("a = 1 'x'", 7, "unexpected string 'x'"),
        ("a = 1 ESCAPE 'x'", 7, "unexpected ESCAPE"),
        ("a = b = c", 7, "comparisons cannot be chained (=); join them with AND"),
        ("1 < a < 3", 7, "comparisons cannot be chained (<); join them with AND"),
        ("a = 1 IS NULL", 7, "comparisons cannot be chained (IS); join them with AND"),
        ("a LIKE 'x' LIKE 'y'", 12, "comparisons cannot be chained (LIKE); join them with AND"),
        ("a BETWEEN 1 AND 2 = 3", 19, "comparisons cannot be chained (=); join them with AND"),
        ("a IN (1) NOT IN (2)", 10, "comparisons cannot be chained (NOT); join them with AND"),
        ("a NOT = 1", 7, "expected LIKE, BETWEEN or IN after NOT, found '='"),
        ("a NOT", 6, "expected LIKE, BETWEEN or IN after NOT"),
        ("a BETWEEN 1 OR 2", 13, "expected AND between the bounds of BETWEEN, found OR"),
        ("a BETWEEN 1", 12, "expected AND between the bounds of BETWEEN"),
        ("a BETWEEN 1 AND", 16, "expected an expression after AND"),
        ("a IN 1", 6, "expected '(' after IN, found number 1"),
        ("a IN ()", 7, "expected a string or a number in the IN list, found ')'"),
        ("a IN (b)", 7, "expected a string or a number in the IN list, found identifier b"),
        ("a IN (TRUE)", 7, "expected a string or a number in the IN list, found TRUE"),
        ("a IN (-'x')", 8, "expected a string or a number in the IN list, found string 'x'"),
        ("a IN ('x' 'y')", 11, "expected ',' or ')' in the IN list, found string 'y'"),
        ("a IN ('x',", 11, "expected a string or a number in the IN list"),
        ("a IN ('x'", 10, "expected ',' or ')' in the IN list"),
        ("a LIKE b", 8, "expected a string pattern after LIKE, found identifier b"),
        ("a LIKE 5", 8, "expected a string pattern after LIKE, found number 5"),
        ("a LIKE 'x' ESCAPE", 18, "expected a string after ESCAPE"),
        ("a LIKE 'x' ESCAPE '!!'", 19, "the ESCAPE string must be one character, not '!!'"),
        ("a LIKE 'x' ESCAPE ''", 19, "the ESCAPE string must be one character, not ''"),
        ("a LIKE 'x' ESCAPE ''''''", 19, "the ESCAPE string must be one character, not ''''''"),
        ("a IS 5", 6, "expected NULL or NOT NULL after IS, found number 5"),
        ("a IS NOT TRUE", 10, "expected NULL after IS NOT, found TRUE"),
        ("a IS", 5, "expected NULL or NOT NULL after IS"),
        ("a = NULL", 5, "NULL can only be tested, with IS NULL or IS NOT NULL"),
        ("NULL IS NULL", 1, "NULL can only be tested, with IS NULL or IS NOT NULL"),
        ("5", 1, "expected a condition, found a number"),
        ("'x'", 1, "expected a condition, found a string"),
        ("a + 1", 1, "expected a condition, found a number"),
        ("NOT 5", 5, "expected a condition, found a number"),
        ("a = 1 AND 'x'", 11, "expected a condition, found a string"),
        ("'x' OR a", 1, "expected a condition, found a string"),
        ("-TRUE = a", 2, "expected a number, found a condition"),
        ("-'x' = a", 2, "expected a number, found a string"),
        ("(a = 1) + 2 = 3", 2, "expected a number, found a condition"),
        ("a * 'x' = 3", 5, "expected a number, found a string"),
        ("a = 'red", 5, "unterminated string: no closing quote"),
        ("a = 1 # 2", 7, "unexpected character '#'"),
    ],
)
def test_every_error_names_its_problem_and_column(text: str, column: int, problem: str) -> None:
    with pytest.raises(SelectorError) as caught:
        parse_selector(text)
    error = caught.value
    assert (error.column, error.problem) == (column, problem)
    assert str(error) == f"selector error at column {column}: {problem}"
    with pytest.raises(SelectorError):
        compile_selector(text)


def test_a_selector_error_is_a_value_error_and_survives_pickling() -> None:
    error = SelectorError(15, "expected an expression after AND")
    assert isinstance(error, ValueError)
    assert str(error) == "selector error at column 15: expected an expression after AND"
    again = pickle.loads(pickle.dumps(error))
    assert (again.column, again.problem, str(again)) == (15, error.problem, str(error))


# -- nesting ----------------------------------------------------------------------------------


def parens(depth: int) -> str:
    return "(" * depth + "a" + ")" * depth


@pytest.mark.parametrize(
    ("make", "levels", "column_of_excess"),
    [
        (parens, MAX_DEPTH, MAX_DEPTH + 1),
        (lambda d: "NOT " * d + "a", MAX_DEPTH, 4 * MAX_DEPTH + 1),
        (lambda d: "-" * d + "a = 1", MAX_DEPTH, MAX_DEPTH + 1),
        # Two levels each: NOT and the parenthesis.
        (lambda d: "NOT (" * d + "a" + ")" * d, MAX_DEPTH // 2, 5 * MAX_DEPTH // 2 + 1),
    ],
)
def test_nesting_is_capped_with_an_error_that_names_the_limit(
    make: Callable[[int], str], levels: int, column_of_excess: int
) -> None:
    parse_selector(make(levels))
    with pytest.raises(SelectorError) as caught:
        parse_selector(make(levels + 1))
    assert caught.value.column == column_of_excess
    assert caught.value.problem == (
        f"nested too deeply: more than {MAX_DEPTH} levels of parentheses, NOT and signs"
    )


@pytest.mark.parametrize(
    "text", [parens(4096)[:4096], "(" * 4096, "NOT " * 1024, "-" * 4095 + "a", "- (" * 1365]
)
def test_hostile_nesting_is_a_selector_error_not_a_recursion_error(text: str) -> None:
    with pytest.raises(SelectorError, match="nested too deeply"):
        parse_selector(text)


@contextmanager
def frames_left(count: int) -> Iterator[None]:
    """Lets only `count` more frames be used below the caller."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + count)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def deepest(level: Callable[[str], str], innermost: str, *, levels_each: int) -> str:
    """`innermost` inside as many `level`s as the limit allows; each takes `levels_each`."""
    text = innermost
    for _ in range(MAX_DEPTH // levels_each):
        text = level(text)
    return text


DEEPEST = [
    # Every parenthesis opens an OR of an AND of a comparison: the most nodes per level.
    deepest(lambda inner: f"x OR y AND ({inner}) = z", "a = 1", levels_each=1),
    deepest(lambda inner: f"(x OR y AND ({inner}) = z)", "a = 1", levels_each=2),
    deepest(lambda inner: f"x OR y AND NOT ({inner})", "a = 1", levels_each=2),
    # Arithmetic: + and * nodes and a sign in each level.
    "a = " + deepest(lambda inner: f"1 + 2 * ({inner})", "b", levels_each=1),
    "a = " + deepest(lambda inner: f"-(1 + 2 * {inner})", "b", levels_each=2),
    "a = " + deepest(lambda inner: f"1 + 2 * -{inner}", "b", levels_each=1),
]


@pytest.mark.parametrize("text", DEEPEST)
def test_the_deepest_selectors_parse_compile_and_run_in_600_frames(text: str) -> None:
    assert len(text) <= 4096
    message = make_message(headers={"a": "1", "b": "2"})
    with frames_left(600):
        selector = compile_selector(text)
        selector.matches(message)
        unparse(selector.root)


def test_a_long_flat_or_chain_is_one_node_and_runs_without_deep_recursion() -> None:
    text = " OR ".join(f"a = {i}" for i in range(700))
    assert len(text) > 4096
    tree = parse_selector(text)
    assert isinstance(tree, Or) and len(tree.operands) == 700
    with frames_left(100):
        selector = compile_selector(text)
        assert selector.matches(make_message(headers={"a": "699"}))
        assert not selector.matches(make_message(headers={"a": "700"}))
    and_text = " AND ".join(f"NOT a = 'x{i}'" for i in range(500))
    with frames_left(100):
        assert compile_selector(and_text).matches(make_message(headers={"a": "y"}))
        assert not compile_selector(and_text).matches(make_message(headers={"a": "x7"}))


# -- writing a tree back ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "a = 1 OR b = 2 AND NOT c = 3",
        "a - (b - c) * -d / +e >= 1E999",
        "x NOT LIKE '50!%' ESCAPE '!' AND y IN ('it''s', -1, 2.5)",
        "(a = 1) = FALSE OR z IS NOT NULL OR p NOT BETWEEN -1 AND 0.1",
        "- -a = -9223372036854775808",
    ],
)
def test_unparse_writes_text_that_parses_back_to_the_same_tree(text: str) -> None:
    tree = parse_selector(text)
    assert parse_selector(unparse(tree)) == tree


def test_unparse_puts_operands_in_parentheses() -> None:
    assert unparse(parse_selector("a = 1 OR b = -2 AND NOT c")) == (
        "(a = 1) OR ((b = (-2)) AND (NOT c))"
    )
