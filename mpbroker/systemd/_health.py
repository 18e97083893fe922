"""Whether the broker is healthy enough to feed systemd's watchdog. Pure: the supervisor
passes what it read of its workers.

The supervisor's own loop sends `WATCHDOG=1`, so a supervisor that hangs stops the pings by
itself. Beyond that, the broker is unhealthy while a worker is (1) ready but silent (its
heartbeat older than `broker.worker_stall_timeout_ms`; the supervisor kills it, and a worker
that cannot be killed, stuck in the kernel, stays that way), (2) replacing a worker that was
killed for such a silence and not ready yet (the cure is not vouched for before it works),
or (3) not ready for longer than the start-up limit (stuck starting, or crashing before it
can serve). systemd acts only after `WatchdogSec` without a ping, so a short spell of any
of these costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["StalledWorker", "WorkerBeat", "stalled"]


@dataclass(frozen=True, slots=True)
class WorkerBeat:
    """What the supervisor knows of one worker's signs of life.

    Attributes:
        title: the worker ("p2p 0").
        ready: it serves (its control-block slot says READY).
        heartbeat_age_ms: since its last heartbeat (None when it has none yet).
        down_ms: how long it has not been ready (0 while it is).
        after_stall: it replaces a worker that was killed for a silent heartbeat.
    """

    title: str
    ready: bool
    heartbeat_age_ms: int | None
    down_ms: int = 0
    after_stall: bool = False


@dataclass(frozen=True, slots=True)
class StalledWorker:
    """A worker that makes the broker unhealthy: `kind` says which way ("silent",
    "restarting", "not ready"), `why` says it for a person, with how long."""

    title: str
    kind: str
    why: str

    def text(self) -> str:
        return f"{self.title} {self.why}"


def stalled(
    workers: Iterable[WorkerBeat], stall_timeout_ms: int, startup_timeout_ms: int
) -> list[StalledWorker]:
    """The workers that make the broker unhealthy (none: healthy). A stall timeout of 0
    (the stall watch is off) leaves only the start-up limit."""
    found = []
    for worker in workers:
        age = worker.heartbeat_age_ms
        if worker.ready:
            if stall_timeout_ms and age is not None and age > stall_timeout_ms:
                found.append(
                    StalledWorker(worker.title, "silent", f"silent for {age / 1000:.1f} s")
                )
        elif worker.after_stall:
            found.append(StalledWorker(worker.title, "restarting", "restarting after a stall"))
        elif worker.down_ms > startup_timeout_ms:
            found.append(
                StalledWorker(
                    worker.title, "not ready", f"not ready for {worker.down_ms / 1000:.0f} s"
                )
            )
    return found
