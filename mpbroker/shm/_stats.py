"""Stats blocks: one worker publishes a JSON snapshot of its state, anyone reads it.

One segment per worker: a header of two 8-byte words (a version counter and the length of
the snapshot) and the snapshot bytes. The writer makes the version odd, writes, then makes
it even again (a seqlock): a reader that sees an odd version, or a different version after
copying, read a snapshot being written and tries again. No lock, so a writer killed in the
middle leaves nothing taken (docs/architecture.md, "Traps": no cross-process locks on the data path) — its
successor simply writes the next version.

Readers are the admin API (in the supervisor) and tests; the writers publish every
`admin.stats_interval_ms`, so the snapshot is never older than that.
"""

from __future__ import annotations

import os
import time

from ._errors import ShmError
from ._segment import create_segment_fd, map_fd, open_segment_fd, unlink_segment

__all__ = ["StatsBlock"]

_HEADER = 16
_VERSION = 0  # word index
_LENGTH = 1


class StatsBlock:
    def __init__(self, name: str, fd: int, size: int) -> None:
        self.name = name
        self.capacity = size - _HEADER
        self._mm = map_fd(fd, size)
        self._mv = memoryview(self._mm)
        self._q = self._mv[:_HEADER].cast("Q")
        self._closed = False

    @classmethod
    def create(cls, name: str, capacity: int) -> StatsBlock:
        """A zeroed block for snapshots of up to `capacity` bytes (mode 0600)."""
        size = _HEADER + capacity
        fd = create_segment_fd(name, size, "stats block")
        try:
            return cls(name, fd, size)
        except BaseException:
            unlink_segment(name)
            raise
        finally:
            os.close(fd)

    @classmethod
    def attach(cls, name: str) -> StatsBlock:
        fd, size = open_segment_fd(name, "stats block")
        try:
            if size <= _HEADER:
                raise ShmError(f"stats block {name}: segment is {size} bytes, too small")
            return cls(name, fd, size)
        finally:
            os.close(fd)

    def write(self, snapshot: bytes) -> bool:
        """Publish `snapshot`; False (and nothing published) if it does not fit."""
        if len(snapshot) > self.capacity:
            return False
        q = self._q
        version = q[_VERSION]
        if version % 2:
            version += 1  # a predecessor died mid-write: start from an even number
        # Aligned 8-byte stores (docs/architecture.md, "Traps"): a reader never sees a half-written counter.
        q[_VERSION] = version + 1
        self._mv[_HEADER : _HEADER + len(snapshot)] = snapshot
        q[_LENGTH] = len(snapshot)
        q[_VERSION] = version + 2
        return True

    def read(self, attempts: int = 100) -> bytes:
        """The latest complete snapshot (b"" if none was written yet)."""
        q = self._q
        for _ in range(attempts):
            before = q[_VERSION]
            if before % 2 == 0:
                length = min(q[_LENGTH], self.capacity)
                data = bytes(self._mv[_HEADER : _HEADER + length])
                if q[_VERSION] == before:
                    return data
            time.sleep(0.0005)
        raise ShmError(f"stats block {self.name}: no stable snapshot after {attempts} tries")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._q.release()
        self._mv.release()
        self._mm.close()

    def unlink(self) -> None:
        unlink_segment(self.name)
