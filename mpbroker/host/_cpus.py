"""How many CPUs this process may really use: its CPU affinity, capped by cgroup CPU quotas.

`os.cpu_count()` counts the CPUs the host has online, which over-counts twice over: a
`taskset`/`cpuset` affinity mask may allow fewer, and a container's CPU quota (cgroup v2
`cpu.max`, cgroup v1 `cpu.cfs_quota_us`/`cpu.cfs_period_us`) may allow less CPU time than
that. One worker per online CPU in a container limited to 1.5 CPUs on a 64-CPU host means 64
workers throttled onto 1.5 CPUs; the usable count there is 2.

The parsers and `count_from` are pure; `usable_cpus` reads /proc and /sys and never raises:
anything it cannot read or understand counts as "no limit", which is what the broker did
before it looked at all.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["UsableCpus", "count_from", "parse_cfs", "parse_cpu_max", "usable_cpus"]

# Where a cgroup v1 `cpu` controller is mounted under the cgroup root, besides the name
# built from the controller list in /proc/self/cgroup: distributions co-mount cpu with
# cpuacct (and link `cpu` to it) or mount it alone.
_V1_CPU_MOUNTS = ("cpu,cpuacct", "cpuacct,cpu", "cpu")

# Where the cgroup v2 hierarchy is mounted: the cgroup root itself (unified mode) or, in
# systemd's hybrid mode, `unified` below it. Either is recognised by its cgroup.controllers.
_V2_MOUNTS = ("", "unified")


@dataclass(frozen=True, slots=True)
class UsableCpus:
    """How many CPUs this process may use, and the facts that decided it (for logs)."""

    count: int
    """CPUs to plan for: the affinity, capped by the quota rounded up; at least 1."""
    affinity: int
    """CPUs in this process's affinity mask."""
    online: int
    """CPUs the host has online (`os.cpu_count()`)."""
    quota: float | None
    """The tightest cgroup CPU quota on our cgroup or an ancestor, in CPUs; None: no limit."""
    quota_source: str
    """Which file set `quota` and what it said; "" when there is no quota."""

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"usable CPU count must be at least 1, not {self.count}")

    def why(self) -> str:
        """One line for the log: the count and what decided it."""
        head = (
            f"{self.count} usable {_cpus(self.count)}: "
            f"affinity allows {self.affinity} of {self.online} online"
        )
        if self.quota is None:
            return f"{head}; no cgroup CPU limit"
        source = self.quota_source or "cgroup CPU quota"
        limit = f"{source} = {self.quota:g} {_cpus(self.quota)}"
        if not self.quota.is_integer():
            limit += ", rounded up"
        return f"{head}; {limit}"


def _cpus(n: float) -> str:
    return "CPU" if n == 1 else "CPUs"


def _positive_int(token: str) -> int | None:
    # Stricter than int(): the kernel writes plain decimal digits, so "+5", "1_000" or
    # " 7" are not what it wrote, and guessing at them could invent a limit.
    if token.isascii() and token.isdigit():
        value = int(token)
        return value if value > 0 else None
    return None


def parse_cpu_max(text: str) -> float | None:
    """A cgroup v2 `cpu.max` ("$QUOTA $PERIOD", quota may be "max") as CPUs; None: no limit.

    Malformed contents also give None: an unreadable limit is treated as no limit.
    """
    fields = text.split()
    # The kernel always writes both fields; "max" alone is what one may write to the file.
    if len(fields) != 2 or fields[0] == "max":
        return None
    quota, period = _positive_int(fields[0]), _positive_int(fields[1])
    if quota is None or period is None:
        return None
    return quota / period


def parse_cfs(quota_text: str, period_text: str) -> float | None:
    """cgroup v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us` as CPUs; None: no limit.

    A quota of -1 means no limit; malformed contents also give None.
    """
    quota, period = _positive_int(quota_text.strip()), _positive_int(period_text.strip())
    if quota is None or period is None:
        return None
    return quota / period


def count_from(affinity: int, quota: float | None) -> int:
    """Workers to run: `affinity` capped by `quota` rounded up, and never fewer than 1.

    Rounded up because a fraction of a CPU is still CPU time a worker can use: 1.5 CPUs get
    2 workers, 0.2 CPUs get 1. An infinite or NaN quota is no limit.
    """
    limit = affinity
    if quota is not None and math.isfinite(quota):
        limit = min(affinity, math.ceil(quota))
    return max(1, limit)


@dataclass(frozen=True, slots=True)
class _OwnCgroups:
    """Our cgroups as /proc/self/cgroup names them: the v2 path, and the v1 cpu controller."""

    v2_path: str | None
    v1_controllers: str
    v1_path: str | None


def _parse_proc_cgroup(text: str) -> _OwnCgroups:
    # Each line is "hierarchy-ID:controller-list:cgroup-path"; the path may contain ':'.
    v2_path: str | None = None
    v1_controllers, v1_path = "", None
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        hierarchy, controllers, path = fields
        if hierarchy == "0" and controllers == "":
            v2_path = path
        elif "cpu" in controllers.split(","):
            v1_controllers, v1_path = controllers, path
    return _OwnCgroups(v2_path, v1_controllers, v1_path)


def _ancestors(path: str) -> list[str]:
    """`path` and each cgroup above it, deepest first, ending with "/" (the hierarchy root).

    A parent's quota caps all its children, so every level counts. A path with ".." lies
    outside the root our cgroup namespace shows us, so only that root can be read.
    """
    parts = [part for part in path.split("/") if part]
    if any(part in (".", "..") for part in parts):
        parts = []
    return ["/" + "/".join(parts[:depth]) for depth in range(len(parts), -1, -1)]


def _read(path: Path) -> str | None:
    # Missing files, permissions, a vanished cgroup or odd bytes: all mean "cannot tell".
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None


def _exists(path: Path) -> bool:
    # Path.exists() lets PermissionError through; here it only means "cannot look".
    try:
        return path.exists()
    except OSError:
        return False


def _v2_quotas(cgroup_root: Path, path: str) -> list[tuple[float, str]]:
    found: list[tuple[float, str]] = []
    for name in _V2_MOUNTS:
        mount = cgroup_root / name
        if not _exists(mount / "cgroup.controllers"):
            continue
        # The walk reaches the mount's root even when our own directory is not visible
        # there (a container shown a host path), so the container's own limit still counts.
        for cgroup in _ancestors(path):
            text = _read(mount / cgroup.lstrip("/") / "cpu.max")
            if text is None:
                continue
            quota = parse_cpu_max(text)
            if quota is not None:
                found.append((quota, f"cgroup v2 cpu.max of {cgroup}: {' '.join(text.split())}"))
    return found


def _v1_quotas(cgroup_root: Path, controllers: str, path: str) -> list[tuple[float, str]]:
    mounts = [cgroup_root / name for name in (controllers, *_V1_CPU_MOUNTS) if name]
    mount = next((m for m in mounts if _exists(m)), None)
    if mount is None:
        return []
    found: list[tuple[float, str]] = []
    for cgroup in _ancestors(path):
        directory = mount / cgroup.lstrip("/")
        quota_text = _read(directory / "cpu.cfs_quota_us")
        period_text = _read(directory / "cpu.cfs_period_us")
        if quota_text is None or period_text is None:
            continue
        quota = parse_cfs(quota_text, period_text)
        if quota is not None:
            found.append(
                (
                    quota,
                    f"cgroup v1 cpu.cfs_quota_us/cpu.cfs_period_us of {cgroup}: "
                    f"{quota_text.strip()} {period_text.strip()}",
                )
            )
    return found


def usable_cpus(
    proc: Path = Path("/proc/self"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    affinity: int | None = None,
) -> UsableCpus:
    """How many CPUs this process may use: its affinity, capped by the tightest cgroup quota.

    Reads `proc/cgroup` for our cgroups and, under `cgroup_root`, the v2 `cpu.max` and the
    v1 CFS quota of our cgroup and every ancestor; with both (hybrid hosts) the smallest
    quota wins. `affinity` defaults to the size of our CPU affinity mask. Never raises:
    whatever cannot be read counts as no limit.
    """
    if affinity is None:
        affinity = len(os.sched_getaffinity(0))
    own = _parse_proc_cgroup(_read(proc / "cgroup") or "")
    found: list[tuple[float, str]] = []
    if own.v2_path is not None:
        found += _v2_quotas(cgroup_root, own.v2_path)
    if own.v1_path is not None:
        found += _v1_quotas(cgroup_root, own.v1_controllers, own.v1_path)
    quota: float | None = None
    source = ""
    # Strictly smaller, so of equal quotas the deepest (first found) names the source.
    for value, where in found:
        if quota is None or value < quota:
            quota, source = value, where
    return UsableCpus(
        count=count_from(affinity, quota),
        affinity=affinity,
        online=os.cpu_count() or affinity,
        quota=quota,
        quota_source=source,
    )
