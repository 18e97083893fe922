"""Replay worker: reads durable subscriptions' stored backlogs for their pubsub owners.

A durable subscriber coming back asks its owner (the pubsub worker of its topic) for what
waited for it. The owner asks us, batch by batch (`ReplayRequest`); we read the batch from
the owner's topic store through our own SQLite connections (WAL: readers never block the
writer) and send it back (`ReplayBatch`). The owner delivers it: it keeps the subscriber's
window, its acknowledgements and the seam between replay and live delivery, as the only
writer of that subscription's state. The reading - SQLite, decoding bodies - happens here,
so a subscriber returning to a large backlog does not stall the owner's live traffic.

Budgets (`[replay]`): `ReplayScheduler`. With several replay workers, `max_concurrent` and
`global_bytes` are shared out evenly among them.
"""

from __future__ import annotations

import logging
import math
import os
import time

from mpbroker import records
from mpbroker.admin import ReplayStats
from mpbroker.clock import epoch_ms
from mpbroker.engine import ReplayKey, ReplayScheduler
from mpbroker.records import ReplayBatch, ReplayHello, ReplayRelease, ReplayRequest
from mpbroker.shm import Doorbell, Ring, RingReader, park
from mpbroker.stores import StoreError, TopicStoreReader

from ._base import StopOnSignal, WorkerBase
from ._counters import REPLAY_BATCHES, REPLAY_MESSAGES
from ._layout import WorkerSpec, durable_registry, store_directory
from ._outlet import Outlet

__all__ = ["run_replay"]

log = logging.getLogger("mpbroker.replay")

# How often the stored backlogs are counted (one pass over every pending row of a store),
# and the most of the loop's time counting may take (a longer count is made less often:
# 36 ms per million pending rows, measured, is every 5 s up to about 7 million rows).
BACKLOG_PERIOD_MS = 5000
BACKLOG_SHARE = 0.05


class ReplayWorker:
    """One replay worker: the pubsub partitions it serves, their rings and stores."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        layout = spec.layout
        config = spec.config
        # Nothing a replay worker does is reloadable: its [replay] budgets need a restart.
        self.base = WorkerBase(spec, layout.replay_bell(spec.index), reloads=False)
        self.partitions = layout.served_by(spec.index)
        self.rings: list[Ring] = []
        self.bells: list[Doorbell] = []
        self.readers: list[tuple[int, RingReader]] = []
        self.outlets: dict[int, Outlet] = {}
        for p in self.partitions:
            bell = Doorbell.attach(layout.pipeline_bell(p), missing_ok=True)
            requests = Ring.attach(layout.to_replay(p))
            batches = Ring.attach(layout.from_replay(p))
            self.rings += [requests, batches]
            self.bells.append(bell)
            self.readers.append((p, requests.reader()))
            self.outlets[p] = Outlet(batches.writer(bell))
        replay = config.replay
        share = layout.replayers
        self.scheduler = ReplayScheduler(
            max_concurrent=math.ceil(replay.max_concurrent / share),
            global_bytes=max(replay.replay_bytes, replay.global_bytes // share),
            batch_messages=replay.replay_messages,
            batch_bytes=replay.replay_bytes,
        )
        self.stores: dict[int, TopicStoreReader] = {}
        self.batches = 0
        self.messages = 0
        # (messages, batches) replayed per subscription, logged when it is released.
        self.progress: dict[ReplayKey, tuple[int, int]] = {}
        # The stored backlog of every durable subscription of our partitions, for the admin
        # API and /metrics: read here, off the owners' loops, every BACKLOG_PERIOD_MS.
        self.backlogs: dict[str, int] = {}
        self.backlogs_at_ms: int | None = None
        self.backlog_period_ms = BACKLOG_PERIOD_MS

    def _store(self, partition: int) -> TopicStoreReader:
        store = self.stores.get(partition)
        if store is None:
            config = self.spec.config
            store = TopicStoreReader(
                store_directory(config, "pubsub", partition),
                durable_registry(config, partition),
                config.store.sqlite_cache_bytes,
            )
            self.stores[partition] = store
        return store

    def announce(self) -> None:
        hello = ReplayHello(self.spec.index, self.spec.incarnation)
        for outlet in self.outlets.values():
            outlet.add(hello)
        self.flush()

    def step(self) -> bool:
        """Take the owners' requests, read what the budget allows; True if busy."""
        busy = False
        for _, reader in self.readers:
            for kind, payload in reader.read_batch(self.spec.config.rings.batch_records):
                busy = True
                record = records.decode(kind, payload)
                if isinstance(record, ReplayRequest):
                    self.scheduler.request(record)
                elif isinstance(record, ReplayRelease):
                    self.scheduler.release(record.partition, record.name)
                    self._released(record)
        while (grant := self.scheduler.next_grant()) is not None:
            request = grant.request
            try:
                batch = self._store(request.partition).batch(
                    request.name,
                    request.after,
                    max_messages=grant.max_messages,
                    max_bytes=grant.max_bytes,
                    at_least_one=grant.at_least_one,
                    now_ms=epoch_ms(),
                    redeliver_below=request.redeliver_below,
                )
            except StoreError as exc:
                # The owner keeps waiting; we retry at the next wake-up with a fresh
                # connection (the store may have been in the middle of a change).
                log.error("cannot read the backlog of %r: %s", request.name, exc)
                self.stores.pop(request.partition).close()
                break
            fitted = bool(batch.messages) or not batch.more
            self.scheduler.sent(grant, batch.bytes, fitted=fitted)
            if not fitted:
                continue
            busy = True
            self.outlets[request.partition].add(
                ReplayBatch(
                    request.name,
                    request.request_id,
                    batch.messages,
                    batch.expired,
                    batch.scanned_upto,
                    batch.more,
                )
            )
            self.batches += 1
            self.messages += len(batch.messages)
            messages, batches = self.progress.get(grant.key, (0, 0))
            self.progress[grant.key] = (messages + len(batch.messages), batches + 1)
        self.flush()
        return busy

    def _released(self, release: ReplayRelease) -> None:
        for key in [k for k in self.progress if k[0] == release.partition]:
            if release.name and key[1] != release.name:
                continue
            messages, batches = self.progress.pop(key)
            if messages and release.name:
                log.info(
                    "durable subscription %r: replayed %d messages in %d batches",
                    key[1],
                    messages,
                    batches,
                )

    def _read_backlogs(self, now: int) -> None:
        """Count every subscription's stored backlog again, when it is time to: every
        BACKLOG_PERIOD_MS, or less often when counting takes long (a pass over every
        pending row runs on this loop: at most BACKLOG_SHARE of its time)."""
        if self.backlogs_at_ms is not None and now - self.backlogs_at_ms < self.backlog_period_ms:
            return
        started = time.monotonic()
        backlogs: dict[str, int] = {}
        for partition in self.partitions:
            try:
                backlogs.update(self._store(partition).backlogs())
            except StoreError as exc:
                # Not there yet (no durable subscription was ever made), or changing: the
                # next reading tries again with a fresh connection.
                log.debug("cannot count the backlogs of pubsub %d: %s", partition, exc)
                store = self.stores.pop(partition, None)
                if store is not None:
                    store.close()
        self.backlogs = backlogs
        self.backlogs_at_ms = now
        took_ms = (time.monotonic() - started) * 1000
        self.backlog_period_ms = max(BACKLOG_PERIOD_MS, int(took_ms / BACKLOG_SHARE))

    def _publish_stats(self) -> None:
        now = self.base.stats_due()
        if now is None:
            return
        self._read_backlogs(now)
        scheduler = self.scheduler
        self.base.publish_stats(
            ReplayStats(
                title=self.spec.title,
                pid=os.getpid(),
                at_ms=now,
                replaying=[name for _, name in scheduler.places],
                waiting_for_a_place=[name for _, name in scheduler.waiting],
                in_flight_bytes=scheduler.in_flight_bytes,
                batches=self.batches,
                messages=self.messages,
                backlogs=self.backlogs,
                backlogs_at_ms=self.backlogs_at_ms,
            )
        )

    def flush(self) -> None:
        for outlet in self.outlets.values():
            outlet.flush()

    def run(self, stop: StopOnSignal) -> None:
        """Serve until `stop` is asked for (a signal) or the supervisor is gone."""
        base = self.base
        park_timeout = self.spec.config.rings.park_timeout_ms / 1000
        self.announce()
        base.ready()
        readers = [reader for _, reader in self.readers]
        while not stop.requested:
            busy = self.step()
            base.turn()
            base.slot.set_counter(REPLAY_BATCHES, self.batches)
            base.slot.set_counter(REPLAY_MESSAGES, self.messages)
            self._publish_stats()
            if busy:
                continue
            if base.supervisor_gone():
                log.warning("supervisor is gone: stopping")
                return
            # A full ring to an owner, or a read that failed: retry soon.
            waiting = any(self.outlets.values()) or self.scheduler.busy
            park(readers, base.doorbell, 0.01 if waiting else park_timeout)

    def close(self) -> None:
        for store in self.stores.values():
            store.close()
        for ring in self.rings:
            ring.close()
        for bell in self.bells:
            bell.close()
        self.base.close()


def run_replay(spec: WorkerSpec) -> None:
    stop = StopOnSignal()
    worker = ReplayWorker(spec)
    stop.wake(worker.base.doorbell)
    try:
        worker.run(stop)
    finally:
        worker.close()
