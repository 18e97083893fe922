"""Exceptions of the shared-memory layer.

They carry typed fields and build their own message, so a caller can both log them and act on
the numbers (see STYLE.md: ``MaxPayloadError(size, max_payload)``).
"""

from __future__ import annotations

import errno

__all__ = [
    "InstanceLockedError",
    "RingBrokenError",
    "RingClosedError",
    "SegmentExistsError",
    "SegmentNotFoundError",
    "ShmClosedError",
    "ShmError",
    "ShmSpaceError",
]


class ShmError(Exception):
    """Base class of every error raised by :mod:`mpbroker.shm` (caller mistakes, such as a bad
    ring capacity or record kind, are :class:`ValueError`)."""


class InstanceLockedError(ShmError):
    """Another process holds the lock of the broker instance we are starting."""

    def __init__(self, instance: str, path: str, waited: float) -> None:
        self.instance = instance
        """The instance whose lock is taken."""
        self.path = path
        """Its lock file."""
        self.waited = waited
        """Seconds we waited for the lock."""
        super().__init__(
            f"broker instance {instance} is in use: another process has held its lock file "
            f"{path} for {waited:g} s"
        )


class ShmSpaceError(ShmError):
    """A segment cannot be created because /dev/shm has not enough free space.

    Raised at creation instead of the SIGBUS that touching an over-committed tmpfs page would
    deliver later. Nothing is left behind when this is raised.
    """

    def __init__(self, name: str, need: int, free: int, what: str = "segment") -> None:
        self.name = name
        """Segment or file name that could not be created."""
        self.need = need
        """Bytes the segment needs (header included)."""
        self.free = free
        """Bytes /dev/shm had free when the check was made."""
        super().__init__(
            f"cannot create {what} {name}: needs {need} bytes, /dev/shm has {free} free"
        )


class SegmentNotFoundError(ShmError, FileNotFoundError):
    """Attaching to a segment (or doorbell FIFO) that does not exist."""

    def __init__(self, name: str, what: str = "segment") -> None:
        self.name = name
        """The missing name."""
        super().__init__(f"no {what} named {name} (not created yet, or removed)")
        self.errno = errno.ENOENT
        self.filename = name

    def __str__(self) -> str:
        # OSError's own __str__ would print "None"-filled errno fields; keep our message.
        return str(self.args[0])


class SegmentExistsError(ShmError, FileExistsError):
    """Creating a segment whose name is already taken."""

    def __init__(self, name: str, what: str = "segment") -> None:
        self.name = name
        """The name that is taken."""
        super().__init__(
            f"{what} {name} already exists (a live broker instance, or a stale segment that "
            "remove_instance()/sweep_stale() should have removed)"
        )
        self.errno = errno.EEXIST
        self.filename = name

    def __str__(self) -> str:
        return str(self.args[0])


class ShmClosedError(ShmError):
    """Using a handle (ring, doorbell, control block) that *your* code already closed."""


class RingClosedError(ShmClosedError):
    """Using a ring, or one of its writers/readers, after :meth:`Ring.close` on this handle.

    Like trio's ``ClosedResourceError``: a bug or shutdown order problem in this process.
    """


class RingBrokenError(ShmError):
    """The ring's shared state is not what this handle expects.

    Like trio's ``BrokenResourceError``: something outside this process happened, e.g. the
    segment is not an mpbroker ring of this layout (foreign, replaced, or of another version),
    or its counters / record headers are inconsistent.
    """

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        """The ring's segment name."""
        self.reason = reason
        """What was found wrong."""
        super().__init__(f"ring {name} is broken: {reason}")
