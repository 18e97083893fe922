"""Segment names, remove_instance and sweep_stale (dead pids, pid reuse, live brokers)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import posix_ipc
import pytest

from mpbroker.shm import (
    MIN_CAPACITY,
    SHM_DIR,
    ControlBlock,
    Doorbell,
    Ring,
    remove_instance,
    segment_name,
    shm_path,
    sweep_stale,
)


def test_segment_name() -> None:
    assert segment_name("123", "g0-p1") == "/mpb.123.g0-p1"
    assert segment_name("123t4", "bell.gateway_0") == "/mpb.123t4.bell.gateway_0"


@pytest.mark.parametrize(
    ("instance", "purpose"),
    [
        ("", "x"),
        ("abc", "x"),  # must start with the pid
        ("12.3", "x"),  # a dot would end the instance
        ("12/3", "x"),
        ("12", ""),
        ("12", "a/b"),
        ("12", "a b"),
        ("12", "x" * 300),
    ],
)
def test_segment_name_rejects(instance: str, purpose: str) -> None:
    with pytest.raises(ValueError, match=r"instance|purpose|longer"):
        segment_name(instance, purpose)


def test_shm_path() -> None:
    assert shm_path("/mpb.1.x") == SHM_DIR / "mpb.1.x"
    assert shm_path("mpb.1.x") == pathlib.Path("/dev/shm/mpb.1.x")
    for bad in ("/", "/a/b", "/..", ""):
        with pytest.raises(ValueError):
            shm_path(bad)


def test_remove_instance_removes_every_kind_of_entry(instance: str) -> None:
    ring = Ring.create(segment_name(instance, "ring"), MIN_CAPACITY)
    bell = Doorbell.create(segment_name(instance, "bell"))
    block = ControlBlock.create(segment_name(instance, "control"), 2)
    sem = posix_ipc.Semaphore(segment_name(instance, "lock"), posix_ipc.O_CREX, mode=0o600)
    # A neighbour whose name starts like ours must survive.
    neighbour = Ring.create(segment_name(instance + "0", "ring"), MIN_CAPACITY)
    try:
        removed = remove_instance(instance)
        assert removed == sorted(
            [
                f"mpb.{instance}.ring",
                f"mpb.{instance}.bell",
                f"mpb.{instance}.control",
                f"sem.mpb.{instance}.lock",
            ]
        )
        assert remove_instance(instance) == []
        assert shm_path(neighbour.name).exists()
        # Mapped handles keep working after their names are gone.
        assert ring.writer().try_put(1, b"still here")
        assert ring.reader().read_batch() == [(1, b"still here")]
    finally:
        ring.close()
        bell.close()
        block.close()
        sem.close()
        neighbour.close()
        neighbour.unlink()
    with pytest.raises(ValueError):
        remove_instance("not-a-pid")


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def sleeper_factory() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def sleeper(procs: list[subprocess.Popen[bytes]], *extra_args: str) -> int:
    """A live process; with "mpbroker" among its arguments it looks like a broker."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", *extra_args])
    procs.append(p)
    # Wait until exec has happened, so /proc/<pid>/cmdline shows the new command line.
    for _ in range(1000):
        with open(f"/proc/{p.pid}/cmdline", "rb") as f:
            if b"time.sleep" in f.read():
                break
        os.sched_yield()
    return p.pid


def make_entries(directory: pathlib.Path, instance: str) -> list[str]:
    names = [f"mpb.{instance}.ring", f"mpb.{instance}.ctl.v1", f"sem.mpb.{instance}.lock"]
    for n in names:
        (directory / n).write_bytes(b"")
    os.mkfifo(directory / f"mpb.{instance}.bell")
    return sorted([*names, f"mpb.{instance}.bell"])


def test_sweep_stale_decisions(
    tmp_path: pathlib.Path, sleeper_factory: list[subprocess.Popen[bytes]]
) -> None:
    dead = dead_pid()
    broker = sleeper(sleeper_factory, "mpbroker")
    reused = sleeper(sleeper_factory)  # a live pid that is not a broker: pid reuse
    dead_entries = make_entries(tmp_path, str(dead)) + make_entries(tmp_path, f"{dead}t7")
    reused_entries = make_entries(tmp_path, str(reused))
    kept = (
        make_entries(tmp_path, str(broker))
        + make_entries(tmp_path, f"{broker}t3")
        + make_entries(tmp_path, f"{os.getpid()}t99")  # our own pid is always live
    )
    unrelated = ["mpb.notapid.x", "mpbroker.log", "sem.other", f"mpb.{dead}", "psm_1234"]
    for n in unrelated:
        (tmp_path / n).write_bytes(b"")

    removed = sweep_stale(tmp_path)

    assert removed == sorted(dead_entries + reused_entries)
    assert sorted(os.listdir(tmp_path)) == sorted(kept + unrelated)
    assert sweep_stale(tmp_path) == []
    assert sweep_stale(tmp_path / "missing") == []


def _other_live_owners() -> list[str]:
    """Entries in /dev/shm that sweep_stale() would remove although their pid is alive: those
    of other processes that use our naming without "mpbroker" in their command line (another
    developer's test run, say). Touching those would break someone else's run."""
    from mpbroker.shm._naming import _ENTRY_RE, _pid_is_live_broker

    risky = []
    for entry in os.listdir(SHM_DIR):
        m = _ENTRY_RE.fullmatch(entry)
        if m is None:
            continue
        pid = int(m.group(2))
        if not _pid_is_live_broker(pid) and os.path.exists(f"/proc/{pid}"):
            risky.append(entry)
    return risky


def test_sweep_stale_in_dev_shm(sleeper_factory: list[subprocess.Popen[bytes]]) -> None:
    dead = f"{dead_pid()}t1"
    live = f"{sleeper(sleeper_factory, 'mpbroker')}t1"
    dead_ring = Ring.create(segment_name(dead, "ring"), MIN_CAPACITY)
    dead_bell = Doorbell.create(segment_name(dead, "bell"))
    dead_sem = posix_ipc.Semaphore(segment_name(dead, "lock"), posix_ipc.O_CREX, mode=0o600)
    live_ring = Ring.create(segment_name(live, "ring"), MIN_CAPACITY)
    try:
        if risky := _other_live_owners():
            pytest.skip(f"another live process uses mpb.* names in /dev/shm: {risky[:3]}")
        removed = sweep_stale()
        assert {f"mpb.{dead}.ring", f"mpb.{dead}.bell", f"sem.mpb.{dead}.lock"} <= set(removed)
        assert not any(live in n for n in removed)
        assert shm_path(live_ring.name).exists()
    finally:
        for handle in (dead_ring, dead_bell, live_ring):
            handle.close()
        dead_sem.close()
        remove_instance(dead)
        remove_instance(live)
