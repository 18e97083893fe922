"""What MemWatch measures: the memory of every process of the broker and its segments.

I/O (psutil, /proc, /dev/shm); the arithmetic on what it reads is `private_pss_bytes`.
"""

from __future__ import annotations

import contextlib
import os
from typing import NamedTuple

import psutil

from mpbroker.shm import SHM_DIR

from ._memwatch import private_pss_bytes

__all__ = ["MemoryReading", "broker_memory", "broker_memory_bytes"]


class MemoryReading(NamedTuple):
    """One reading: the broker's memory (`total`) and what each of its processes counted
    in it (`processes`, bytes by pid; the segments are in the total only)."""

    total: int
    processes: dict[int, int]


def broker_memory_bytes(instance: str) -> int:
    """The broker's memory now (`broker_memory`'s total)."""
    return broker_memory(instance).total


def broker_memory(instance: str) -> MemoryReading:
    """The broker's memory now: the proportional set size (PSS) of every one of its
    processes -- pages shared between them, like the modules the fork server imported
    for all workers, count once -- without their shared-memory mappings, plus its
    shared-memory segments, counted once and whole. Its processes are the calling one (the
    supervisor) and all its descendants: the fork server and the workers it forked, each
    listed once. `instance` names the segments (`mpb.<instance>.*`)."""
    me = psutil.Process()
    processes: dict[int, int] = {}
    for process in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error, OSError):
            processes[process.pid] = _process_memory(process)
    total = sum(processes.values())
    prefix = f"mpb.{instance}."
    with contextlib.suppress(OSError):
        for entry in os.scandir(SHM_DIR):
            if entry.name.startswith(prefix):
                with contextlib.suppress(OSError):
                    total += entry.stat().st_blocks * 512
    return MemoryReading(total, processes)


def _process_memory(process: psutil.Process) -> int:
    """PSS without shared-memory mappings (smaps_rollup, Linux 4.14+), else USS."""
    try:
        with open(f"/proc/{process.pid}/smaps_rollup", encoding="ascii") as f:
            pss = private_pss_bytes(f.read())
    except OSError:
        pss = None
    return pss if pss is not None else int(process.memory_full_info().uss)
