"""What MemWatch measures: the memory of every process of the broker and its segments.

I/O (psutil, /proc, /dev/shm); the arithmetic on what it reads is `private_pss_bytes`.
"""

from __future__ import annotations

import contextlib
import os

import psutil

from mpbroker.shm import SHM_DIR

from ._memwatch import private_pss_bytes

__all__ = ["broker_memory_bytes"]


def broker_memory_bytes(instance: str) -> int:
    """The broker's memory now: the proportional set size (PSS) of every one of its
    processes -- pages shared between them, like the modules the fork server imported
    for all workers, count once -- without their shared-memory mappings, plus its
    shared-memory segments, counted once and whole. Its processes are the calling one (the
    supervisor) and all its descendants: the fork server and the workers it forked, each
    listed once. `instance` names the segments (`mpb.<instance>.*`)."""
    me = psutil.Process()
    total = 0
    for process in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error, OSError):
            total += _process_memory(process)
    prefix = f"mpb.{instance}."
    with contextlib.suppress(OSError):
        for entry in os.scandir(SHM_DIR):
            if entry.name.startswith(prefix):
                with contextlib.suppress(OSError):
                    total += entry.stat().st_blocks * 512
    return total


def _process_memory(process: psutil.Process) -> int:
    """PSS without shared-memory mappings (smaps_rollup, Linux 4.14+), else USS."""
    try:
        with open(f"/proc/{process.pid}/smaps_rollup", encoding="ascii") as f:
            pss = private_pss_bytes(f.read())
    except OSError:
        pss = None
    return pss if pss is not None else int(process.memory_full_info().uss)
