"""A store's disk reserve: a preallocated file given back to the filesystem when the
filesystem is full, so that acknowledgements, segment retirement and the next start can
still write the little they need, and draining a store always frees space.

`store.disk_free_limit_bytes` stops persistent producers before the filesystem fills;
the reserve covers what that cannot: another program filling the filesystem, or a limit of
0. The owner spends it (`release`) when a write that frees space fails for want of room,
and makes it again (`ensure`) once there is room.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
from pathlib import Path
from typing import Final

__all__ = ["RESERVE_NAME", "DiskReserve", "is_disk_full"]

log = logging.getLogger(__name__)

RESERVE_NAME: Final = "disk-reserve"
_CHUNK: Final = 1024 * 1024
# SQLite's primary result codes that a full filesystem produces: SQLITE_FULL, and
# SQLITE_IOERR (a WAL or shared-memory file that cannot grow).
_FULL_CODES: Final = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR})
_FULL_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether `exc` (an SQLite or OS error) may mean the filesystem has no room."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        return code is not None and code & 0xFF in _FULL_CODES
    if isinstance(exc, OSError):
        return exc.errno in _FULL_ERRNOS
    return False


class DiskReserve:
    """`size` bytes held in `directory/disk-reserve` (size 0: no reserve)."""

    def __init__(self, directory: Path, size: int) -> None:
        self.path = Path(directory) / RESERVE_NAME
        self.size = size
        # Free space making the reserve must leave (set by the owner: where
        # store.disk_free_limit_bytes stops producers), so that it never stops them itself.
        self.keep_free = 0

    @property
    def held(self) -> bool:
        """Whether the reserve file is there, whole."""
        try:
            return self.size > 0 and self.path.stat().st_size >= self.size
        except OSError:
            return False

    def ensure(self) -> bool:
        """Make the reserve if it is missing and the filesystem has room for it twice over
        (and `keep_free` left after it); whether it is held afterwards (a write that fails
        leaves nothing behind)."""
        if self.size <= 0 or self.held:
            return self.size > 0
        try:
            stat = os.statvfs(self.path.parent)
            if stat.f_bavail * stat.f_frsize < max(2 * self.size, self.size + self.keep_free):
                return False  # not while space is short: it would take what is left
            # Written, not only allocated: posix_fallocate is not on every filesystem, and
            # a sparse file would reserve nothing.
            with open(self.path, "wb", opener=_owner_only) as fh:
                left = self.size
                zeros = bytes(min(_CHUNK, left))
                while left > 0:
                    left -= fh.write(zeros[: min(left, len(zeros))])
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            self.path.unlink(missing_ok=True)
            if exc.errno not in _FULL_ERRNOS:
                log.warning("cannot make the disk reserve %s: %s", self.path, exc)
            return False
        return True

    def release(self) -> bool:
        """Give the reserve back to the filesystem; whether there was one to give."""
        if not self.held:
            return False
        try:
            self.path.unlink()
        except OSError as exc:
            log.error("cannot release the disk reserve %s: %s", self.path, exc)
            return False
        log.warning(
            "the filesystem of %s is full: released its disk reserve (%d bytes) so that "
            "acknowledgements can be stored and segments retired",
            self.path.parent,
            self.size,
        )
        return True


def _owner_only(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)
