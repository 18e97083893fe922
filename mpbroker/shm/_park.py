"""Parking: how a reader whose rings are empty sleeps until a writer rings its doorbell.

The reader sets each ring's waiting flag, checks the rings once more, then waits on its
doorbell with a timeout; a writer that publishes while the flag is set rings the doorbell
(`RingWriter`). The timeout is the backstop for a wake-up lost to the flag/counter race.
"""

from __future__ import annotations

import math
import select
from collections.abc import Sequence

from ._doorbell import Doorbell
from ._ring import RingReader

__all__ = ["park", "park_async"]


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
    flag/counter race (docs/architecture.md, "Doorbells and parking"), so keep it short
    (milliseconds to a second).
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
