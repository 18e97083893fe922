"""Segment names, remove_instance, the instance lock and sweep_stale (with real processes: lock
holders, killed holders, live processes without a lock, dead pids, pid reuse)."""

from __future__ import annotations

import fcntl
import os
import pathlib
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import posix_ipc
import pytest

from mpbroker.shm import (
    MIN_CAPACITY,
    SHM_DIR,
    ControlBlock,
    Doorbell,
    InstanceLock,
    InstanceLockedError,
    Ring,
    lock_path,
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
        ("12", "lock"),  # reserved for the instance's lock file
    ],
)
def test_segment_name_rejects(instance: str, purpose: str) -> None:
    with pytest.raises(ValueError, match=r"instance|purpose|longer|reserved"):
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
    sem = posix_ipc.Semaphore(segment_name(instance, "sem"), posix_ipc.O_CREX, mode=0o600)
    lock = InstanceLock.acquire(instance)
    # A neighbour whose name starts like ours must survive.
    neighbour = Ring.create(segment_name(instance + "0", "ring"), MIN_CAPACITY)
    try:
        removed = remove_instance(instance)
        assert removed == sorted(
            [
                f"mpb.{instance}.ring",
                f"mpb.{instance}.bell",
                f"mpb.{instance}.control",
                f"mpb.{instance}.lock",
                f"sem.mpb.{instance}.sem",
            ]
        )
        assert remove_instance(instance) == []
        assert shm_path(neighbour.name).exists()
        # Mapped handles keep working after their names are gone.
        assert ring.writer().try_put(1, b"still here")
        assert ring.reader().read_batch() == [(1, b"still here")]
    finally:
        lock.release()  # its file is gone already: only drops the lock
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
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Child processes of the test, killed (and reaped) at its end."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


def sleeper(procs: list[subprocess.Popen[str]]) -> int:
    """A live process that has nothing of mpbroker, not even in its command line."""
    p = subprocess.Popen(["sleep", "60"], text=True)
    procs.append(p)
    return p.pid


# Takes the lock of instance <its pid><suffix> in <directory>, says so, and holds it.
_HOLDER = """
import os, pathlib, sys, time
from mpbroker.shm import InstanceLock
lock = InstanceLock.acquire(f"{os.getpid()}{sys.argv[2]}", pathlib.Path(sys.argv[1]))
print(lock.instance, flush=True)
time.sleep(60)
"""


def lock_holder(
    procs: list[subprocess.Popen[str]], directory: pathlib.Path, suffix: str = ""
) -> tuple[subprocess.Popen[str], str]:
    """A live process holding the lock of its instance ``<pid><suffix>``; returns it and the
    instance (once the lock is held)."""
    p = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(directory), suffix], stdout=subprocess.PIPE, text=True
    )
    procs.append(p)
    assert p.stdout is not None
    instance = p.stdout.readline().strip()
    assert instance == f"{p.pid}{suffix}", f"the lock holder failed: {instance!r}"
    return p, instance


def make_entries(directory: pathlib.Path, instance: str) -> list[str]:
    names = [f"mpb.{instance}.ring", f"mpb.{instance}.ctl.v1", f"sem.mpb.{instance}.sem"]
    for n in names:
        (directory / n).write_bytes(b"")
    os.mkfifo(directory / f"mpb.{instance}.bell")
    return sorted([*names, f"mpb.{instance}.bell"])


def unheld_lock_file(directory: pathlib.Path, instance: str) -> list[str]:
    """A lock file nobody holds: its owner died (or never was)."""
    path = lock_path(instance, directory)
    path.write_bytes(b"")
    return [path.name]


def test_sweep_stale_decisions(
    tmp_path: pathlib.Path, processes: list[subprocess.Popen[str]]
) -> None:
    _, locked = lock_holder(processes, tmp_path)
    _, locked_t2 = lock_holder(processes, tmp_path, "t2")
    live = sleeper(processes)  # no lock file, no "mpbroker" anywhere: alive by its pid
    reused = sleeper(processes)  # an unrelated process on a dead instance's pid: pid reuse
    dead = dead_pid()
    kept = (
        make_entries(tmp_path, locked)
        + make_entries(tmp_path, locked_t2)
        + [lock_path(locked, tmp_path).name, lock_path(locked_t2, tmp_path).name]
        + make_entries(tmp_path, str(live))
        + make_entries(tmp_path, f"{live}t3")
        + make_entries(tmp_path, f"{os.getpid()}t99")  # ours: our pid exists
    )
    dead_entries = (
        make_entries(tmp_path, str(dead))
        + make_entries(tmp_path, f"{dead}t7")
        + make_entries(tmp_path, f"{dead}t8")
        + unheld_lock_file(tmp_path, f"{dead}t8")
        + unheld_lock_file(tmp_path, f"{dead}t9")  # a lock file alone
    )
    reused_entries = make_entries(tmp_path, str(reused)) + unheld_lock_file(tmp_path, str(reused))
    unrelated = ["mpb.notapid.x", "mpbroker.log", "sem.other", f"mpb.{dead}", "psm_1234"]
    for n in unrelated:
        (tmp_path / n).write_bytes(b"")

    removed = sweep_stale(tmp_path)

    assert removed == sorted(dead_entries + reused_entries)
    assert sorted(os.listdir(tmp_path)) == sorted(kept + unrelated)
    assert sweep_stale(tmp_path) == []
    assert sweep_stale(tmp_path / "missing") == []


def test_entries_of_a_killed_lock_holder_are_swept(
    tmp_path: pathlib.Path, processes: list[subprocess.Popen[str]]
) -> None:
    holder, instance = lock_holder(processes, tmp_path)
    entries = [*make_entries(tmp_path, instance), lock_path(instance, tmp_path).name]
    assert sweep_stale(tmp_path) == []
    holder.kill()  # kill -9: no clean-up, the kernel drops the lock
    holder.wait()
    assert sweep_stale(tmp_path) == sorted(entries)
    assert os.listdir(tmp_path) == []


def test_instance_lock(tmp_path: pathlib.Path) -> None:
    instance = f"{os.getpid()}t1"
    path = lock_path(instance, tmp_path)
    with InstanceLock.acquire(instance, tmp_path) as lock:
        assert lock.held
        assert lock.path == path == tmp_path / f"mpb.{instance}.lock"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        # flock belongs to the open file, not the process: a second taker in the same process
        # (its sweep, say) finds it taken, and its attempt does not drop the first one's lock.
        with pytest.raises(InstanceLockedError, match=instance) as info:
            InstanceLock.acquire(instance, tmp_path, timeout=0.05)
        assert info.value.path == str(path)
        entries = make_entries(tmp_path, instance)
        assert sweep_stale(tmp_path) == []
        assert path.exists()
    assert not lock.held
    assert not path.exists()
    lock.release()  # idempotent

    # A dead instance's lock file (same instance name: pid reuse) is taken over, owner-only.
    path.write_bytes(b"")
    path.chmod(0o644)
    lock = InstanceLock.acquire(instance, tmp_path)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        lock.release()
    assert remove_instance(instance, tmp_path) == entries


def test_instance_lock_waits_for_a_sweep_that_holds_it_for_a_moment(
    tmp_path: pathlib.Path,
) -> None:
    """A sweep holds a dead instance's lock while it removes its entries, the lock file last.
    A broker starting with that instance name meanwhile waits, then makes a new lock file."""
    instance = f"{os.getpid()}t2"
    path = lock_path(instance, tmp_path)
    unheld_lock_file(tmp_path, instance)
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    swept = threading.Event()

    def sweep_ends() -> None:
        time.sleep(0.2)
        path.unlink()
        swept.set()
        os.close(fd)  # drops the sweep's lock

    sweeper = threading.Thread(target=sweep_ends)
    sweeper.start()
    try:
        with InstanceLock.acquire(instance, tmp_path) as lock:
            assert swept.is_set()
            assert lock.held
            assert path.exists()  # a new file: the old one is gone
            assert sweep_stale(tmp_path) == []  # held: alive
    finally:
        sweeper.join()
    assert os.listdir(tmp_path) == []


def test_sweep_stale_in_dev_shm(processes: list[subprocess.Popen[str]]) -> None:
    dead = f"{dead_pid()}t1"
    holder, locked = lock_holder(processes, SHM_DIR, "t1")
    dead_ring = Ring.create(segment_name(dead, "ring"), MIN_CAPACITY)
    dead_bell = Doorbell.create(segment_name(dead, "bell"))
    dead_sem = posix_ipc.Semaphore(segment_name(dead, "sem"), posix_ipc.O_CREX, mode=0o600)
    live_ring = Ring.create(segment_name(locked, "ring"), MIN_CAPACITY)
    try:
        removed = sweep_stale()
        assert not any(locked in n for n in removed)
        assert shm_path(live_ring.name).exists()
        assert lock_path(locked).exists()
        # (Another broker starting on this machine may have swept them first.)
        for name in (dead_ring.name, dead_bell.name):
            assert not shm_path(name).exists()
        assert not (SHM_DIR / f"sem.mpb.{dead}.sem").exists()
        holder.kill()
        holder.wait()
        sweep_stale()
        assert not shm_path(live_ring.name).exists()
        assert not lock_path(locked).exists()
    finally:
        for handle in (dead_ring, dead_bell, live_ring):
            handle.close()
        dead_sem.close()
        remove_instance(dead)
        remove_instance(locked)
