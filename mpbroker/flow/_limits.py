"""Store limits: per-destination and global watermarks on messages and bytes. Pure logic.

A store worker tells a `FlowTracker` what entered and left the store; the tracker says
which destinations must stop their producers and why (docs/architecture.md, "Flow control"). It
reports state *changes* (`changes`), which the worker forwards to the gateways, and the
whole current state (`stopped`), which it re-announces to a gateway that restarted and so
missed earlier changes.

Work per message is a few integer updates; `changes` only looks at destinations whose
state changed since the last call, and a destination that holds nothing and is not
stopped is forgotten, so many short-lived destination names do not grow memory.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Container
from dataclasses import dataclass, replace

from mpbroker.config import Config, StoreFlowSettings

from ._watermark import PER_DESTINATION_CACHE, Level, Watermark

__all__ = [
    "GLOBAL",
    "FlowChange",
    "FlowTracker",
    "StoreLimits",
    "destination_limits",
    "store_limits",
]

# The destination name that stands for the global limits: they stop every destination of
# the store at once. Real destination names start with "/queue/" or "/topic/".
GLOBAL = ""


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """The watermarks of one store (in one worker)."""

    messages: Watermark
    """Messages held for one destination."""
    bytes: Watermark
    """Bytes held for one destination."""
    global_messages: Watermark
    """Messages held over all destinations of the store."""
    global_bytes: Watermark
    """Bytes held over all destinations of the store."""


@dataclass(frozen=True, slots=True)
class FlowChange:
    """A destination was stopped, released, or is now stopped for a different reason."""

    destination: str
    """The destination; `GLOBAL` ("") for the global limits (every destination)."""
    reason: str
    """The limit that holds it, e.g. "msg_high 10000"; "" when it was released."""

    @property
    def stopped(self) -> bool:
        return self.reason != ""


class _Entry:
    """What the tracker knows about one destination."""

    __slots__ = ("byte_level", "messages", "msg_level", "nbytes")

    def __init__(self, limits: StoreLimits) -> None:
        self.messages = 0
        self.nbytes = 0
        self.msg_level = Level(limits.messages, "msg_high")
        self.byte_level = Level(limits.bytes, "byte_high")


def _reason(first: Level, second: Level) -> str:
    # One reason even when both limits are armed: the message count is named first
    # because it is the limit operators usually set and recognise.
    if first.armed:
        return first.reason
    if second.armed:
        return second.reason
    return ""


class FlowTracker:
    """Counts what each destination holds in a store and which watermarks are armed."""

    def __init__(
        self,
        limits: StoreLimits,
        destination_limits: Callable[[str], StoreLimits] | None = None,
    ) -> None:
        self.limits = limits
        # Per-destination watermarks from [destinations."<pattern>"] settings; the global
        # ones always come from `limits`.
        self.destination_limits = destination_limits
        self._entries: dict[str, _Entry] = {}
        self._total_messages = 0
        self._total_bytes = 0
        self._global_msg = Level(limits.global_messages, "global_msg_high")
        self._global_byte = Level(limits.global_bytes, "global_byte_high")
        # Current reason of every stopped destination (GLOBAL included), in the order
        # they were stopped.
        self._stopped: dict[str, str] = {}
        # What the last `changes` reported as stopped: a change is only reported when
        # the state differs from this, so arming and disarming between two calls cancel.
        self._reported: dict[str, str] = {}
        # Destinations whose state changed since the last `changes`, ordered by their
        # latest change (a dict, as an ordered set).
        self._dirty: dict[str, None] = {}
        # Per destination (GLOBAL too): how often its producers were stopped, since the
        # tracker was made (the admin API's and /metrics' "stops" counters).
        self.stops: dict[str, int] = {}

    def add(self, destination: str, messages: int, nbytes: int) -> None:
        """`messages` messages of `nbytes` bytes in all entered the store for `destination`."""
        _check(destination, messages, nbytes)
        entry = self._entries.get(destination)
        if entry is None:
            limits = (
                self.destination_limits(destination) if self.destination_limits else self.limits
            )
            entry = self._entries[destination] = _Entry(limits)
        entry.messages += messages
        entry.nbytes += nbytes
        self._total_messages += messages
        self._total_bytes += nbytes
        self._settle(destination, entry)

    def remove(self, destination: str, messages: int, nbytes: int) -> None:
        """Messages left the store (acknowledged, expired, purged).

        Counts never go below 0: removing more than was added is clamped rather than
        refused, because this is accounting that must keep going (a store that was
        opened with messages the tracker never saw still removes them).
        """
        _check(destination, messages, nbytes)
        entry = self._entries.get(destination)
        if entry is None:
            return
        # Totals fall by what the destination really gave back, so they always equal
        # the sum of the destinations' counts.
        messages = min(messages, entry.messages)
        nbytes = min(nbytes, entry.nbytes)
        entry.messages -= messages
        entry.nbytes -= nbytes
        self._total_messages -= messages
        self._total_bytes -= nbytes
        self._settle(destination, entry)

    def changes(self) -> list[FlowChange]:
        """The state changes since the last call, ordered by when each happened last.

        A destination that was stopped and released again in between is not reported;
        one that stays stopped but for another limit is reported with its new reason.
        """
        found: list[FlowChange] = []
        for destination in self._dirty:
            reason = self._stopped.get(destination, "")
            if reason != self._reported.get(destination, ""):
                found.append(FlowChange(destination, reason))
                if reason:
                    self._reported[destination] = reason
                else:
                    del self._reported[destination]
        self._dirty.clear()
        return found

    def stopped(self) -> dict[str, str]:
        """Every destination stopped now (`GLOBAL` for the global limits) -> its reason."""
        return dict(self._stopped)

    def holds(self, destination: str) -> bool:
        """Whether producers to `destination` are stopped now (by its own limits or the
        global ones)."""
        stopped = self._stopped
        return bool(stopped) and (destination in stopped or GLOBAL in stopped)

    def counts(self, destination: str) -> tuple[int, int]:
        """(messages, bytes) the store holds for `destination`."""
        entry = self._entries.get(destination)
        return (0, 0) if entry is None else (entry.messages, entry.nbytes)

    @property
    def totals(self) -> tuple[int, int]:
        """(messages, bytes) the store holds over all destinations."""
        return (self._total_messages, self._total_bytes)

    def tracked_destinations(self) -> list[str]:
        """The destinations that hold something or are stopped."""
        return list(self._entries)

    @property
    def tracked(self) -> int:
        """Destinations with an entry: those that hold something or are stopped."""
        return len(self._entries)

    def prune_stops(self, existing: Container[str], cap: int = 100_000) -> None:
        """Past `cap` destinations, forget the stop counts of those not in `existing`."""
        if len(self.stops) > cap:
            self.stops = {k: v for k, v in self.stops.items() if k in existing or k == GLOBAL}

    def _settle(self, destination: str, entry: _Entry) -> None:
        # Both levels must see the new counts, so no short-circuit `or` here.
        msg_changed = entry.msg_level.update(entry.messages) is not None
        byte_changed = entry.byte_level.update(entry.nbytes) is not None
        if msg_changed or byte_changed:
            self._set(destination, _reason(entry.msg_level, entry.byte_level))
        if (
            entry.messages == 0
            and entry.nbytes == 0
            and not entry.msg_level.armed
            and not entry.byte_level.armed
        ):
            del self._entries[destination]
        self._settle_global()

    def _settle_global(self) -> None:
        msg_changed = self._global_msg.update(self._total_messages) is not None
        byte_changed = self._global_byte.update(self._total_bytes) is not None
        if msg_changed or byte_changed:
            self._set(GLOBAL, _reason(self._global_msg, self._global_byte))

    def reconfigure(
        self,
        limits: StoreLimits,
        destination_limits: Callable[[str], StoreLimits] | None = None,
    ) -> None:
        """New watermarks (a configuration reload): every destination is judged again
        by them, and the resulting stops and releases show up in `changes`."""
        self.limits = limits
        self.destination_limits = destination_limits
        self._global_msg.mark = limits.global_messages
        self._global_byte.mark = limits.global_bytes
        for destination, entry in list(self._entries.items()):
            own = destination_limits(destination) if destination_limits else limits
            entry.msg_level.mark = own.messages
            entry.byte_level.mark = own.bytes
            self._settle(destination, entry)
        self._settle_global()

    def _set(self, destination: str, reason: str) -> None:
        if reason == self._stopped.get(destination, ""):
            return  # the other limit armed or disarmed behind the one that is named
        if reason:
            if destination not in self._stopped:
                self.stops[destination] = self.stops.get(destination, 0) + 1
            self._stopped[destination] = reason
        else:
            self._stopped.pop(destination, None)
        self._dirty.pop(destination, None)
        self._dirty[destination] = None


def _check(destination: str, messages: int, nbytes: int) -> None:
    if not destination:
        raise ValueError("destination name is empty: '' stands for the global limits")
    if messages < 0 or nbytes < 0:
        raise ValueError(f"negative amount for {destination}: {messages} messages, {nbytes} bytes")


def store_limits(settings: StoreFlowSettings) -> StoreLimits:
    """The watermarks of one store section of the config (vol_queue_store, ...)."""
    return StoreLimits(
        messages=Watermark(settings.msg_high, settings.msg_low),
        bytes=Watermark(settings.byte_high, settings.byte_low),
        global_messages=Watermark(settings.global_msg_high, settings.global_msg_low),
        global_bytes=Watermark(settings.global_byte_high, settings.global_byte_low),
    )


def destination_limits(config: Config, section: str) -> Callable[[str], StoreLimits]:
    """Per destination: a store's limits with its [destinations."<pattern>"] overrides
    (remembered per name: the patterns are matched once per destination). Without a
    [destinations] table every name has the same limits, and nothing is remembered per
    name (a cache of names would grow with every destination ever used)."""
    base = store_limits(getattr(config, section))
    if not config.destinations:

        def same_limits(destination: str) -> StoreLimits:
            return base

        return same_limits

    @functools.lru_cache(maxsize=PER_DESTINATION_CACHE)
    def limits_for(destination: str) -> StoreLimits:
        limits = base
        table = config.destination(destination)
        if table is not None:
            if table.msg_high is not None and table.msg_low is not None:
                limits = replace(limits, messages=Watermark(table.msg_high, table.msg_low))
            if table.byte_high is not None and table.byte_low is not None:
                limits = replace(limits, bytes=Watermark(table.byte_high, table.byte_low))
        return limits

    return limits_for
