"""The broker's fixed memory cost: what its processes hold with no traffic at all.

``python -m bench.fixedcost [--json]`` starts a broker with the default process set on free
loopback ports with a temporary data directory (:class:`mpbroker.harness.BrokerProcess`), waits
until a STOMP client can connect, lets it settle, then samples every broker process (the
supervisor and all its descendants, by pid) a few times with psutil's ``memory_full_info``:
PSS (shared pages split between the processes that map them: the sum over processes is the
machine's real cost), USS (pages only that process maps) and RSS. It prints one row per process
(the median of the samples), the totals, the fixed cost by role and the bytes of the broker's
segments in /dev/shm; then stops the broker with SIGTERM and checks that none of its processes
and none of its /dev/shm entries is left.

Exit status: 0 when the broker started, was measured and left nothing behind; 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from mpbroker.harness import BrokerProcess, FrameTimeout, RawClient, ServerError, StompError
from mpbroker.loadgen.control import describe
from mpbroker.shm import SHM_DIR

__all__ = ["Measurement", "format_table", "main", "measure"]

_CONNECT_TIMEOUT_S = 10.0


def _mib(n: float) -> float:
    return round(n / 2**20, 1)


def _say(text: str) -> None:
    print(f"fixedcost: {text}", file=sys.stderr, flush=True)


def _title(process: psutil.Process) -> str:
    """``gateway 0`` for ``mpbroker: gateway 0`` (the broker titles its processes)."""
    try:
        title = " ".join(process.cmdline()).strip()
    except psutil.Error:
        return f"pid {process.pid}"
    if title.startswith("mpbroker:"):
        return title.removeprefix("mpbroker:").strip()
    if "resource_tracker" in title:
        return "resource_tracker"  # multiprocessing's (spawn and forkserver start one)
    if "forkserver" in title:
        return "multiprocessing forkserver"
    with contextlib.suppress(psutil.Error):
        return f"{process.name()} {process.pid}"
    return f"pid {process.pid}"


def _role(title: str) -> str:
    """``gateway`` for ``gateway 0``; titles without an index are their own role."""
    head, _, tail = title.rpartition(" ")
    return head if head and tail.isdigit() else title


@dataclass
class _Proc:
    pid: int
    title: str
    pss: list[int] = field(default_factory=list)
    uss: list[int] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "title": self.title,
            "role": _role(self.title),
            "pss": int(statistics.median(self.pss)),
            "uss": int(statistics.median(self.uss)),
            "rss": int(statistics.median(self.rss)),
        }


@dataclass
class Measurement:
    processes: list[dict[str, Any]]
    total_pss_samples: list[int]
    shm_size: int
    shm_resident: int
    shm_entries: int
    left_behind: list[str]
    stop_status: int | None

    @property
    def ok(self) -> bool:
        return not self.left_behind and self.stop_status == 0

    def summary(self) -> dict[str, Any]:
        by_role: dict[str, list[int]] = {}
        for p in self.processes:
            by_role.setdefault(p["role"], []).append(p["pss"])
        return {
            "processes": self.processes,
            "process_count": len(self.processes),
            "total_pss": int(statistics.median(self.total_pss_samples)),
            "total_pss_mib": _mib(statistics.median(self.total_pss_samples)),
            "total_uss": sum(p["uss"] for p in self.processes),
            "total_rss": sum(p["rss"] for p in self.processes),
            "by_role_pss_mib": {
                role: {"count": len(values), "each_mib": _mib(statistics.mean(values))}
                for role, values in by_role.items()
            },
            "shm_bytes": self.shm_size,
            "shm_resident_bytes": self.shm_resident,
            "shm_entries": self.shm_entries,
            "left_behind": self.left_behind,
            "stop_status": self.stop_status,
            "ok": self.ok,
        }


def _shm(server: BrokerProcess) -> tuple[int, int, int]:
    """Size, resident bytes and number of the broker's /dev/shm entries."""
    size = resident = count = 0
    for name in server.shm_entries():
        with contextlib.suppress(OSError):
            st = os.stat(os.path.join(SHM_DIR, name))
            size += st.st_size
            resident += st.st_blocks * 512
            count += 1
    return size, resident, count


def _wait_connectable(host: str, port: int) -> None:
    deadline = time.monotonic() + _CONNECT_TIMEOUT_S
    while True:
        try:
            conn = RawClient(host, port, _CONNECT_TIMEOUT_S)
            try:
                conn.connect()
                conn.disconnect()
            finally:
                conn.close()
            return
        except (OSError, FrameTimeout, StompError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def measure(
    *, samples: int = 3, settle_s: float = 2.0, interval_s: float = 0.5, gateways: int | None = None
) -> Measurement:
    """Start a default broker, measure it idle, stop it; see the module's docstring."""
    # The default broker serves the admin API (a thread of the supervisor): keep it, on a
    # free port, so it is part of what is measured.
    server = BrokerProcess(gateways=gateways, admin=True)
    procs: dict[int, _Proc] = {}
    seen: list[psutil.Process] = []
    totals: list[int] = []
    shm = (0, 0, 0)
    status: int | None = None
    try:
        server.start()
        _say(f"broker (pid {server.pid}) ready on {server.host}:{server.port}")
        _wait_connectable(server.host, server.port)
        time.sleep(settle_s)
        for n in range(samples):
            if n:
                time.sleep(interval_s)
            total = 0
            for process in server.processes():
                try:
                    full = process.memory_full_info()
                except psutil.Error:
                    continue  # exited meanwhile
                entry = procs.get(process.pid)
                if entry is None:
                    entry = procs[process.pid] = _Proc(process.pid, _title(process))
                    seen.append(process)
                entry.pss.append(int(full.pss))
                entry.uss.append(int(full.uss))
                entry.rss.append(int(full.rss))
                total += int(full.pss)
            totals.append(total)
        shm = _shm(server)
    finally:
        with contextlib.suppress(psutil.Error):
            for process in server.processes() if server.process else []:
                if process.pid not in procs:
                    seen.append(process)
                    procs[process.pid] = _Proc(process.pid, _title(process))
        status = server.stop()
    # Everything the broker started must be gone, and its segments with it.
    _gone, alive = psutil.wait_procs(seen, timeout=5)
    left = [f"pid {p.pid} ({procs[p.pid].title})" for p in alive]
    for process in alive:
        with contextlib.suppress(psutil.Error):
            if process.status() == psutil.STATUS_ZOMBIE:
                left.remove(f"pid {process.pid} ({procs[process.pid].title})")
    left_shm = _shm(server)[2]
    if left_shm:
        left.append(f"{left_shm} entries mpb.{server.pid}.* in {SHM_DIR}")
    rows = [p.row() for p in procs.values() if p.pss]
    return Measurement(rows, totals, shm[0], shm[1], shm[2], left, status)


def format_table(s: dict[str, Any]) -> str:
    lines = [
        f"{'pid':>8}  {'process':<28} {'PSS MiB':>8} {'USS MiB':>8} {'RSS MiB':>8}",
    ]
    for p in s["processes"]:
        lines.append(
            f"{p['pid']:>8}  {p['title']:<28} {_mib(p['pss']):>8} {_mib(p['uss']):>8}"
            f" {_mib(p['rss']):>8}"
        )
    lines.append(
        f"{'':>8}  {'total (' + str(s['process_count']) + ' processes)':<28}"
        f" {s['total_pss_mib']:>8} {_mib(s['total_uss']):>8} {_mib(s['total_rss']):>8}"
    )
    lines.append(
        "PSS by role (MiB each): "
        + ", ".join(
            f"{role} {v['each_mib']}" + (f" x{v['count']}" if v["count"] > 1 else "")
            for role, v in s["by_role_pss_mib"].items()
        )
    )
    lines.append(
        f"/dev/shm: {s['shm_entries']} entries, {_mib(s['shm_bytes'])} MiB mapped size,"
        f" {_mib(s['shm_resident_bytes'])} MiB resident"
    )
    if s["left_behind"]:
        lines.append("LEFT BEHIND: " + "; ".join(s["left_behind"]))
    if s["stop_status"] != 0:
        lines.append(f"the broker exited with status {s['stop_status']} after SIGTERM")
    lines.append("ok" if s["ok"] else "FAILED")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fixedcost",
        description="Start a default broker, measure the memory (PSS, USS, RSS) of each of its"
        " processes with no traffic, stop it and check that nothing is left.",
    )
    parser.add_argument("--samples", type=int, default=3, help="samples per process (default 3)")
    parser.add_argument(
        "--settle", type=float, default=2.0, help="seconds idle before sampling (default 2)"
    )
    parser.add_argument(
        "--gateways", type=int, metavar="N", help="gateway processes (default: one per CPU)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args(argv)
    if args.samples < 1 or args.settle < 0:
        parser.error("--samples must be at least 1 and --settle not negative")
    try:
        result = measure(samples=args.samples, settle_s=args.settle, gateways=args.gateways)
    except (ServerError, OSError, FrameTimeout, StompError) as exc:
        _say(f"aborted: {describe(exc)}")
        return 1
    summary = result.summary()
    print(json.dumps(summary) if args.json else format_table(summary), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
