"""Hypothesis properties: random selector ASTs, written out as text and compiled, select
exactly the messages the reference interpreter says they do; the text parses back to the
same AST; the index finds exactly the matching items; and no text makes the parser fail
with anything but a SelectorError.

The alphabets are small (three headers, a dozen values) so that comparisons often hit.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mpbroker.records import Message
from mpbroker.selector import SelectorError, SelectorIndex, compile_selector, parse_selector
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
from mpbroker.selector._compile import like_matcher
from tests.factories import make_message

from . import reference

NAMES = ["a", "b", "c", "JMSPriority", "JMSType", "JMSDeliveryMode", "JMSMessageID"]
HEADERS = ["a", "b", "c", "type"]
HEADER_VALUES = ["1", "2", "10", "-3", "1.5", "1e1", "+2.0", "x", "y", "X", "true", "FALSE"]
HEADER_VALUES += ["", "x%", "a_b", "x'y", "PERSISTENT", "007"]
STRINGS = ["x", "y", "1", "10", "true", "", "a_b", "x'y", "PERSISTENT", "m1", "X"]
PATTERNS = ["x", "x%", "%", "_", "%b", "a_b", "a\\_b", "x!%", "%%", "1%", "_%_", "X%"]
FLOATS = [0.5, 1.5, -2.0, 10.0, 1e1, 0.0]
OPS = ["=", "<>", "<", "<=", ">", ">="]

LIMITS = settings(max_examples=150, deadline=None)

identifiers = st.sampled_from(NAMES).map(Identifier)
numbers = st.one_of(st.integers(-3, 12), st.sampled_from(FLOATS)).map(NumberLiteral)
strings = st.sampled_from(STRINGS).map(StringLiteral)
booleans = st.booleans().map(BooleanLiteral)


def numeric(depth: int) -> st.SearchStrategy[Node]:
    """A number: literal, identifier, sign, arithmetic."""
    leaves = st.one_of(numbers, identifiers)
    if depth <= 0:
        return leaves
    inner = numeric(depth - 1)
    signed = st.builds(
        Unary, st.sampled_from("+-"), inner.filter(lambda n: not isinstance(n, NumberLiteral))
    )
    # One chain has operators of one precedence, as the parser builds them.
    chains = st.sampled_from(["+-", "*/"]).flatmap(
        lambda ops: st.builds(
            Arithmetic,
            inner,
            st.lists(st.tuples(st.sampled_from(ops), inner), min_size=1, max_size=3).map(tuple),
        )
    )
    return st.one_of(leaves, signed, chains)


def value(depth: int) -> st.SearchStrategy[Node]:
    """An operand of a comparison: a number, a string, a boolean, a condition."""
    parts = [numeric(depth), strings, identifiers, booleans]
    if depth > 0:
        parts.append(condition(depth - 1))
    return st.one_of(*parts)


def condition(depth: int) -> st.SearchStrategy[Node]:
    leaves = st.one_of(booleans, identifiers)
    if depth <= 0:
        return leaves
    operand = value(depth - 1)
    inner = condition(depth - 1)
    in_values = st.lists(
        st.one_of(st.sampled_from(STRINGS), st.integers(-3, 12), st.sampled_from(FLOATS)),
        min_size=1,
        max_size=4,
    ).map(tuple)
    return st.one_of(
        leaves,
        st.builds(Comparison, st.sampled_from(OPS), operand, operand),
        st.builds(Between, operand, operand, operand, st.booleans()),
        st.builds(In, operand, in_values, st.booleans()),
        st.builds(
            Like,
            operand,
            st.sampled_from(PATTERNS),
            st.sampled_from([None, "\\", "!", "%", "_"]),
            st.booleans(),
        ),
        st.builds(IsNull, operand, st.booleans()),
        st.builds(Not, inner),
        st.builds(And, st.lists(inner, min_size=2, max_size=3).map(tuple)),
        st.builds(Or, st.lists(inner, min_size=2, max_size=3).map(tuple)),
    )


selectors = condition(3)

messages = st.builds(
    make_message,
    st.sampled_from(["m1", "10", "x"]),
    headers=st.dictionaries(st.sampled_from(HEADERS), st.sampled_from(HEADER_VALUES)),
    persistent=st.booleans(),
    priority=st.integers(0, 9),
)


@LIMITS
@given(selectors, st.lists(messages, min_size=1, max_size=6))
def test_compiled_selectors_select_what_the_reference_interpreter_selects(
    root: Node, sample: list[Message]
) -> None:
    text = unparse(root)
    selector = compile_selector(text)
    for message in sample:
        assert selector.matches(message) is reference.selects(root, message), (text, message)


@LIMITS
@given(selectors)
def test_written_out_selectors_parse_back_to_the_same_tree(root: Node) -> None:
    text = unparse(root)
    again = parse_selector(text)
    assert again == root
    assert unparse(again) == text  # also tells 1 from 1.0, which == does not


names = st.sampled_from(["a", "b", "JMSPriority", "JMSType"])
literals = st.one_of(
    st.sampled_from(STRINGS).map(StringLiteral),
    st.integers(-1, 10).map(NumberLiteral),
    st.sampled_from([1.0, 1.5, 10.0]).map(NumberLiteral),
    booleans,
)
indexable = st.one_of(
    st.builds(Comparison, st.just("="), names.map(Identifier), literals),
    st.builds(Comparison, st.just("="), literals, names.map(Identifier)),
    st.builds(
        In,
        names.map(Identifier),
        st.lists(
            st.one_of(st.sampled_from(STRINGS), st.integers(0, 10)), min_size=1, max_size=3
        ).map(tuple),
    ),
    st.builds(IsNull, names.map(Identifier)),
)
index_selectors = st.one_of(
    indexable,
    st.builds(And, st.lists(st.one_of(indexable, condition(1)), min_size=2, max_size=3).map(tuple)),
    condition(2),
)


@LIMITS
@given(
    st.lists(index_selectors, min_size=1, max_size=12),
    st.lists(messages, min_size=1, max_size=6),
    st.sets(st.integers(0, 11), max_size=4),
)
def test_the_index_finds_exactly_the_matching_items_in_the_order_they_were_added(
    roots: list[Node], sample: list[Message], removed: set[int]
) -> None:
    compiled = [compile_selector(unparse(root)) for root in roots]
    index: SelectorIndex[int] = SelectorIndex()
    for item, selector in enumerate(compiled):
        index.add(item, selector)
    for item in removed:
        index.remove(item)
    kept = [i for i in range(len(compiled)) if i not in removed]
    assert len(index) == len(kept)
    for message in sample:
        expected = [i for i in kept if compiled[i].matches(message)]
        assert index.matching(message) == expected
        candidates = index.candidates(message)
        assert set(expected) <= set(candidates)
        assert candidates == sorted(candidates) == sorted(set(candidates))


selector_alphabet = st.sampled_from(
    [
        *"abcxyz019 ._%'()=<>+-*/,!#$\t\né",
        *["AND", "OR", "NOT", "IN", "LIKE", "ESCAPE", "BETWEEN", "IS", "NULL", "TRUE"],
        *["E", "'x'", "''"],
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(selector_alphabet, max_size=25).map(" ".join), messages)
def test_any_text_compiles_or_raises_a_selector_error_and_never_fails_to_evaluate(
    text: str, message: Message
) -> None:
    try:
        selector = compile_selector(text)
    except SelectorError as exc:
        assert 1 <= exc.column <= len(text) + 1
        return
    assert selector.matches(message) is reference.selects(selector.root, message)


@settings(max_examples=500, deadline=None)
@given(
    st.text("ab%_!.", max_size=8),
    st.sampled_from([None, "!", "%", "_", "a"]),
    st.lists(st.text("ab%_!.\n", max_size=8), min_size=1, max_size=5),
)
def test_like_patterns_match_what_the_reference_matches(
    pattern: str, escape: str | None, texts: list[str]
) -> None:
    matcher = like_matcher(pattern, escape)
    for text in texts:
        assert matcher(text) is reference.like(text, pattern, escape), (pattern, escape, text)
