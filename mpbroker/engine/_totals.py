"""Per-destination totals since the worker started: what the admin API and `/metrics`
report as counters (`mpbroker_destination_messages_enqueued_total`, ...).

Kept apart from the destinations themselves: a queue is forgotten while it holds nothing
and nobody consumes from it, and its totals must carry on when it is used again (a
Prometheus counter that fell back to 0 each time would read as a reset)."""

from __future__ import annotations

from collections.abc import Container
from typing import Final

__all__ = [
    "DEAD_LETTERED",
    "DEQUEUED",
    "ENQUEUED",
    "EXPIRED",
    "STOPS",
    "DestinationTotals",
]

# Indexes into a destination's counts.
ENQUEUED: Final = 0  # sent to it (a topic: published), dead-letter copies included
DEQUEUED: Final = 1  # acknowledged by a consumer (auto mode: written to it)
EXPIRED: Final = 2  # whose time was up before they were consumed
DEAD_LETTERED: Final = 3  # moved to its dead-letter queue (rejected, redelivered too often)
STOPS: Final = 4  # times its producers were stopped (topics: by the live buffer)
_FIELDS: Final = 5

_NONE: Final = (0, 0, 0, 0, 0)


class DestinationTotals:
    """Counts per destination, by the indexes above. Bounded: past `cap` destinations,
    `prune` forgets the totals of those that no longer exist."""

    def __init__(self, cap: int = 100_000) -> None:
        self.cap = cap
        self.counts: dict[str, list[int]] = {}

    def add(self, destination: str, which: int, count: int = 1) -> None:
        """`count` more of `which` (ENQUEUED, DEQUEUED, ...) for `destination`."""
        counts = self.counts.get(destination)
        if counts is None:
            counts = self.counts[destination] = [0] * _FIELDS
        counts[which] += count

    def of(self, destination: str) -> tuple[int, ...]:
        """(enqueued, dequeued, expired, dead_lettered, stops) of `destination`."""
        counts = self.counts.get(destination)
        return _NONE if counts is None else tuple(counts)

    def prune(self, existing: Container[str]) -> None:
        """Past the cap, forget the destinations not in `existing` (their counters end,
        as a destination removed from ActiveMQ takes its statistics with it). "" (every
        destination at once, as in a global stop) is kept."""
        if len(self.counts) > self.cap:
            self.counts = {k: v for k, v in self.counts.items() if k in existing or not k}
