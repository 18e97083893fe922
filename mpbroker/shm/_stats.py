"""Stats blocks: one worker publishes a JSON snapshot of its state, anyone reads it.

One segment per worker: a header of two 8-byte words (a version counter and the length of
the snapshot) and the snapshot bytes. The writer makes the version odd, writes, then makes
it even again (a seqlock): a reader that sees an odd version, or a different version after
copying, read a snapshot being written and tries again. No lock, so a writer killed in the
middle leaves nothing taken (docs/architecture.md, "Traps": no cross-process locks on the data path) — its
successor simply writes the next version.

A snapshot larger than the block (a worker with thousands of destinations) goes to the
block's **spill file**, ``/dev/shm/<block name>.spill``, sized to the snapshot: the writer
writes a temporary file and renames it over the spill file, so a reader opening it gets one
whole snapshot, old or new, and never a torn one. The block then holds no bytes, and its
length word says "spilled" (`_SPILLED`). The spill file is an entry of the instance like
the segments: MemWatch counts it, and a clean stop or the next start's sweep removes it.

Readers are the admin API (in the supervisor) and tests; the writers publish every
`admin.stats_interval_ms`, so the snapshot is never older than that.
"""

from __future__ import annotations

import contextlib
import os
import time

from ._errors import ShmError
from ._naming import shm_path
from ._segment import SEGMENT_MODE, create_mapped, map_fd, open_segment_fd, unlink_segment

__all__ = ["StatsBlock"]

_HEADER = 16
_VERSION = 0  # word index
_LENGTH = 1
# Set in the length word when the snapshot (of the remaining bits' length) is in the spill
# file; a length this large can never be a block's own.
_SPILLED = 1 << 63


class StatsBlock:
    def __init__(self, name: str, fd: int, size: int) -> None:
        self.name = name
        self.capacity = size - _HEADER
        self._mm = map_fd(fd, size)
        self._mv = memoryview(self._mm)
        self._q = self._mv[:_HEADER].cast("Q")
        self._closed = False
        self.spill_path = shm_path(name + ".spill")
        """Where a snapshot larger than the block goes."""
        self._spill_tmp = shm_path(name + ".spill-tmp")

    @classmethod
    def create(cls, name: str, capacity: int) -> StatsBlock:
        """A zeroed block for snapshots of up to `capacity` bytes (mode 0600)."""
        size = _HEADER + capacity
        return create_mapped(name, size, "stats block", lambda fd: cls(name, fd, size))

    @classmethod
    def attach(cls, name: str) -> StatsBlock:
        fd, size = open_segment_fd(name, "stats block")
        try:
            if size <= _HEADER:
                raise ShmError(f"stats block {name}: segment is {size} bytes, too small")
            return cls(name, fd, size)
        finally:
            os.close(fd)

    def write(self, snapshot: bytes) -> None:
        """Publish `snapshot`: in the block when it fits, else in the spill file.

        OSError (ENOSPC when /dev/shm is full) if the spill file cannot be written; the
        last snapshot published stays then.
        """
        q = self._q
        if len(snapshot) > self.capacity:
            self._write_spill(snapshot)
            self._publish(b"", _SPILLED | len(snapshot))
            return
        spilled = q[_LENGTH] & _SPILLED
        self._publish(snapshot, len(snapshot))
        if spilled:
            # No reader is sent to the spill file any more: give its memory back.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.spill_path)

    def _publish(self, snapshot: bytes, length: int) -> None:
        q = self._q
        version = q[_VERSION]
        if version % 2:
            version += 1  # a predecessor died mid-write: start from an even number
        # Aligned 8-byte stores (docs/architecture.md, "Traps"): a reader never sees a half-written counter.
        q[_VERSION] = version + 1
        self._mv[_HEADER : _HEADER + len(snapshot)] = snapshot
        q[_LENGTH] = length
        q[_VERSION] = version + 2

    def _write_spill(self, snapshot: bytes) -> None:
        """Replace the spill file with `snapshot` in one rename (a reader that opened the old
        one reads it whole)."""
        fd = os.open(self._spill_tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, SEGMENT_MODE)
        try:
            view = memoryview(snapshot)
            while view:
                view = view[os.write(fd, view) :]
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._spill_tmp)  # a half-written file would only take room
            raise
        os.close(fd)
        os.replace(self._spill_tmp, self.spill_path)

    def read(self, attempts: int = 100) -> bytes:
        """The latest complete snapshot (b"" if none was written yet)."""
        q = self._q
        for _ in range(attempts):
            before = q[_VERSION]
            if before % 2 == 0:
                length = q[_LENGTH]
                if length & _SPILLED:
                    if q[_VERSION] == before:
                        try:
                            return self.spill_path.read_bytes()
                        except FileNotFoundError:
                            pass  # a snapshot in the block replaced it meanwhile: again
                else:
                    length = min(length, self.capacity)
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
        """Remove the block and its spill files."""
        unlink_segment(self.name)
        for path in (self.spill_path, self._spill_tmp):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
