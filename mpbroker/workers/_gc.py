"""A worker's side of MemWatch: collect garbage as often as the broker's memory level asks.

The supervisor publishes the level in the control block; reading it is a memory load, so
every worker loop can look (no system call) and run `gc.collect()` when the interval of
the current level has passed. After collecting, the C heap's free pages go back to the
operating system (glibc `malloc_trim`): message bodies above 512 bytes live in malloc'ed
blocks, and without a trim a process keeps the memory of its largest backlog for good.
"""

from __future__ import annotations

import ctypes
import gc
import time
from collections.abc import Callable

from mpbroker.config import Config, parse_levels
from mpbroker.shm import ControlBlock

__all__ = ["LevelGC", "release_free_heap"]


def _malloc_trim() -> Callable[[], object]:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to give back this way
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


release_free_heap = _malloc_trim()


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
            release_free_heap()
            self.collections += 1
