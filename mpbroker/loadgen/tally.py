"""What consumers received, and whether that is every message exactly once (pure logic).

A consumer keeps one :class:`Tally`: per producer, a bytearray with a byte per sequence
number (1 once received), plus counters for duplicates, out-of-order arrivals and bodies that
are not of this run. :func:`check` combines the tallies of all consumers: for a topic each
tally on its own must hold every message, in order; for a queue their union must, with no
message in two tallies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .wire import BODY_HEADER_BYTES

__all__ = ["CheckResult", "DeliveryVerdict", "Tally", "check"]

# Offsets in a body (see mpbroker.loadgen.wire): token and ':' (9 bytes), producer (5), ':', sequence (10).
_PRODUCER_AT = 9
_SEQ_AT = 15
_SEQ_END = BODY_HEADER_BYTES - 1


@dataclass(eq=False)
class Tally:
    """The deliveries one consumer saw. Picklable, so it travels back to the coordinator."""

    prefix: bytes
    producers: int
    count: int
    seen: list[bytearray] = field(default_factory=list)
    last: list[int] = field(default_factory=list)
    #: Deliveries of this run's messages, duplicates included.
    received: int = 0
    #: Deliveries of a message this consumer had already received.
    duplicates: int = 0
    #: Deliveries whose sequence number was not above the previous one from that producer.
    reordered: int = 0
    #: Bodies not of this run (a leftover of an earlier run) or not of the expected shape.
    foreign: int = 0

    def __post_init__(self) -> None:
        if not self.seen:
            self.seen = [bytearray(self.count) for _ in range(self.producers)]
            self.last = [-1] * self.producers

    def add(self, bodies: Iterable[bytes]) -> None:
        """Record a batch of delivered bodies. The consumer's hot path: locals only."""
        prefix = self.prefix
        plen = len(prefix)
        seen = self.seen
        last = self.last
        received = duplicates = reordered = foreign = 0
        for body in bodies:
            if body[:plen] != prefix:
                foreign += 1
                continue
            try:
                producer = int(body[_PRODUCER_AT : _SEQ_AT - 1])
                seq = int(body[_SEQ_AT:_SEQ_END])
                marks = seen[producer]
                if marks[seq]:
                    duplicates += 1
                else:
                    marks[seq] = 1
            except (ValueError, IndexError):
                foreign += 1
                continue
            if seq <= last[producer]:
                reordered += 1
            last[producer] = seq
            received += 1
        self.received += received
        self.duplicates += duplicates
        self.reordered += reordered
        self.foreign += foreign


class DeliveryVerdict:
    """The verdict of a check of deliveries, which :class:`CheckResult` and the selector
    study's :class:`~mpbroker.loadgen.filters.FilterCheck` share: ``ok`` unless
    :meth:`problems` finds something. A subclass (a dataclass) has the fields below."""

    __slots__ = ()

    expected: int
    missing: int
    duplicated: int
    reordered: int
    order_required: bool

    @property
    def ok(self) -> bool:
        return not self.problems()

    def problems(self) -> list[str]:
        """What went wrong, one phrase each (``"7 MISSING"``); none when ok: missing and
        duplicated deliveries, and reordered ones where order is promised."""
        problems = []
        if self.missing:
            problems.append(f"{self.missing} MISSING")
        if self.duplicated:
            problems.append(f"{self.duplicated} DUPLICATED")
        if self.reordered and self.order_required:
            problems.append(f"{self.reordered} OUT OF ORDER")
        return problems

    def _all_arrived(self) -> str:
        """The summary of a check that found nothing wrong."""
        text = f"all {self.expected} deliveries arrived exactly once"
        if self.order_required:
            text += ", in order"
        return text


@dataclass(frozen=True, slots=True)
class CheckResult(DeliveryVerdict):
    """Whether the deliveries were every message exactly once (and in order, for topics)."""

    #: Deliveries the scenario called for: messages sent, times consumers for a topic.
    expected: int
    #: Deliveries of this run's messages, duplicates included.
    received: int
    #: Expected deliveries that never happened.
    missing: int
    #: Deliveries beyond the first of the same message (to the same consumer, for a topic).
    duplicated: int
    #: Deliveries that came before an earlier-sent message of the same producer.
    reordered: int
    #: Bodies that were not of this run; ignored, not an error.
    foreign: int
    #: Whether a reorder is an error: per-producer order is promised for topics only.
    order_required: bool

    def summary(self) -> str:
        """One line for the report."""
        problems = self.problems()
        if problems:
            text = f"{', '.join(problems)} of {self.expected} expected deliveries"
        else:
            text = self._all_arrived()
        if self.reordered and not self.order_required:
            text += f" ({self.reordered} out of producer order)"
        if self.foreign:
            text += f" ({self.foreign} messages of an earlier run ignored)"
        return text


def check(
    tallies: Sequence[Tally], *, topic: bool, producers: int, consumers: int, count: int
) -> CheckResult:
    """Combine consumer tallies into missing / duplicated counts.

    For a topic, every consumer's tally must hold every (producer, sequence) once. For a
    queue, the union of the tallies must, and a message in two tallies is a duplicate. A
    consumer whose tally is absent (it failed) counts as having received nothing.
    """
    duplicated = sum(t.duplicates for t in tallies)
    reordered = sum(t.reordered for t in tallies)
    foreign = sum(t.foreign for t in tallies)
    received = sum(t.received for t in tallies)
    if topic:
        expected = producers * count * consumers
        held = sum(marks.count(1) for t in tallies for marks in t.seen)
        missing = expected - held
    else:
        expected = producers * count
        missing = 0
        for producer in range(producers):
            # Each byte is 0 or 1, so a bytearray read as a big integer is a bitset whose
            # popcount is the number of messages held; AND finds messages in two tallies.
            union = 0
            for t in tallies:
                bits = int.from_bytes(t.seen[producer], "little")
                duplicated += (union & bits).bit_count()
                union |= bits
            missing += count - union.bit_count()
    return CheckResult(
        expected=expected,
        received=received,
        missing=missing,
        duplicated=duplicated,
        reordered=reordered,
        foreign=foreign,
        order_required=topic,
    )
