"""A pipeline's store filesystem against `store.disk_free_limit_bytes` (RabbitMQ's
disk_free_limit): the readings of its free space and their log lines; the decisions are
`flow.DiskFree`'s, and what an append may take is `flow.append_need`'s arithmetic.

The free space is read (statvfs, about 2 microseconds) before every append the store makes
(a group commit, with the segment roll and the WAL checkpoint it may bring: the store's
`disk_guard`), so a burst cannot run past the limit between two readings, and once a second
besides, for a stop nobody appends into (another program filling the filesystem) and for
the release. The store hears it too: while space is short it rolls a drained segment at
once (so draining frees its file), and once there is room it makes its disk reserve again,
never below where producers stop."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

from mpbroker.config import Config, format_bytes, parse_disk_free_limit
from mpbroker.flow import DiskFree, SqliteFiles, append_margin, append_need, commit_pages
from mpbroker.stores import (
    CHECKPOINT_PAGES,
    MESSAGE_OVERHEAD_BYTES,
    NEW_SEGMENT_PAGES,
    PAGE_BYTES,
    PENDING_OVERHEAD_BYTES,
    DiskLimitReached,
    MessageStore,
    RowWrites,
)

__all__ = ["STORE_FILES", "DiskWatch", "data_dir_margin"]

log = logging.getLogger("mpbroker.pipeline")

# How often the free space is read besides before every append.
CHECK_INTERVAL_S: Final = 1.0

# The stores' SQLite files, for the arithmetic.
STORE_FILES: Final = SqliteFiles(
    page_bytes=PAGE_BYTES,
    checkpoint_pages=CHECKPOINT_PAGES,
    new_segment_pages=NEW_SEGMENT_PAGES,
    message_overhead=MESSAGE_OVERHEAD_BYTES,
    pending_overhead=PENDING_OVERHEAD_BYTES,
)


def data_dir_margin(config: Config) -> tuple[int, int, int]:
    """What the stores of the data dir may write between two readings of its free space,
    by the configuration: one append of each p2p worker's queue store and of each pubsub
    worker's topic store (`flow.append_margin`). (The margin, one queue store's part, one
    topic store's part.)"""
    queue = append_margin(config, STORE_FILES, topic=False)
    topic = append_margin(config, STORE_FILES, topic=True)
    broker = config.broker
    return broker.p2p_count() * queue + broker.pubsub_count() * topic, queue, topic


def _free_and_total(directory: Path) -> tuple[int, int]:
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize


class DiskWatch:
    """Whether persistent producers to one store (a topic store's: `topic`) must wait for
    disk space, and whether an append of it may be written. `check` says when the former
    changes: the stop's reason (`disk_free_limit N`), "" for a release, None for no
    change; the store's appends are refused (`DiskLimitReached`) when they could take the
    filesystem below the limit."""

    def __init__(
        self,
        store: MessageStore,
        config: Config,
        read: Callable[[Path], tuple[int, int]] = _free_and_total,
        *,
        topic: bool = False,
    ) -> None:
        self.store = store
        self.directory = store.directory
        margin, queue_margin, topic_margin = data_dir_margin(config)
        own = topic_margin if topic else queue_margin
        # Producers stop with the margins of every store left; this one's appends go while
        # the others' stay.
        limit = parse_disk_free_limit(config.store.disk_free_limit_bytes)
        self.free = DiskFree(limit, margin, margin - own)
        self.read = read
        self.reason = ""
        self._next_check = 0.0
        self._change: str | None = None
        # The disk reserve was spent and not made again (as of the last `check`).
        self._reserve_spent = False
        store.disk_guard = self.guard

    @property
    def stopped(self) -> bool:
        return self.free.stopped

    def guard(self, writes: list[RowWrites]) -> None:
        """Before an append writes `writes` (per database, its rows' sizes and places):
        read the free space, and refuse the append (DiskLimitReached) if the most it can
        take could bring the filesystem below the limit."""
        try:
            free, total = self.read(self.directory)
        except OSError as exc:
            # The store still refuses what the filesystem cannot take.
            log.error("cannot read the free space of %s: %s", self.directory, exc)
            return
        self._take(free, total)
        page = STORE_FILES.page_bytes
        need = append_need(
            (commit_pages(rows, places, page) for rows, places in writes), STORE_FILES
        )
        if not self.free.room_for(need, free, total):
            limit = self.free.limit.of(total)
            raise DiskLimitReached(self.directory, limit, free, need + self.free.reserved)

    def check(self, now_s: float) -> str | None:
        """Read the free space when due (once a second); a change since the last call, by
        this reading or an append's, as the class says."""
        if now_s >= self._next_check:
            self._next_check = now_s + CHECK_INTERVAL_S
            try:
                free, total = self.read(self.directory)
            except OSError as exc:
                log.error("cannot read the free space of %s: %s", self.directory, exc)
            else:
                self._take(free, total)
                # The disk reserve (two more system calls: not at every append).
                reserve = self.store.reserve
                reserve.keep_free = self.free.stop_point(total)
                if not self.free.stopped:
                    reserve.ensure()
                self._reserve_spent = reserve.size > 0 and not reserve.held
                self.store.low_on_disk = self.free.stopped or self._reserve_spent
        change, self._change = self._change, None
        return change

    def _take(self, free: int, total: int) -> None:
        """One reading: the stop or release, and the store's `low_on_disk`."""
        change = self.free.update(free, total)
        self.store.low_on_disk = self.free.stopped or self._reserve_spent
        if change is None:
            return
        limit = self.free.limit.of(total)
        if change:
            self.reason = f"disk_free_limit {limit}"
            log.warning(
                "data dir %s has %s free, below store.disk_free_limit_bytes (%s) plus the "
                "%s its stores may write between two readings: persistent producers wait "
                "until there is room",
                self.directory,
                format_bytes(free),
                format_bytes(limit),
                format_bytes(self.free.margin),
            )
            self._change = self.reason
            return
        self.reason = ""
        log.info(
            "data dir %s has %s free again: persistent producers may go on",
            self.directory,
            format_bytes(free),
        )
        self._change = ""
