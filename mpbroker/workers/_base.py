"""What every worker process holds and does, whatever its role.

Its slot in the control block (state, pid, heartbeat, counters: the supervisor judges it by
them), its stats block (what the admin API shows of it), its own doorbell (writers wake it
through it), MemWatch's garbage collection at the broker's memory level, the summaries of
collapsed log lines (`mpbroker.logs`), and the watch for settings the supervisor reloaded
on SIGHUP. `StopOnSignal` is how a synchronous worker's
loop stops.
"""

from __future__ import annotations

import os
import signal
import time
from types import FrameType

import msgspec

from mpbroker.admin import WorkerStats, encode, stats_period_ms, without_details
from mpbroker.clock import epoch_ms
from mpbroker.config import Config
from mpbroker.logs import flush_collapsed
from mpbroker.shm import STATE_READY, ControlBlock, Doorbell, StatsBlock

from ._gc import LevelGC
from ._layout import WorkerSpec
from ._reload import ConfigWatch

__all__ = ["StopOnSignal", "WorkerBase", "publish"]


class StopOnSignal:
    """SIGTERM or SIGINT asks a synchronous worker's loop to stop at the top of its next turn
    (``while not stop.requested``), then it closes what it holds. (The trio gateway waits on
    trio's signal receiver instead; these are the handlers it finds and puts back, so a late
    signal while it closes is only noted.)

    Raising from the handler instead stopped the loop wherever it was (in a store commit, in
    a ring write) and, when a second signal came while the worker was closing (Ctrl-C reaches
    every process of the group, then the supervisor's SIGTERM follows), broke off the close:
    logged as a crash. The handler only sets the flag and rings the worker's own doorbell, so
    a parked loop wakes at once. Install it first thing: a signal that comes before the
    doorbell exists is seen at the first turn.
    """

    def __init__(self) -> None:
        self.requested = False
        self._bell: Doorbell | None = None
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def wake(self, bell: Doorbell) -> None:
        """Ring `bell` (the worker parks on it) when a stop is asked for."""
        self._bell = bell

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        bell = self._bell
        if bell is not None and not bell.closed:
            bell.ring()


def publish(block: StatsBlock, snapshot: WorkerStats) -> None:
    """Write `snapshot` as JSON, whatever its size (a large one goes to the block's spill
    file); if even that cannot be written (/dev/shm is full), say so in one without its
    lists, which counts what it leaves out."""
    data = encode(snapshot)
    try:
        block.write(data)
    except OSError as exc:
        error = f"state of {len(data)} bytes cannot be published: {exc.strerror or exc}"
        # Without its lists it is a few hundred bytes: it fits the block itself.
        block.write(encode(without_details(snapshot, error)))


class WorkerBase:
    """The shared-memory side of one worker process; `bell` names its own doorbell.
    `reloads`: whether it takes settings reloaded on SIGHUP (a replay worker has none)."""

    def __init__(self, spec: WorkerSpec, bell: str, *, reloads: bool = True) -> None:
        self.spec = spec
        layout = spec.layout
        self.control = ControlBlock.attach(layout.control)
        self.slot = self.control.slot(spec.slot)
        self.stats = StatsBlock.attach(layout.stats(spec.slot))
        self.doorbell = Doorbell.create(bell)
        self.level_gc = LevelGC(self.control, spec.config)
        self.config_watch = ConfigWatch(self.control, spec) if reloads else None
        self.parent = os.getppid()
        self._next_stats_ms = 0
        # The snapshot being built: when it was due (epoch ms) and when building started.
        self._stats_due_ms: int | None = None
        self._stats_started = 0.0
        self._publish_ms: float | None = None  # what the previous snapshot cost

    @property
    def memwatch_level(self) -> int:
        return self.control.memwatch_level

    @property
    def memwatch_permille(self) -> int:
        """MemWatch's last reading, in thousandths of max_memory."""
        return self.control.memwatch_permille

    def ready(self) -> None:
        """Serving: the supervisor sees the worker ready (with a fresh heartbeat)."""
        self.slot.pid = os.getpid()
        self.slot.incarnation = self.spec.incarnation
        self.slot.beat()  # before READY: the supervisor judges ready workers by it
        self.slot.state = STATE_READY

    def turn(self) -> Config | None:
        """Once per turn of the worker's loop: the heartbeat (the loop turns), garbage
        collection at MemWatch's level, the summaries of collapsed log lines whose window
        ended; the reloaded settings, when SIGHUP brought some."""
        self.slot.beat()
        self.level_gc.tick()
        flush_collapsed()
        return self.config_watch.poll() if self.config_watch is not None else None

    def publish_stats(self, snapshot: WorkerStats) -> None:
        """Publish what the admin API shows of the worker, with what the previous snapshot
        cost (`publish_ms`). After `stats_due`, the cost counts building the snapshot too,
        and a costly one puts the next one off (`stats_period_ms`)."""
        due = self._stats_due_ms
        started = self._stats_started if due is not None else time.perf_counter()
        publish(self.stats, msgspec.structs.replace(snapshot, publish_ms=self._publish_ms))
        cost_ms = (time.perf_counter() - started) * 1000
        self._publish_ms = round(cost_ms, 2)
        if due is not None:
            self._stats_due_ms = None
            interval = self.spec.config.admin.stats_interval_ms
            self._next_stats_ms = due + stats_period_ms(interval, cost_ms)

    def stats_due(self) -> int | None:
        """The time now (epoch ms) when another snapshot is due (every
        `admin.stats_interval_ms`, or less often when they cost much), else None. The
        caller builds it and hands it to `publish_stats`."""
        now = epoch_ms()
        if now < self._next_stats_ms:
            return None
        self._next_stats_ms = now + self.spec.config.admin.stats_interval_ms
        self._stats_due_ms = now
        self._stats_started = time.perf_counter()
        return now

    def supervisor_gone(self) -> bool:
        """Our parent (the fork server, which lives as long as the supervisor) is gone."""
        return os.getppid() != self.parent

    def close(self) -> None:
        flush_collapsed(everything=True)  # what was only counted is said before we go
        self.doorbell.close()
        self.stats.close()
        self.control.close()
