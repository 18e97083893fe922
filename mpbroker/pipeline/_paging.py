"""Flow-to-disk for a pipeline: non-persistent messages paged to its temp store.

In a p2p worker paging starts when the VolQueueStore (waiting non-persistent messages in
memory) reaches `vol_queue_store.global_byte_high`; in a pubsub worker when the topic live
buffer (messages waiting for slow subscribers) reaches `topics.global_live_byte_high`; in
both when MemWatch reaches `memory.throttle_level`. It stops once memory is back at the low
mark and MemWatch below that level. While it is on, every message left waiting after
dispatch goes to disk at once, and each batch pages out at most `temp_store.page_step_bytes`
of those already waiting (at the throttle level: until none is left in memory), so paging
never stalls delivery and never takes a whole queue in one go.

A paged message's body goes to disk (with a copy of its headers, what the page reads
back); what stays in memory is what order and expiry need (id, priority, expiry, size,
delivery count: ~300 B, measured) and, in a queue, its headers, which selectors read (as
WebLogic keeps them): a consumer arriving with a selector scans the backlog without
reading a body back. A topic decides who gets a message when it is published, so its
paged entries keep no headers.

The temp store's limit is the only thing that stops producers of non-persistent messages
for memory then (those global byte marks start paging instead): a full temp store stops
them (flow control: they wait up to `send_timeout_ms`, then get an ERROR naming
`temp_store.limit_bytes`), and a freed allocation unit lets them go again.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from mpbroker.admin import TempStoreStats
from mpbroker.config import Config
from mpbroker.flow import OFF, StoreLimits, Watermark, store_limits
from mpbroker.stores import StoreError, TempStore

__all__ = [
    "PagedEngine",
    "VolatilePaging",
    "live_byte_mark",
    "open_temp_store",
    "paging_enabled",
    "queue_paging_mark",
    "topic_paging_mark",
    "volatile_limits",
]

log = logging.getLogger("mpbroker.paging")

_LOG_INTERVAL_S = 60.0


def paging_enabled(config: Config) -> bool:
    return config.temp_store.limit_bytes != -1


class PagedEngine(Protocol):
    """What paging needs of an engine (QueueEngine, TopicEngine, built with the temp store
    as its pager)."""

    paging: bool

    @property
    def held_bytes(self) -> int: ...

    @property
    def paged_bytes(self) -> int: ...

    @property
    def paged_messages(self) -> int: ...

    def page_out(self, max_bytes: int) -> int: ...


def queue_paging_mark(config: Config) -> Watermark:
    vol = config.vol_queue_store
    return Watermark(vol.global_byte_high, vol.global_byte_low)


def topic_paging_mark(config: Config) -> Watermark:
    topics = config.topics
    return Watermark(topics.global_live_byte_high, topics.global_live_byte_low)


def live_byte_mark(config: Config) -> Watermark:
    """The topic live buffer's global byte watermark as flow control applies it: with a
    temp store it starts paging instead of stopping publishers."""
    return Watermark(OFF, OFF) if paging_enabled(config) else topic_paging_mark(config)


def volatile_limits(config: Config) -> StoreLimits:
    """The VolQueueStore's watermarks as flow control applies them: with a temp store its
    global byte marks start paging instead of stopping producers."""
    limits = store_limits(config.vol_queue_store)
    if paging_enabled(config):
        limits = dataclasses.replace(limits, global_bytes=Watermark(OFF, OFF))
    return limits


def open_temp_store(config: Config, directory: Path) -> TempStore:
    """A pipeline's temp store, emptied (it only ever holds what this run paged)."""
    return TempStore.open(directory, config.temp_store, config.store.sqlite_cache_bytes)


class VolatilePaging:
    """The paging decisions of one pipeline's engine, after every batch. `store` is the
    engine's pager."""

    def __init__(
        self,
        engine: PagedEngine,
        store: TempStore,
        config: Config,
        mark_of: Callable[[Config], Watermark],
    ) -> None:
        self.engine = engine
        self.store = store
        self.mark_of = mark_of  # the budget of memory whose passing starts paging
        self.configure(config)
        self.stopped = False  # producers of non-persistent messages held: the store is full
        # Paging may start and stop every second near the marks: the log says so at most
        # once a minute (the admin API has the rest).
        self.starts = 0
        self.logged_at = -_LOG_INTERVAL_S
        self.logged_starts = 0

    def configure(self, config: Config) -> None:
        self.mark = self.mark_of(config)
        self.step_bytes = config.temp_store.page_step_bytes
        self.throttle_level = config.memory.throttle_level

    def step(self, memwatch_level: int) -> bool | None:
        """Page what is due; True when producers must now be stopped (the temp store is
        full), False when they may go again, None when that did not change."""
        engine = self.engine
        short = bool(self.throttle_level) and memwatch_level >= self.throttle_level
        over = self.mark.enabled and engine.held_bytes >= self.mark.high
        if (over or short) and not engine.paging:
            engine.paging = True
            self.starts += 1
            self._log(
                "paging non-persistent messages to the temp store: %s",
                f"memory level {memwatch_level}"
                if short
                else f"the {self.mark.high}-byte budget of messages in memory was reached",
            )
        elif (
            engine.paging
            and not short
            and (not self.mark.enabled or engine.held_bytes <= self.mark.low)
        ):
            engine.paging = False
            self._log(
                "paging stopped: %d messages (%d bytes) wait in the temp store",
                engine.paged_messages,
                engine.paged_bytes,
            )
        if engine.paging:
            target = 0 if short or not self.mark.enabled else self.mark.low
            if engine.held_bytes > target:
                try:
                    engine.page_out(min(self.step_bytes, engine.held_bytes - target))
                except StoreError as exc:  # disk full: the bodies stay in memory
                    log.error("temp store: %s", exc)
        self.store.commit()
        stopped = engine.paging and self.store.full
        if stopped == self.stopped:
            return None
        self.stopped = stopped
        return stopped

    def _log(self, text: str, *args: object) -> None:
        now = time.monotonic()
        if now - self.logged_at < _LOG_INTERVAL_S:
            log.debug(text, *args)
            return
        if self.starts - self.logged_starts > 1:
            text += f" ({self.starts - self.logged_starts} paging starts since the last note)"
        log.info(text, *args)
        self.logged_at, self.logged_starts = now, self.starts

    def statistics(self) -> TempStoreStats:
        stats = self.store.statistics()
        return TempStoreStats(
            paging=self.engine.paging,
            starts=self.starts,
            usage_bytes=stats.usage_bytes,
            limit_bytes=stats.limit_bytes,
            segments=stats.segments,
            messages=self.engine.paged_messages,
            bytes=self.engine.paged_bytes,
            paged_out=self.store.paged_out,
            paged_in=self.store.paged_in,
            full=stats.full,
        )

    def close(self) -> None:
        self.store.close()
