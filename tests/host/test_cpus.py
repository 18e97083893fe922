"""Usable CPUs: the cgroup quota parsers, the count, and reading fake /proc and cgroup trees."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpbroker.host import UsableCpus, count_from, parse_cfs, parse_cpu_max, usable_cpus

MALFORMED = ["", "\n", "garbage", "abc def", "150000", "-5 100000", "150000 0", "1.5 1", "1 2 3"]


def fake_proc(tmp_path: Path, cgroup: str | None) -> Path:
    """A /proc/self whose `cgroup` file says `cgroup` (no file when None)."""
    proc = tmp_path / "proc"
    proc.mkdir()
    if cgroup is not None:
        (proc / "cgroup").write_text(cgroup)
    return proc


def fake_v2(tmp_path: Path, cpu_max: dict[str, str], mount: str = "") -> Path:
    """A cgroup v2 hierarchy (at `mount` below the returned root) with `cpu.max` files."""
    root = tmp_path / "cgroup"
    hierarchy = root / mount
    hierarchy.mkdir(parents=True)
    (hierarchy / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    for cgroup, text in cpu_max.items():
        directory = hierarchy / cgroup.lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpu.max").write_text(text + "\n")
    return root


def fake_v1(tmp_path: Path, cfs: dict[str, tuple[str, str]], mount: str = "cpu,cpuacct") -> Path:
    """A cgroup v1 cpu hierarchy mounted at `mount` with (quota, period) CFS files."""
    root = tmp_path / "cgroup"
    (root / mount).mkdir(parents=True)
    for cgroup, (quota, period) in cfs.items():
        directory = root / mount / cgroup.lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpu.cfs_quota_us").write_text(quota + "\n")
        (directory / "cpu.cfs_period_us").write_text(period + "\n")
    return root


# --- parsers -------------------------------------------------------------------------------


def test_cpu_max_of_max_is_no_limit() -> None:
    assert parse_cpu_max("max 100000\n") is None
    assert parse_cpu_max("max") is None


def test_cpu_max_quota_over_period_is_cpus() -> None:
    assert parse_cpu_max("150000 100000\n") == 1.5
    assert parse_cpu_max("50000 100000") == 0.5


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_cpu_max_is_no_limit(text: str) -> None:
    assert parse_cpu_max(text) is None


def test_cfs_quota_over_period_is_cpus() -> None:
    assert parse_cfs("50000\n", "100000\n") == 0.5
    assert parse_cfs("250000", "100000") == 2.5


def test_cfs_quota_minus_one_is_no_limit() -> None:
    assert parse_cfs("-1\n", "100000\n") is None


@pytest.mark.parametrize(("quota", "period"), [("", "100000"), ("x", "100000"), ("50000", "0")])
def test_malformed_cfs_is_no_limit(quota: str, period: str) -> None:
    assert parse_cfs(quota, period) is None


# --- count_from ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("affinity", "quota", "count"),
    [
        (64, 1.5, 2),  # a fractional quota rounds up
        (64, 0.2, 1),  # never below one
        (64, 2.0, 2),
        (4, 8.0, 4),  # the affinity caps a generous quota
        (2, None, 2),
        (1, None, 1),
        (8, math.inf, 8),
    ],
)
def test_count_is_affinity_capped_by_quota_rounded_up(
    affinity: int, quota: float | None, count: int
) -> None:
    assert count_from(affinity, quota) == count


@given(
    affinity=st.integers(min_value=1, max_value=4096),
    quota=st.none() | st.floats(min_value=0.001, max_value=1e6, allow_nan=False),
)
def test_count_is_between_one_and_affinity_and_covers_the_quota(
    affinity: int, quota: float | None
) -> None:
    count = count_from(affinity, quota)
    assert 1 <= count <= affinity
    if quota is not None and quota <= affinity:
        assert count >= math.ceil(quota)
    if quota is None:
        assert count == affinity


# --- why -----------------------------------------------------------------------------------


def test_why_names_the_quota_source_and_rounding() -> None:
    cpus = UsableCpus(2, 2, 2, 1.5, "cgroup v2 cpu.max of /docker/abc: 150000 100000")
    assert cpus.why() == (
        "2 usable CPUs: affinity allows 2 of 2 online; "
        "cgroup v2 cpu.max of /docker/abc: 150000 100000 = 1.5 CPUs, rounded up"
    )


def test_why_without_quota_says_no_limit() -> None:
    cpus = UsableCpus(2, 2, 2, None, "")
    assert cpus.why() == "2 usable CPUs: affinity allows 2 of 2 online; no cgroup CPU limit"


def test_why_uses_singular_and_does_not_round_a_whole_quota() -> None:
    cpus = UsableCpus(1, 8, 8, 1.0, "cgroup v2 cpu.max of /: 100000 100000")
    assert cpus.why() == (
        "1 usable CPU: affinity allows 8 of 8 online; cgroup v2 cpu.max of /: 100000 100000 = 1 CPU"
    )


def test_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        UsableCpus(0, 1, 1, None, "")


# --- usable_cpus over fake trees -----------------------------------------------------------


def test_v2_max_is_no_limit(tmp_path: Path) -> None:
    root = fake_v2(tmp_path, {"/docker/abc": "max 100000"})
    cpus = usable_cpus(fake_proc(tmp_path, "0::/docker/abc\n"), root, affinity=4)
    assert (cpus.count, cpus.affinity, cpus.quota, cpus.quota_source) == (4, 4, None, "")
    assert cpus.why().endswith("; no cgroup CPU limit")


def test_v2_quota_of_one_and_a_half_on_64_cpus_gives_2(tmp_path: Path) -> None:
    root = fake_v2(tmp_path, {"/docker/abc": "150000 100000"})
    cpus = usable_cpus(fake_proc(tmp_path, "0::/docker/abc\n"), root, affinity=64)
    assert cpus.count == 2
    assert cpus.quota == 1.5
    assert cpus.quota_source == "cgroup v2 cpu.max of /docker/abc: 150000 100000"
    assert cpus.why().startswith("2 usable CPUs: affinity allows 64 of ")
    assert cpus.why().endswith("/docker/abc: 150000 100000 = 1.5 CPUs, rounded up")


def test_v2_limit_on_parent_applies_to_child(tmp_path: Path) -> None:
    root = fake_v2(
        tmp_path, {"/system.slice": "200000 100000", "/system.slice/x.service": "max 100000"}
    )
    cpus = usable_cpus(fake_proc(tmp_path, "0::/system.slice/x.service\n"), root, affinity=16)
    assert cpus.count == 2
    assert cpus.quota_source == "cgroup v2 cpu.max of /system.slice: 200000 100000"


@pytest.mark.parametrize(
    ("parent", "child", "quota", "source"),
    [
        ("300000 100000", "150000 100000", 1.5, "/a/b: 150000 100000"),
        ("150000 100000", "300000 100000", 1.5, "/a: 150000 100000"),
    ],
)
def test_v2_tighter_of_parent_and_child_wins(
    tmp_path: Path, parent: str, child: str, quota: float, source: str
) -> None:
    root = fake_v2(tmp_path, {"/a": parent, "/a/b": child})
    cpus = usable_cpus(fake_proc(tmp_path, "0::/a/b\n"), root, affinity=8)
    assert (cpus.count, cpus.quota) == (2, quota)
    assert cpus.quota_source == f"cgroup v2 cpu.max of {source}"


def test_v2_missing_own_directory_falls_back_to_the_root(tmp_path: Path) -> None:
    # A container shown its host path: /docker/abc is not under the mounted hierarchy.
    root = fake_v2(tmp_path, {"/": "100000 100000"})
    cpus = usable_cpus(fake_proc(tmp_path, "0::/docker/abc\n"), root, affinity=8)
    assert (cpus.count, cpus.quota) == (1, 1.0)
    assert cpus.quota_source == "cgroup v2 cpu.max of /: 100000 100000"


def test_v2_path_outside_the_namespace_reads_only_the_root(tmp_path: Path) -> None:
    root = fake_v2(tmp_path, {"/": "300000 100000"})
    cpus = usable_cpus(fake_proc(tmp_path, "0::/../../elsewhere\n"), root, affinity=8)
    assert (cpus.count, cpus.quota_source) == (3, "cgroup v2 cpu.max of /: 300000 100000")


def test_v2_in_hybrid_unified_mount_is_read(tmp_path: Path) -> None:
    root = fake_v2(tmp_path, {"/user.slice": "100000 100000"}, mount="unified")
    cpus = usable_cpus(fake_proc(tmp_path, "0::/user.slice\n"), root, affinity=4)
    assert cpus.count == 1


def test_v2_file_without_cgroup_controllers_is_ignored(tmp_path: Path) -> None:
    root = fake_v2(tmp_path, {"/a": "100000 100000"})
    (root / "cgroup.controllers").unlink()
    cpus = usable_cpus(fake_proc(tmp_path, "0::/a\n"), root, affinity=4)
    assert (cpus.count, cpus.quota) == (4, None)


def test_v1_cfs_half_cpu_on_8_gives_1(tmp_path: Path) -> None:
    root = fake_v1(tmp_path, {"/docker/abc": ("50000", "100000")})
    cpus = usable_cpus(fake_proc(tmp_path, "4:cpu,cpuacct:/docker/abc\n"), root, affinity=8)
    assert (cpus.count, cpus.quota) == (1, 0.5)
    assert cpus.quota_source == (
        "cgroup v1 cpu.cfs_quota_us/cpu.cfs_period_us of /docker/abc: 50000 100000"
    )


def test_v1_quota_minus_one_is_no_limit(tmp_path: Path) -> None:
    root = fake_v1(tmp_path, {"/": ("-1", "100000"), "/docker/abc": ("-1", "100000")})
    cpus = usable_cpus(fake_proc(tmp_path, "4:cpu,cpuacct:/docker/abc\n"), root, affinity=8)
    assert (cpus.count, cpus.quota, cpus.quota_source) == (8, None, "")


def test_v1_cpu_mounted_alone_and_parent_limit_applies(tmp_path: Path) -> None:
    # As on this project's CI host: `1:cpu:/`, with cpu and cpuacct mounted apart.
    root = fake_v1(tmp_path, {"/a": ("200000", "100000")}, mount="cpu")
    proc = fake_proc(tmp_path, "2:cpuacct:/a/b\n1:cpu:/a/b\n0::/a/b\n")
    cpus = usable_cpus(proc, root, affinity=8)
    assert (cpus.count, cpus.quota) == (2, 2.0)


def test_v1_missing_own_directory_falls_back_to_the_root(tmp_path: Path) -> None:
    root = fake_v1(tmp_path, {"/": ("150000", "100000")})
    cpus = usable_cpus(fake_proc(tmp_path, "4:cpu,cpuacct:/docker/abc\n"), root, affinity=8)
    assert (cpus.count, cpus.quota) == (2, 1.5)


def test_hybrid_takes_the_smaller_of_v1_and_v2(tmp_path: Path) -> None:
    root = fake_v2(tmp_path, {"/a": "300000 100000"})
    (root / "cpu").mkdir()
    (root / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (root / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    cpus = usable_cpus(fake_proc(tmp_path, "1:cpu:/a\n0::/a\n"), root, affinity=8)
    assert (cpus.count, cpus.quota) == (1, 1.0)
    assert cpus.quota_source.startswith("cgroup v1 ")


def test_affinity_of_one_without_quota_gives_1(tmp_path: Path) -> None:
    root = fake_v2(tmp_path, {})
    cpus = usable_cpus(fake_proc(tmp_path, "0::/\n"), root, affinity=1)
    assert cpus.count == 1
    assert cpus.why().startswith("1 usable CPU: affinity allows 1 of ")


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_cpu_max_counts_as_no_limit_and_names_no_source(
    tmp_path: Path, text: str
) -> None:
    root = fake_v2(tmp_path, {"/a": text})
    cpus = usable_cpus(fake_proc(tmp_path, "0::/a\n"), root, affinity=4)
    assert (cpus.count, cpus.quota, cpus.quota_source) == (4, None, "")
    assert cpus.why().endswith("; no cgroup CPU limit")


def test_malformed_cfs_and_proc_lines_count_as_no_limit(tmp_path: Path) -> None:
    root = fake_v1(tmp_path, {"/a": ("lots", "100000")})
    proc = fake_proc(tmp_path, "nonsense\n\x00\n4:cpu,cpuacct:/a\n")
    cpus = usable_cpus(proc, root, affinity=4)
    assert (cpus.count, cpus.quota, cpus.quota_source) == (4, None, "")


def test_unreadable_cpu_max_counts_as_no_limit(tmp_path: Path) -> None:
    # A directory where the file should be: reading it fails with an OSError.
    root = fake_v2(tmp_path, {})
    (root / "a" / "cpu.max").mkdir(parents=True)
    cpus = usable_cpus(fake_proc(tmp_path, "0::/a\n"), root, affinity=4)
    assert (cpus.count, cpus.quota) == (4, None)


def test_no_proc_and_no_cgroup_tree_is_no_limit(tmp_path: Path) -> None:
    cpus = usable_cpus(tmp_path / "no-proc", tmp_path / "no-cgroup", affinity=3)
    assert (cpus.count, cpus.affinity, cpus.quota, cpus.quota_source) == (3, 3, None, "")


def test_no_proc_cgroup_file_still_is_no_limit(tmp_path: Path) -> None:
    root = fake_v2(tmp_path, {"/": "100000 100000"})
    cpus = usable_cpus(fake_proc(tmp_path, None), root, affinity=3)
    assert (cpus.count, cpus.quota) == (3, None)


# --- this machine --------------------------------------------------------------------------


def test_real_machine_count_is_affinity_capped_by_its_quota() -> None:
    cpus = usable_cpus()
    assert cpus.affinity == len(os.sched_getaffinity(0))
    assert cpus.online == os.cpu_count()
    assert 1 <= cpus.count <= cpus.affinity
    assert cpus.count == count_from(cpus.affinity, cpus.quota)
    if cpus.quota is None:
        assert cpus.count == cpus.affinity
        assert cpus.quota_source == ""
    else:
        assert cpus.quota_source.startswith("cgroup v")


def test_a_process_pinned_to_one_cpu_has_one_usable_cpu() -> None:
    """The real affinity call, in a child pinned with sched_setaffinity (as taskset or
    systemd's CPUAffinity= would), whatever this machine has."""
    code = (
        "import os\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from mpbroker.host import usable_cpus\n"
        "cpus = usable_cpus()\n"
        "print(cpus.count, cpus.affinity)\n"
        "print(cpus.why())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    counts, why = done.stdout.splitlines()
    assert counts == "1 1"
    assert why.startswith(f"1 usable CPU: affinity allows 1 of {os.cpu_count()} online")
