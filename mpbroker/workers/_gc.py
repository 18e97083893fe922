"""A worker's side of MemWatch: collect garbage as often as the broker's memory level asks.

The supervisor publishes the level in the control block; reading it is a memory load, so
every worker loop can look (no system call) and run `gc.collect()` when the interval of
the current level has passed.
"""

from __future__ import annotations

import gc
import time

from mpbroker.config import Config
from mpbroker.memwatch import parse_levels
from mpbroker.shm import ControlBlock

__all__ = ["LevelGC"]


class LevelGC:
    def __init__(self, control: ControlBlock, config: Config) -> None:
        self.control = control
        memory = config.memory
        levels = parse_levels(memory.memwatch_levels, memory.memwatch_gc_intervals_ms)
        self.intervals_s = [0.0] + [level.gc_interval_ms / 1000 for level in levels]
        self.last = time.monotonic()
        self.collections = 0

    def tick(self) -> None:
        level = self.control.memwatch_level
        interval = self.intervals_s[level] if level < len(self.intervals_s) else 0.0
        if not interval:
            return
        now = time.monotonic()
        if now - self.last >= interval:
            self.last = now
            gc.collect()
            self.collections += 1
