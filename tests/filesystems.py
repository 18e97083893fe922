"""Real small filesystems for tests of a full disk: a tmpfs mounted by the test (it needs
root; the test is skipped with the reason otherwise), and a way to fill one to the last
byte."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(mount: Path, size: str = "16m", *, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of `size` mounted on `mount` (created; `read_only`: mounted so), unmounted
    at the end; skips the test when this machine cannot mount one."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount.mkdir()
    done = subprocess.run(
        [
            "mount",
            "-t",
            "tmpfs",
            "-o",
            f"size={size},mode=0700{',ro' if read_only else ''}",
            "tmpfs",
            str(mount),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def fill(path: Path) -> None:
    """Write zeros to `path` until its filesystem has no room left at all."""
    with open(path, "ab", buffering=0) as fh:
        for chunk in (1024 * 1024, 4096, 512):
            zeros = bytes(chunk)
            while True:
                try:
                    fh.write(zeros)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break


@contextlib.contextmanager
def kept_full(mount: Path, every_s: float = 0.005) -> Iterator[None]:
    """Fill the filesystem of `mount` and keep it full from outside the broker, as another
    program would: whatever space appears (a disk reserve the broker gives back, a segment
    it retires) is taken again within `every_s`. At the end the filler files go."""
    stop = threading.Event()
    files: list[Path] = []

    def take_what_appears() -> None:
        while not stop.is_set():
            if os.statvfs(mount).f_bavail:
                files.append(mount / f"filler-{len(files)}")
                fill(files[-1])
            stop.wait(every_s)

    files.append(mount / "filler-0")
    fill(files[0])
    filler = threading.Thread(target=take_what_appears, name="kept-full", daemon=True)
    filler.start()
    try:
        yield
    finally:
        stop.set()
        filler.join()
        for path in files:
            path.unlink(missing_ok=True)
