"""Creating and opening POSIX shared-memory segments safely (shared by rings and control block).

Why not ``multiprocessing.shared_memory``: in Python 3.11 its resource tracker unlinks segments
it did not create when a process exits (docs/architecture.md, "Segments"), which breaks segments shared by processes.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from collections.abc import Callable
from typing import TypeVar

import posix_ipc

from ._errors import SegmentExistsError, SegmentNotFoundError, ShmSpaceError
from ._naming import SHM_DIR

__all__ = [
    "create_mapped",
    "create_segment_fd",
    "map_fd",
    "open_segment_fd",
    "shm_free_bytes",
    "unlink_segment",
]

T = TypeVar("T")

SEGMENT_MODE = 0o600
"""Only the broker's user may map our segments: they carry message payloads."""


def shm_free_bytes() -> int:
    """Bytes an unprivileged process may still allocate in /dev/shm."""
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def unlink_segment(name: str) -> None:
    """Remove a segment name; a missing one is fine (idempotent)."""
    with contextlib.suppress(posix_ipc.ExistentialError):
        posix_ipc.unlink_shared_memory(name)


def create_segment_fd(name: str, size: int, what: str) -> int:
    """Create segment ``name`` of ``size`` bytes, backed by real pages; return an fd to it.

    The caller owns the returned fd (close it after mapping). Raises :class:`ShmSpaceError`
    when /dev/shm cannot hold ``size`` bytes, :class:`SegmentExistsError` when the name is
    taken. On any failure nothing is left behind.
    """
    # A tmpfs file larger than the free space is created fine and the first touch of a page
    # that cannot be backed kills the process with SIGBUS (docs/architecture.md, "Traps"). Check first, so the
    # common case gets a clear error before anything exists ...
    free = shm_free_bytes()
    if size > free:
        raise ShmSpaceError(name, size, free, what)
    try:
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=SEGMENT_MODE, size=0)
    except posix_ipc.ExistentialError:
        raise SegmentExistsError(name, what) from None
    fd: int = os.dup(shm.fd)
    shm.close_fd()
    try:
        os.ftruncate(fd, size)
        # ... and reserve every page now, so a race with another /dev/shm user fails here
        # with ENOSPC instead of SIGBUS later.
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise ShmSpaceError(name, size, shm_free_bytes(), what) from e
            raise
    except BaseException:
        os.close(fd)
        unlink_segment(name)
        raise
    return fd


def create_mapped(name: str, size: int, what: str, build: Callable[[int], T]) -> T:
    """Create segment ``name`` (as :func:`create_segment_fd`) and return ``build(fd)``, the
    handle mapped from it; the fd is closed after, and on any failure nothing is left."""
    fd = create_segment_fd(name, size, what)
    try:
        return build(fd)
    except BaseException:
        unlink_segment(name)
        raise
    finally:
        os.close(fd)


def open_segment_fd(name: str, what: str) -> tuple[int, int]:
    """Open an existing segment; return ``(fd, size)``. The caller closes the fd."""
    try:
        shm = posix_ipc.SharedMemory(name)
    except posix_ipc.ExistentialError:
        raise SegmentNotFoundError(name, what) from None
    fd: int = os.dup(shm.fd)
    shm.close_fd()
    return fd, os.fstat(fd).st_size


def map_fd(fd: int, length: int, offset: int = 0) -> mmap.mmap:
    """Map ``length`` bytes of the segment at ``offset`` (page-aligned), shared, read-write."""
    return mmap.mmap(
        fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=offset
    )
