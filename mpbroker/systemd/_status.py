"""The STATUS line `systemctl status` shows, and the message rates in it. Pure: the
supervisor reads the counters from the control block and passes them with the time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Counters", "RateMeter", "status_line"]


@dataclass(frozen=True, slots=True)
class Counters:
    """A pipeline's running totals, as its control-block slot holds them. They start from 0
    in every incarnation (a restarted worker counts again)."""

    incarnation: int
    received: int
    delivered: int


class RateMeter:
    """Messages per second in and out, from the pipelines' totals read now and then.

    A worker that restarted counts from 0 again: what its new incarnation counted is what
    happened since (a drop is never a negative rate).
    """

    def __init__(self) -> None:
        self._last: dict[str, Counters] = {}
        self._at: float | None = None
        self.rate_in = 0.0
        self.rate_out = 0.0

    def update(self, now: float, counters: Mapping[str, Counters]) -> None:
        """Take the totals read at `now` (seconds, monotonic)."""
        got_in = got_out = 0
        for key, new in counters.items():
            old = self._last.get(key)
            if old is None or old.incarnation != new.incarnation or new.received < old.received:
                old = Counters(new.incarnation, 0, 0)
            got_in += new.received - old.received
            got_out += max(0, new.delivered - old.delivered)
        if self._at is not None and now > self._at:
            self.rate_in = got_in / (now - self._at)
            self.rate_out = got_out / (now - self._at)
        self._last = dict(counters)
        self._at = now


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def status_line(
    *,
    connections: int,
    rate_in: float,
    rate_out: float,
    memory_used: int,
    max_memory: int,
    memory_level: int,
    workers_ready: int,
    workers: int,
    restarts: int,
    problems: Sequence[str] = (),
) -> str:
    """One line for a person: "12 connections, 3,400 msg/s in, 3,390 msg/s out; memory
    93 MiB of 256 MiB (level 0); 6 of 6 workers ready, 2 restarts", then what is wrong."""
    parts = [
        f"{connections:,} connection{'' if connections == 1 else 's'}, "
        f"{rate_in:,.0f} msg/s in, {rate_out:,.0f} msg/s out",
        f"memory {_mib(memory_used)} of {_mib(max_memory)} (level {memory_level})",
        f"{workers_ready} of {workers} workers ready"
        + (f", {restarts:,} restart{'' if restarts == 1 else 's'}" if restarts else ""),
    ]
    return "; ".join([*parts, *problems])
