"""The supervisor's side of systemd: when to tell it what (`ServiceLink`).

The supervisor hands over what it read of its workers (`BrokerFigures`) once per turn of its
loop; this decides when a `WATCHDOG=1` is due and whether the broker deserves it
(`mpbroker.systemd.stalled`), and refreshes the STATUS line every `STATUS_INTERVAL_S` or as
soon as what is wrong changes. Without `$NOTIFY_SOCKET` there is no notifier and it does
nothing but keep the rates (cheap).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mpbroker.systemd import (
    Counters,
    Notifier,
    RateMeter,
    StalledWorker,
    WorkerBeat,
    stalled,
    status_line,
)

__all__ = ["STATUS_INTERVAL_S", "BrokerFigures", "ServiceLink"]

log = logging.getLogger("mpbroker.supervisor")

STATUS_INTERVAL_S = 2.0
"""How often the STATUS line is refreshed (its rates are over this long)."""


@dataclass(frozen=True, slots=True)
class BrokerFigures:
    """What the supervisor read of its broker for one turn."""

    connections: int
    counters: Mapping[str, Counters]
    memory_used: int
    max_memory: int
    memory_level: int
    beats: Sequence[WorkerBeat]
    restarts: int


class ServiceLink:
    """Tells systemd (through `notifier`, None when not run by it) how the broker does."""

    def __init__(
        self, notifier: Notifier | None, stall_timeout_ms: int, startup_timeout_ms: int
    ) -> None:
        self.notifier = notifier
        self.stall_timeout_ms = stall_timeout_ms
        self.startup_timeout_ms = startup_timeout_ms
        self.rates = RateMeter()
        self._next_watchdog = 0.0
        self._next_status = 0.0
        self._problems: list[StalledWorker] = []

    @property
    def watchdog_s(self) -> float | None:
        return self.notifier.watchdog_s if self.notifier is not None else None

    def next_due(self, now: float) -> float:
        """Seconds until the loop should turn again for us (it turns at least every 0.5 s)."""
        due = self._next_status
        if self.watchdog_s is not None:
            due = min(due, self._next_watchdog)
        return max(0.0, due - now)

    def starting(self, text: str) -> None:
        if self.notifier is not None:
            self.notifier.status(f"starting: {text}")

    def ready(self, now: float, figures: BrokerFigures) -> None:
        """Every worker is up and the port accepts connections (also after a reload)."""
        self.rates.update(now, figures.counters)
        if self.notifier is not None:
            self.notifier.ready(self._line(figures, self._problems))
        self._next_status = now + STATUS_INTERVAL_S

    def reloading(self) -> None:
        if self.notifier is not None:
            self.notifier.reloading("reloading the configuration (SIGHUP)")

    def stopping(self, why: str) -> None:
        if self.notifier is not None:
            self.notifier.stopping(f"stopping: {why}")

    def failed(self, why: str) -> None:
        if self.notifier is not None:
            self.notifier.status(f"cannot start: {why}")

    def tick(self, now: float, figures: BrokerFigures) -> None:
        """Once per turn of the supervisor's loop."""
        problems = stalled(figures.beats, self.stall_timeout_ms, self.startup_timeout_ms)
        # Which workers and which way, not how long: the seconds change every turn.
        changed = [(p.title, p.kind) for p in problems] != [
            (p.title, p.kind) for p in self._problems
        ]
        if changed and self.watchdog_s is not None:
            if problems and not self._problems:
                log.warning(
                    "watchdog: not healthy (%s): systemd gets no WATCHDOG=1 until it is",
                    ", ".join(p.text() for p in problems),
                )
            elif not problems:
                log.info("watchdog: healthy again")
                self._next_watchdog = now  # the ping that was held back, at once
        self._problems = problems
        if now >= self._next_status or changed:
            self.rates.update(now, figures.counters)
            if self.notifier is not None:
                self.notifier.status(self._line(figures, problems))
            self._next_status = now + STATUS_INTERVAL_S
        if self.notifier is not None and self.watchdog_s is not None and now >= self._next_watchdog:
            if not problems:
                self.notifier.watchdog()
            self._next_watchdog = now + self.watchdog_s

    def _line(self, figures: BrokerFigures, problems: Sequence[StalledWorker]) -> str:
        return status_line(
            connections=figures.connections,
            rate_in=self.rates.rate_in,
            rate_out=self.rates.rate_out,
            memory_used=figures.memory_used,
            max_memory=figures.max_memory,
            memory_level=figures.memory_level,
            workers_ready=sum(1 for b in figures.beats if b.ready),
            workers=len(figures.beats),
            restarts=figures.restarts,
            problems=[p.text() for p in problems],
        )
