"""The filter study's subscriptions and messages, and whether every delivery was right (pure).

A :class:`FilterPlan` says what Henjes et al. varied: ``n`` subscriptions on one destination,
each with a JMS selector of one *kind* and ``m`` components, of which ``r`` select each message
(the replication grade) and the rest never select any. Messages carry ``ID:k<key>``, the key
cycling over ``0 .. keys-1`` (one key, ``k0``, for the topic grid), and the properties
``a1 .. a<M-1>`` (``x``) that AND filters test, so every kind of filter sees the same messages.

Subscriber ``i`` is given a key: subscribers ``0 .. r*keys-1`` share the sent keys, ``r`` to
each (``i % keys``); every other subscriber gets the key ``i``, which is never sent. Its
selector, for key ``k`` and ``m`` components:

- ``simple``: ``ID = 'k<k>'``
- ``and``: ``ID = 'k<k>' AND a1 = 'x' AND ... AND a<m-1> = 'x'`` (every component holds for
  every message; only the ID decides)
- ``or``: ``ID = 'k<k>' OR ID = 'k<k+n>' OR ... OR ID = 'k<k+(m-1)n>'`` (the extra values are
  never sent)
- ``in``: ``ID IN ('k<k>', 'k<k+n>', ..., 'k<k+(m-1)n>')``
- ``none``: no selector: every subscriber gets every message (a reference, not a filter)

A :class:`FilterTally` is what one consumer connection saw, per subscription; :func:`check`
combines them into missing, duplicated, out-of-order and unexpected deliveries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .tally import DeliveryVerdict
from .wire import BODY_HEADER_BYTES

__all__ = [
    "KINDS",
    "NO_FILTER",
    "FilterCheck",
    "FilterPlan",
    "FilterTally",
    "check",
    "parse_int_list",
    "parse_kinds",
]

#: Filter kinds of the study, as the options name them.
KINDS: tuple[str, ...] = ("simple", "and", "or", "in")
#: Subscriptions without a selector: the reference of the queue target.
NO_FILTER = "none"

#: The message property every filter tests, and the prefix of its values.
KEY_PROPERTY = "ID"
KEY_PREFIX = "k"
#: Value of the extra properties a1, a2, ... that messages carry for AND filters.
EXTRA_VALUE = "x"

# Offsets in a body (see mpbroker.loadgen.wire): the sequence number, 10 digits.
_SEQ_AT = 15
_SEQ_END = BODY_HEADER_BYTES - 1


@dataclass(frozen=True, slots=True)
class FilterPlan:
    """``subscribers`` (n) subscriptions with ``kind`` selectors of ``components`` (m)
    components, ``replication`` (r) of which select each message; messages cycle over
    ``keys`` ID values and carry ``message_components - 1`` extra properties.

    ``ValueError`` names what does not fit together.
    """

    subscribers: int
    kind: str = "simple"
    components: int = 1
    replication: int = 1
    keys: int = 1
    message_components: int = 1

    def __post_init__(self) -> None:
        if self.kind not in (*KINDS, NO_FILTER):
            raise ValueError(f"unknown filter kind {self.kind!r} (one of {', '.join(KINDS)})")
        for name in ("subscribers", "components", "replication", "keys", "message_components"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.kind in ("simple", NO_FILTER) and self.components != 1:
            raise ValueError(f"a {self.kind} filter has 1 component, not {self.components}")
        if self.kind == NO_FILTER and (self.replication, self.keys) != (self.subscribers, 1):
            raise ValueError("without filters every subscriber gets every message (r = n)")
        if self.kind != NO_FILTER and self.replication * self.keys > self.subscribers:
            raise ValueError(
                f"replication {self.replication} x {self.keys} keys needs at least"
                f" {self.replication * self.keys} subscribers, got {self.subscribers}"
            )
        if self.kind == "and" and self.message_components < self.components:
            raise ValueError(
                f"an AND filter of {self.components} components needs messages with"
                f" {self.components - 1} extra properties, they carry"
                f" {self.message_components - 1}"
            )

    @property
    def filter_components(self) -> int:
        """Components of each subscription's filter (0 without one): the paper's ``m``."""
        return 0 if self.kind == NO_FILTER else self.components

    @property
    def label(self) -> str:
        """E.g. ``or m=5 n=1000 r=1``."""
        m = f" m={self.components}" if self.kind not in ("simple", NO_FILTER) else ""
        keys = f" keys={self.keys}" if self.keys > 1 else ""
        return f"{self.kind}{m} n={self.subscribers} r={self.replication}{keys}"

    def key_of(self, subscriber: int) -> int:
        """The ID key subscriber ``subscriber`` selects (in its first component)."""
        if subscriber < self.replication * self.keys:
            return subscriber % self.keys
        return subscriber

    def selector(self, subscriber: int) -> str | None:
        """The SUBSCRIBE ``selector`` header of subscriber ``subscriber`` (None: none)."""
        kind = self.kind
        if kind == NO_FILTER:
            return None
        key = self.key_of(subscriber)
        n = self.subscribers
        values = [f"'{KEY_PREFIX}{key + j * n}'" for j in range(self.components)]
        if kind == "simple":
            return f"{KEY_PROPERTY} = {values[0]}"
        if kind == "and":
            extra = [f"a{j} = '{EXTRA_VALUE}'" for j in range(1, self.components)]
            return " AND ".join([f"{KEY_PROPERTY} = {values[0]}", *extra])
        if kind == "or":
            return " OR ".join(f"{KEY_PROPERTY} = {value}" for value in values)
        return f"{KEY_PROPERTY} IN ({', '.join(values)})"

    def message_key(self, seq: int) -> int:
        return seq % self.keys

    def fixed_headers(self) -> dict[str, str]:
        """The properties every message carries besides its ID: a1 .. a<M-1>."""
        return {f"a{j}": EXTRA_VALUE for j in range(1, self.message_components)}

    def headers(self, seq: int) -> dict[str, str]:
        """The properties of message ``seq``."""
        return {KEY_PROPERTY: f"{KEY_PREFIX}{self.message_key(seq)}", **self.fixed_headers()}

    def selects(self, subscriber: int, seq: int) -> bool:
        """Whether subscriber ``subscriber``'s selector is TRUE for message ``seq``."""
        if self.kind == NO_FILTER:
            return True
        return self.key_of(subscriber) == seq % self.keys

    @property
    def selecting(self) -> range:
        """The subscribers that select some messages (the others select none)."""
        if self.kind == NO_FILTER:
            return range(self.subscribers)
        return range(self.replication * self.keys)

    def selected(self, subscriber: int, sent: int) -> int:
        """How many of messages ``0 .. sent-1`` subscriber ``subscriber`` selects."""
        if self.kind == NO_FILTER:
            return sent
        if subscriber not in self.selecting:
            return 0
        return len(range(self.key_of(subscriber), sent, self.keys))

    def deliveries_per_message(self, *, topic: bool) -> int:
        """Deliveries each message makes: ``r`` on a topic (n without filters), 1 on a queue."""
        return self.replication if topic else 1

    def expected_deliveries(self, sent: int, *, topic: bool) -> int:
        """Deliveries due for messages ``0 .. sent-1``."""
        if not topic:
            return sent
        return sum(self.selected(i, sent) for i in self.selecting)


@dataclass(eq=False)
class FilterTally:
    """What one connection's subscriptions received. Picklable; ``count`` bounds the
    sequence numbers (the most messages the producer may send)."""

    prefix: bytes
    plan: FilterPlan
    count: int
    #: Per subscriber that selects anything: a byte per sequence number, 1 once received.
    marks: dict[int, bytearray] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)
    #: Deliveries of this run's messages, duplicates included.
    received: int = 0
    #: Deliveries of a message this subscription had already received.
    duplicates: int = 0
    #: Deliveries whose sequence number was not above the subscription's previous one.
    reordered: int = 0
    #: Deliveries to a subscription whose selector is FALSE for the message (or unknown).
    unexpected: int = 0
    #: Bodies not of this run, or not of the expected shape.
    foreign: int = 0

    def add(self, deliveries: Iterable[tuple[str, bytes]]) -> None:
        """Record ``(subscription id, body)`` deliveries; ids are subscriber indexes."""
        prefix = self.prefix
        plen = len(prefix)
        plan = self.plan
        marks = self.marks
        last = self.last
        count = self.count
        for sub_id, body in deliveries:
            if body[:plen] != prefix:
                self.foreign += 1
                continue
            try:
                seq = int(body[_SEQ_AT:_SEQ_END])
                subscriber = int(sub_id)
            except ValueError:
                self.foreign += 1
                continue
            self.received += 1
            if not (0 <= seq < count and 0 <= subscriber < plan.subscribers) or not plan.selects(
                subscriber, seq
            ):
                self.unexpected += 1
                continue
            seen = marks.get(subscriber)
            if seen is None:
                seen = marks[subscriber] = bytearray(count)
            if seen[seq]:
                self.duplicates += 1
            else:
                seen[seq] = 1
            if seq <= last.get(subscriber, -1):
                self.reordered += 1
            last[subscriber] = seq


@dataclass(frozen=True, slots=True)
class FilterCheck(DeliveryVerdict):
    """Whether every due delivery happened exactly once, and nothing else was delivered."""

    expected: int
    received: int
    missing: int
    duplicated: int
    reordered: int
    unexpected: int
    foreign: int
    #: Per-subscription order is promised on topics only.
    order_required: bool

    def problems(self) -> list[str]:
        """What went wrong, one phrase each; none when ok: also deliveries a selector
        rejects."""
        # (Not super(): slots=True makes a new class, which the implicit __class__ misses.)
        problems = DeliveryVerdict.problems(self)
        if self.unexpected:
            problems.append(f"{self.unexpected} NOT SELECTED but delivered")
        return problems

    def summary(self) -> str:
        """One line for the report."""
        problems = self.problems()
        if problems:
            text = f"{', '.join(problems)} (of {self.expected} expected deliveries)"
        else:
            text = self._all_arrived() + ", none unselected"
        if self.foreign:
            text += f" ({self.foreign} messages of an earlier run ignored)"
        return text


def check(
    tallies: Sequence[FilterTally], plan: FilterPlan, *, topic: bool, sent: int
) -> FilterCheck:
    """Combine the tallies of every connection of a run that sent messages ``0 .. sent-1``.

    On a topic each selecting subscription must hold each message it selects once. On a
    queue each message must be held once by the union of the subscriptions that select it
    (a message held by two is a duplicate). A connection whose tally is absent counts as
    having received nothing.
    """
    duplicated = sum(t.duplicates for t in tallies)
    # Per subscriber, the messages held as a bitset: each mark is 0 or 1, so a bytearray
    # read as an integer is one, and AND finds messages held twice. (A subscription lives
    # on one connection, but a tally may come from anywhere.) Marks are only ever set for
    # selected messages, and none for a message that was never sent.
    held: dict[int, int] = {}
    for tally in tallies:
        for subscriber, marks in tally.marks.items():
            bits = int.from_bytes(marks, "little")
            before = held.get(subscriber, 0)
            duplicated += (before & bits).bit_count()
            held[subscriber] = before | bits
    missing = 0
    if topic:
        for subscriber in plan.selecting:
            missing += plan.selected(subscriber, sent) - held.get(subscriber, 0).bit_count()
    else:
        # Per ID key: the subscriptions that share it divide its messages among them.
        sharing: dict[int, list[int]] = {}
        for subscriber in plan.selecting:
            key = 0 if plan.kind == NO_FILTER else plan.key_of(subscriber)
            sharing.setdefault(key, []).append(subscriber)
        for key, subscribers in sharing.items():
            union = 0
            for subscriber in subscribers:
                bits = held.get(subscriber, 0)
                duplicated += (union & bits).bit_count()
                union |= bits
            due = sent if plan.kind == NO_FILTER else len(range(key, sent, plan.keys))
            missing += due - union.bit_count()
    return FilterCheck(
        expected=plan.expected_deliveries(sent, topic=topic),
        received=sum(t.received for t in tallies),
        missing=missing,
        duplicated=duplicated,
        reordered=sum(t.reordered for t in tallies),
        unexpected=sum(t.unexpected for t in tallies),
        foreign=sum(t.foreign for t in tallies),
        order_required=topic,
    )


def parse_int_list(option: str, text: str, *, minimum: int = 1) -> tuple[int, ...]:
    """``"1,10,100"`` -> ``(1, 10, 100)``, sorted, without repeats; ``ValueError`` naming
    ``option`` otherwise."""
    values: set[int] = set()
    for part in text.split(","):
        try:
            value = int(part.strip().replace("_", ""))
        except ValueError:
            raise ValueError(
                f"{option} takes comma-separated whole numbers, got {text!r}"
            ) from None
        if value < minimum:
            raise ValueError(f"{option} values must be at least {minimum}, got {value}")
        values.add(value)
    return tuple(sorted(values))


def parse_kinds(option: str, text: str) -> tuple[str, ...]:
    """``"simple,or"`` -> ``("simple", "or")`` in the order of :data:`KINDS`."""
    kinds = {part.strip().lower() for part in text.split(",")}
    unknown = sorted(kinds - set(KINDS))
    if unknown:
        raise ValueError(f"{option}: unknown kind {unknown[0]!r} (choose from {', '.join(KINDS)})")
    return tuple(kind for kind in KINDS if kind in kinds)
