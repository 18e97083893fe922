"""RabbitMQ's `disk_free_limit` for a store's filesystem: stop persistent producers before
the disk is full, so that consumers can always drain. Pure logic: the caller reads the
filesystem (`os.statvfs`) and passes the figures in.

The limit is bytes (`64MiB`) or a share of the filesystem (`5%`). Falling below it stops
persistent producers to the store's pipeline (flow control: held, then refused naming
`disk_free_limit`); only getting back above it by a margin lets them go, so a store
hovering at the limit does not flap: the margin is a tenth of the limit, at least 1 MiB.
"""

from __future__ import annotations

from typing import Final

from mpbroker.config import DiskFreeLimit, MiB

__all__ = ["DiskFree"]

# The release margin: a tenth of the limit, at least this.
_MIN_MARGIN: Final = MiB


class DiskFree:
    """One filesystem against its limit: `update(free, total)` with each reading says
    whether persistent producers are stopped (True), let go (False), or nothing changed
    (None)."""

    __slots__ = ("limit", "stopped")

    def __init__(self, limit: DiskFreeLimit) -> None:
        self.limit = limit
        self.stopped = False

    def update(self, free_bytes: int, total_bytes: int) -> bool | None:
        limit = self.limit.of(total_bytes)
        if not limit:
            return None
        if not self.stopped and free_bytes < limit:
            self.stopped = True
            return True
        if self.stopped and free_bytes >= limit + max(limit // 10, _MIN_MARGIN):
            self.stopped = False
            return False
        return None
