"""CPU time used by a process and its descendants, read from /proc (Linux).

On a machine with two cores the load generator and the server compete for the same CPUs,
so the report states how much CPU each side used: a server that needs fewer CPU-seconds per
message is the better design even where the wall-clock rate is limited by the clients.
"""

from __future__ import annotations

import os

__all__ = ["tree_cpu_seconds"]

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces; fields after it
    # start at the last ')'.
    return text[text.rfind(")") + 2 :].split()


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def tree_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` and every live descendant; None if unreadable.

    Descendants that already exited are not counted (their time moves to the parent's
    ``cutime`` only once reaped), so sample while the processes of interest run.
    """
    fields = _stat_fields(pid)
    if fields is None:
        return None
    # After the command: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    total = (int(fields[11]) + int(fields[12])) / _TICKS_PER_S
    for child in _children(pid):
        total += tree_cpu_seconds(child) or 0.0
    return total
