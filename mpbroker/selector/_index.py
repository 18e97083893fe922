"""Many selectors, indexed so that a message costs nothing for those it cannot match.

Henjes et al. (ITC 2007) measured JMS brokers whose cost per published message grows with
every subscriber's selector, matching or not. Here each selector is filed under one
indexable condition among its top-level AND conjuncts, ``prop = literal`` (either way
round), ``prop IN (literals)``, ``prop IS NULL``, or an OR whose every operand pins the
same property (``ID = 'a' OR ID = 'b'``, as an IN): under `prop`, keyed by the literals
(`_key`). A message reads each indexed property once and takes the items of the buckets its
values name; only those, and the selectors with no indexable conjunct (`_always`), are
evaluated. So a publish costs O(indexed properties + candidates), not O(selectors).

A header's text is looked up as the text, as its number if it reads as one, and as its
boolean if it is true or false: the ways `_compile` may read it against a literal.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

from mpbroker.records import Message

from . import _values
from ._ast import (
    And,
    BooleanLiteral,
    Comparison,
    Identifier,
    In,
    IsNull,
    Node,
    NumberLiteral,
    Or,
    StringLiteral,
)
from ._compile import Selector

__all__ = ["SelectorIndex"]

T = TypeVar("T", bound=Hashable)

Test = Callable[[Message], bool]


class _Null:
    """The key of a missing header (IS NULL)."""

    def __repr__(self) -> str:
        return "NULL"


NULL: Final = _Null()
# Boolean keys are tagged: as dict keys, True and 1 (and False and 0) are the same key.
_TRUE: Final = ("boolean", True)
_FALSE: Final = ("boolean", False)


def _key(value: str | int | float | bool) -> Hashable:
    """A literal's bucket key: a string itself; a number itself (5 and 5.0 are one key)."""
    if isinstance(value, bool):
        return _TRUE if value else _FALSE
    return value


def _text_keys(text: str) -> tuple[Hashable, ...]:
    """The keys a header's text can equal: itself, its number, its boolean."""
    number = _values.to_number(text)
    flag = _values.to_boolean(text)
    if number is None:
        return (text,) if flag is None else (text, _TRUE if flag else _FALSE)
    return (text, number)  # a number is never also a boolean


def _keys_reader(name: str) -> Callable[[Message], tuple[Hashable, ...]]:
    """The keys of identifier `name`'s value in a message."""
    read = _values.reader(name)
    if _values.is_numeric(name):
        return lambda message: (read(message),)
    header = _values.header_of(name)
    if header is None:  # a text field of the message, never NULL
        return lambda message: _text_keys(str(read(message)))

    def header_keys(message: Message) -> tuple[Hashable, ...]:
        text = message.headers.get(header)
        return (NULL,) if text is None else _text_keys(text)

    return header_keys


def _placement(selector: Selector) -> tuple[str, tuple[Hashable, ...]] | None:
    """The property and keys to file `selector` under (the most selective indexable
    conjunct: an equality before an IN, an IN before IS NULL), or None if it has none."""
    best: tuple[int, str, tuple[Hashable, ...]] | None = None
    for node in selector.conjuncts:
        found = _indexable(node)
        if found is not None and (best is None or found[0] < best[0]):
            best = found
    return None if best is None else (best[1], best[2])


def _indexable(node: Node) -> tuple[int, str, tuple[Hashable, ...]] | None:
    """(rank, property, keys) if `node` is TRUE only when `property` has one of `keys`."""
    if isinstance(node, Or):
        return _indexable_or(node)
    literals = (StringLiteral, NumberLiteral, BooleanLiteral)
    if isinstance(node, Comparison) and node.op == "=":
        for ident, literal in ((node.left, node.right), (node.right, node.left)):
            if isinstance(ident, Identifier) and isinstance(literal, literals):
                return 0, ident.name, (_key(literal.value),)
    if isinstance(node, In) and not node.negated and isinstance(node.operand, Identifier):
        keys = tuple(dict.fromkeys(_key(v) for v in node.values))
        return len(keys), node.operand.name, keys
    if isinstance(node, IsNull) and not node.negated and isinstance(node.operand, Identifier):
        return 1_000_000, node.operand.name, (NULL,)
    return None


def _indexable_or(node: Or) -> tuple[int, str, tuple[Hashable, ...]] | None:
    """An OR is TRUE only when one of its operands is: if every operand pins the same
    property (itself, or one of its AND's conjuncts does), the OR pins it to the union of
    their keys. (`ID = 'a' OR ID = 'b'` is filed like `ID IN ('a', 'b')`; so is
    `(ID = 'a' AND x > 1) OR ID = 'b'`.)"""
    options: list[dict[str, tuple[Hashable, ...]]] = []
    for operand in node.operands:
        found: dict[str, tuple[Hashable, ...]] = {}
        parts = operand.operands if isinstance(operand, And) else (operand,)
        for part in parts:
            pinned = _indexable(part)
            if pinned is not None:
                _, name, keys = pinned
                if name not in found or len(keys) < len(found[name]):
                    found[name] = keys
        if not found:
            return None
        options.append(found)
    best: tuple[int, str, tuple[Hashable, ...]] | None = None
    for name in options[0]:
        if all(name in found for found in options):
            keys = tuple(dict.fromkeys(key for found in options for key in found[name]))
            if best is None or len(keys) < best[0]:
                best = (len(keys), name, keys)
    return best


@dataclass(slots=True)
class _Property(Generic[T]):
    """The items filed under one property, by key; a bucket maps each of its items to its
    selector's test, in the order the items were added."""

    keys: Callable[[Message], tuple[Hashable, ...]]
    buckets: dict[Hashable, dict[T, Test]] = field(default_factory=dict)
    items: int = 0


@dataclass(frozen=True, slots=True)
class _Entry:
    selector: Selector
    order: int  # when the item was added: candidates come out in this order
    name: str | None  # the property it is filed under; None: always evaluated
    keys: tuple[Hashable, ...]


class SelectorIndex(Generic[T]):
    """Items (consumers, subscription names: anything hashable), each with a selector;
    `matching` finds the items whose selector matches a message, in the order they were
    added, without evaluating the selectors that cannot match it.

    Adding an item that is already there replaces its selector and moves it to the end.
    """

    def __init__(self) -> None:
        self._entries: dict[T, _Entry] = {}
        self._properties: dict[str, _Property[T]] = {}
        self._always: dict[T, Test] = {}
        self._added = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, item: object) -> bool:
        return item in self._entries

    def add(self, item: T, selector: Selector) -> None:
        """Files `item` under its selector (replacing its earlier one, if any)."""
        if item in self._entries:
            self.remove(item)
        self._added += 1
        placement = _placement(selector)
        if placement is None:
            self._always[item] = selector.matches
            self._entries[item] = _Entry(selector, self._added, None, ())
            return
        name, keys = placement
        prop = self._properties.get(name)
        if prop is None:
            prop = self._properties[name] = _Property[T](_keys_reader(name))
        for key in keys:
            prop.buckets.setdefault(key, {})[item] = selector.matches
        prop.items += 1
        self._entries[item] = _Entry(selector, self._added, name, keys)

    def remove(self, item: T) -> None:
        """Forgets `item`; nothing happens if it is not there."""
        entry = self._entries.pop(item, None)
        if entry is None:
            return
        if entry.name is None:
            del self._always[item]
            return
        prop = self._properties[entry.name]
        for key in entry.keys:
            bucket = prop.buckets[key]
            del bucket[item]
            if not bucket:
                del prop.buckets[key]
        prop.items -= 1
        if not prop.items:
            del self._properties[entry.name]

    def candidates(self, message: Message) -> list[T]:
        """The items whose selector may match `message` (a superset of `matching`), in the
        order they were added."""
        return self._collect(message, list)

    def matching(self, message: Message) -> list[T]:
        """Exactly the items whose selector matches `message`, in the order they were added."""

        def take(bucket: dict[T, Test]) -> list[T]:
            return [item for item, test in bucket.items() if test(message)]

        return self._collect(message, take)

    def _collect(self, message: Message, take: Callable[[dict[T, Test]], list[T]]) -> list[T]:
        """What `take` takes from each bucket the message's values name, and from the
        selectors always evaluated, merged into the order of adding."""
        found = take(self._always) if self._always else []
        sources = 1 if found else 0
        for prop in self._properties.values():
            buckets = prop.buckets
            for key in prop.keys(message):
                bucket = buckets.get(key)
                if bucket:
                    taken = take(bucket)
                    if taken:
                        found.extend(taken)
                        sources += 1
        if sources > 1:  # several buckets: merge them back into the order of adding
            entries = self._entries
            found = sorted(dict.fromkeys(found), key=lambda item: entries[item].order)
        return found
