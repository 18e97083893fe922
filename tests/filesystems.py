"""Real small filesystems for tests of a full disk: a tmpfs mounted by the test (it needs
root; the test is skipped with the reason otherwise), and a way to fill one to the last
byte."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
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
