"""A pipeline's store filesystem against `store.disk_free_limit_bytes` (RabbitMQ's
disk_free_limit): the reading (statvfs, once a second) and its log lines; the decision is
`flow.DiskFree`. The store hears it too: while space is short it rolls a drained segment at
once (so draining frees its file), and once there is room it makes its disk reserve again."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

from mpbroker.config import Config, format_bytes, parse_disk_free_limit
from mpbroker.flow import DiskFree
from mpbroker.stores import MessageStore

__all__ = ["DiskWatch"]

log = logging.getLogger("mpbroker.pipeline")

# How often the free space is read while there is plenty: statvfs is a cheap system call,
# and a second of writes at full speed (tens of MB) stays well inside the default 64 MiB.
CHECK_INTERVAL_S: Final = 1.0
# Within this many times the limit, it is read after every batch the store wrote (a few
# microseconds each), so a burst cannot run far past the limit between two readings.
NEAR_FACTOR: Final = 2


def _free_and_total(directory: Path) -> tuple[int, int]:
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize


class DiskWatch:
    """Whether persistent producers to one store must wait for disk space. `check` says
    when that changes: the stop's reason (`disk_free_limit N`), "" for a release, None
    for no change."""

    def __init__(
        self,
        store: MessageStore,
        config: Config,
        read: Callable[[Path], tuple[int, int]] = _free_and_total,
    ) -> None:
        self.store = store
        self.directory = store.directory
        self.free = DiskFree(parse_disk_free_limit(config.store.disk_free_limit_bytes))
        self.read = read
        self.reason = ""
        self._next_check = 0.0
        # The last reading was within NEAR_FACTOR times the limit (or stopped).
        self.near = False

    @property
    def stopped(self) -> bool:
        return self.free.stopped

    def check(self, now_s: float) -> str | None:
        """Read the free space when due: once a second, or at every call while it is near
        the limit; the change, as the class says."""
        if now_s < self._next_check and not self.near:
            return None
        self._next_check = now_s + CHECK_INTERVAL_S
        try:
            free, total = self.read(self.directory)
        except OSError as exc:
            log.error("cannot read the free space of %s: %s", self.directory, exc)
            return None
        change = self.free.update(free, total)
        self.near = self.free.stopped or free < NEAR_FACTOR * self.free.limit.of(total)
        reserve = self.store.reserve
        if not self.free.stopped:
            reserve.ensure()
        self.store.low_on_disk = self.free.stopped or (reserve.size > 0 and not reserve.held)
        if change is None:
            return None
        limit = self.free.limit.of(total)
        if change:
            self.reason = f"disk_free_limit {limit}"
            log.warning(
                "data dir %s has %s free, below store.disk_free_limit_bytes (%s): persistent "
                "producers wait until there is room",
                self.directory,
                format_bytes(free),
                format_bytes(limit),
            )
            return self.reason
        self.reason = ""
        log.info(
            "data dir %s has %s free again: persistent producers may go on",
            self.directory,
            format_bytes(free),
        )
        return ""
