"""CPU time used by a process and its descendants, read from /proc (Linux).

On a machine with two cores the load generator and the server compete for the same CPUs,
so the report states how much CPU each side used: a server that needs fewer CPU-seconds per
message is the better design even where the wall-clock rate is limited by the clients.
"""

from __future__ import annotations

import os

import psutil

__all__ = [
    "listening_server_pid",
    "process_memory",
    "tree_cpu_by_process",
    "tree_memory_bytes",
]

# What mpbroker's processes call themselves (setproctitle): the supervisor is the root.
_OUR_TITLE = "mpbroker: "

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


def tree_cpu_by_process(pid: int) -> dict[str, float] | None:
    """User + system CPU seconds of ``pid`` and every live descendant, process by process:
    mpbroker's named by their role ("gateway 0", "p2p 0": their title without "mpbroker:
    "), others by command name and pid ("java 4242"). None if ``pid`` is unreadable.

    Descendants that already exited are not counted (their time moves to the parent's
    ``cutime`` only once reaped), so sample while the processes of interest run.
    """
    found: dict[str, float] = {}
    if not _add_cpu(pid, found):
        return None
    return found


def _add_cpu(pid: int, found: dict[str, float]) -> bool:
    fields = _stat_fields(pid)
    if fields is None:
        return False
    # After the command: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    name = _process_name(pid)
    if name in found:
        name = f"{name} {pid}"
    found[name] = (int(fields[11]) + int(fields[12])) / _TICKS_PER_S
    for child in _children(pid):
        _add_cpu(child, found)
    return True


def _process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            title = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        if title.startswith(_OUR_TITLE):
            return title.removeprefix(_OUR_TITLE)
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f"{f.read().strip()} {pid}"
    except OSError:
        return f"pid {pid}"


def tree_memory_bytes(pid: int) -> int | None:
    """Memory of ``pid`` and every live descendant: the sum of their PSS (each shared page
    counted once in all, as the broker's shared-memory rings are), or of their RSS where
    PSS is not readable; None if ``pid`` is not readable."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for process in processes:
        try:
            total += process_memory(process)[0]
        except psutil.Error:
            continue  # it exited meanwhile
    return total


def process_memory(process: psutil.Process) -> tuple[int, int, bool]:
    """(PSS, RSS, True) of `process`, or (RSS, RSS, False) where its PSS is not readable
    (another user's process); psutil.Error if it is gone."""
    try:
        full = process.memory_full_info()
        return int(full.pss), int(full.rss), True
    except (psutil.AccessDenied, AttributeError):
        rss = int(process.memory_info().rss)
        return rss, rss, False


def listening_server_pid(port: int) -> int | None:
    """The process to measure for a server listening on `port` of this host: the one that
    listens there (ActiveMQ's java, RabbitMQ's beam), or for mpbroker, whose gateways
    listen, their supervisor (the root of the processes that call themselves
    "mpbroker: ..."). None when no visible process listens there (another user's, without
    the right to see it)."""
    try:
        connections = psutil.net_connections(kind="inet")
    except psutil.AccessDenied:
        return None
    pids = {
        c.pid
        for c in connections
        if c.pid and c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
    }
    if not pids:
        return None
    try:
        process = psutil.Process(min(pids))
        while _is_ours(process) and (parent := process.parent()) is not None:
            if not _is_ours(parent):
                break
            process = parent
    except psutil.Error:
        return None
    return process.pid


def _is_ours(process: psutil.Process) -> bool:
    try:
        return " ".join(process.cmdline()).startswith(_OUR_TITLE)
    except psutil.Error:
        return False
