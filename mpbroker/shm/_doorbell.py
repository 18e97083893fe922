"""Doorbells: how a writer wakes a reading process that parked because its rings were empty.

One doorbell per *reading* process, shared by all the rings that process reads. It is a FIFO in
/dev/shm (so it carries the instance's name and is swept with its segments): a file descriptor
that both ``select``/``poll`` and trio can wait on, and that a writer can poke with one
``write`` system call. Writers ring it only when a reader has set its ring's ``reader_waiting``
flag, so a busy reader costs them nothing.

The owner opens the FIFO read-write: it then never sees EOF (there is always a writer, itself)
and its open never blocks. Writers open it write-only and non-blocking; a full pipe means a
wake-up is already pending, so EAGAIN is ignored.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import select
import stat
import sys
from collections.abc import Sequence

from ._errors import SegmentNotFoundError, ShmClosedError, ShmError
from ._naming import shm_path
from ._ring import RingReader

__all__ = ["Doorbell", "park", "park_async"]

FIFO_MODE = 0o600
_DRAIN_CHUNK = 4096


class Doorbell:
    """A FIFO doorbell. :meth:`create` is for the reading process, :meth:`attach` for writers."""

    def __init__(self, name: str, fd: int, owner: bool, identity: tuple[int, int] | None) -> None:
        self.name = name
        """posix-style name (``/mpb.<instance>.<purpose>``) the FIFO was created under."""
        self.path = shm_path(name)
        """Where the FIFO lives in the file system."""
        self.owner = owner
        """True for the reading process's handle (from :meth:`create`)."""
        self._fd = fd
        self._closed = False
        self._identity = identity

    @classmethod
    def create(cls, path_name: str) -> Doorbell:
        """Create the FIFO (mode 0600) for the calling (reading) process and open it.

        A FIFO left at that path by a dead predecessor is replaced, so writers still holding
        the old one notice (EPIPE) and reconnect to this one on their next ring. The new FIFO
        is made and opened under a temporary name and renamed over the path, so the path
        never goes missing: a writer attaching meanwhile finds the old FIFO or the new one.
        """
        path = shm_path(path_name)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        os.mkfifo(temporary, FIFO_MODE)
        try:
            fd = os.open(temporary, os.O_RDWR | os.O_NONBLOCK)
            os.rename(temporary, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise
        st = os.fstat(fd)
        return cls(path_name, fd, owner=True, identity=(st.st_dev, st.st_ino))

    @classmethod
    def attach(cls, path_name: str, *, missing_ok: bool = False) -> Doorbell:
        """Open an existing doorbell for ringing (for writers).

        Raises :class:`SegmentNotFoundError` if there is no FIFO at that path, unless
        ``missing_ok`` (for a writer that may start before its reader). If the FIFO is missing
        or no reader has it open right now (it is restarting), the handle connects on a later
        :meth:`ring`.
        """
        path = shm_path(path_name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            if not missing_ok:
                raise SegmentNotFoundError(path_name, "doorbell") from None
            return cls(path_name, -1, owner=False, identity=None)
        if not stat.S_ISFIFO(st.st_mode):
            raise ShmError(f"doorbell {path_name}: {path} exists but is not a FIFO")
        bell = cls(path_name, -1, owner=False, identity=None)
        bell._fd = bell._connect()
        return bell

    def fileno(self) -> int:
        """The descriptor to wait on for readability (owner) or -1 (writer not connected)."""
        self._check_open()
        return self._fd

    def ring(self) -> None:
        """Wake the reader: write one byte. Never blocks.

        A full pipe (a wake-up is already pending) and a missing reader (it died; its successor
        checks its rings when it starts) are both nothing to do.
        """
        self._check_open()
        fd = self._fd
        if fd < 0:
            fd = self._fd = self._connect()
            if fd < 0:
                return
        try:
            os.write(fd, b"\x01")
        except BlockingIOError:
            return
        except BrokenPipeError:
            # The reader that had this FIFO open is gone. A successor creates a fresh FIFO at
            # the same path; reconnect to it and ring once more, or wait for a later ring.
            os.close(fd)
            fd = self._fd = self._connect()
            if fd >= 0:
                with contextlib.suppress(BlockingIOError, BrokenPipeError):
                    os.write(fd, b"\x01")

    def drain(self) -> None:
        """Read every pending wake-up byte without blocking (owner side)."""
        self._check_open()
        if self._fd < 0:
            return
        try:
            while os.read(self._fd, _DRAIN_CHUNK):
                pass
        except BlockingIOError:
            pass

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called on this handle."""
        return self._closed

    def close(self) -> None:
        """Close the descriptor; idempotent. The FIFO stays; see :meth:`unlink`."""
        if self._closed:
            return
        self._closed = True
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        trio = sys.modules.get("trio")
        if trio is not None:
            # A trio task blocked in wait_readable(fd) must be woken before the fd number can
            # be reused; outside a trio run this raises RuntimeError, and nobody can wait on it.
            with contextlib.suppress(RuntimeError):
                trio.lowlevel.notify_closing(fd)
        os.close(fd)

    def unlink(self) -> None:
        """Remove the FIFO; idempotent. An owner only removes the FIFO it created, not one a
        successor has put at the same path meanwhile."""
        try:
            if self._identity is not None:
                st = os.stat(self.path)
                if (st.st_dev, st.st_ino) != self._identity:
                    return
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> Doorbell:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        role = "owner" if self.owner else "writer"
        return f"<Doorbell {self.name} {role}{' closed' if self._closed else ''}>"

    def _check_open(self) -> None:
        if self._closed:
            raise ShmClosedError(f"doorbell {self.name} was closed by this process")

    def _connect(self) -> int:
        """Open the FIFO write-only; -1 if it has no reader now (ENXIO) or no longer exists."""
        try:
            return os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno in (errno.ENXIO, errno.ENOENT):
                return -1
            raise


def _check_owner(doorbell: Doorbell) -> None:
    if not doorbell.owner:
        # A writer's handle may not even have a descriptor; waiting on it would only ever
        # time out, which would look like a slow broker rather than a bug.
        raise ValueError(f"park on {doorbell.name}: only the doorbell's owner (create()) may park")


def _arm(readers: Sequence[RingReader]) -> bool:
    """Set every reader's waiting flag, then re-check for data (in this order: a writer that
    published before seeing our flag has its records seen by the re-check)."""
    for r in readers:
        r.set_waiting(True)
    return any(r.has_data() for r in readers)


def _disarm(readers: Sequence[RingReader], doorbell: Doorbell) -> None:
    for r in readers:
        r.set_waiting(False)
    doorbell.drain()


def park(readers: Sequence[RingReader], doorbell: Doorbell, timeout: float) -> bool:
    """Block until one of ``readers`` may have data, at most ``timeout`` seconds.

    Returns True if data was already there or the doorbell rang, False on timeout. Either way
    the caller reads its rings next: the timeout is the backstop for a wake-up lost to the
    flag/counter race (docs/architecture.md, "Doorbells and parking"), so keep it short (milliseconds to a second).
    """
    _check_owner(doorbell)
    try:
        if _arm(readers):
            return True
        poller = select.poll()  # not select(): it cannot wait on descriptors >= 1024
        poller.register(doorbell.fileno(), select.POLLIN)
        return bool(poller.poll(max(0, math.ceil(timeout * 1000))))
    finally:
        _disarm(readers, doorbell)


async def park_async(readers: Sequence[RingReader], doorbell: Doorbell, timeout: float) -> bool:
    """Trio version of :meth:`park`; a checkpoint. Only one task may park on a doorbell."""
    import trio  # lazily: sync pipeline workers never import trio (idle memory budget)

    _check_owner(doorbell)
    try:
        if _arm(readers):
            await trio.lowlevel.checkpoint()
            return True
        woke = False
        with trio.move_on_after(timeout):
            await trio.lowlevel.wait_readable(doorbell.fileno())
            woke = True
        return woke
    finally:
        _disarm(readers, doorbell)
