"""The point-to-point pipeline: the queues of one partition.

Non-persistent messages live in memory (the VolQueueStore) and, while memory is short, in
the temp store; persistent ones are stored (group commit) before the engine takes them, and
keep only an index entry in memory beyond the index cache. Named quotas hold SENDs that
wait for room.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mpbroker.admin import QueueWorkerStats, queue_worker_stats
from mpbroker.config import Config
from mpbroker.engine import STOPS, Engine, Outbox, QueueEngine
from mpbroker.flow import (
    STORE_PERSISTENT_QUEUES,
    STORE_QUOTAS,
    STORE_VOLATILE_QUEUES,
    ExpiryPolicy,
    FlowTracker,
    QuotaBook,
    destination_limits,
    expiry_policies,
    store_limits,
)
from mpbroker.records import Barrier, FlowState, Record, Send
from mpbroker.routing import Topology
from mpbroker.stores import MessageStore, TempStore

from ._base import Pipeline
from ._disk import DiskWatch
from ._paging import VolatilePaging, queue_paging_mark, volatile_limits
from ._persistence import QueuePersistence, index_cache
from ._quota import QuotaWaitingRoom

__all__ = ["P2PPipeline"]

# The expiry policy `log`: one line per expired message, in WebLogic's format.
expiry_log = logging.getLogger("mpbroker.expiry")


def _queue_expiry(config: Config, topology: Topology, index: int) -> Callable[[str], ExpiryPolicy]:
    """Expiry policies for the queues of partition `index` (a redirect target must be ours)."""
    return expiry_policies(config, owns=lambda queue: topology.owner(queue) == index)


class P2PPipeline(Pipeline):
    """The queues of one partition: `store` keeps their persistent messages, `temp_store`
    (None: no paging) the non-persistent ones paged out of memory."""

    role = "p2p"

    def __init__(
        self,
        index: int,
        incarnation: int,
        gateways: int,
        config: Config,
        topology: Topology,
        store: MessageStore,
        temp_store: TempStore | None,
    ) -> None:
        outbox = Outbox()
        self.topology = topology
        self.flow_volatile = FlowTracker(
            volatile_limits(config), destination_limits(config, STORE_VOLATILE_QUEUES)
        )
        self.flow_persistent = FlowTracker(
            store_limits(config.pers_queue_store),
            destination_limits(config, STORE_PERSISTENT_QUEUES),
        )
        quotas = QuotaBook(config) if config.quotas else None
        engine = QueueEngine(
            config.queues,
            index,
            outbox,
            window_bytes_for=config.consumer_window_bytes,
            flow_volatile=self.flow_volatile,
            flow_persistent=self.flow_persistent,
            expiry_for=_queue_expiry(config, topology, index),
            quotas=quotas,
            index_cache=index_cache(store, config),
            pager=temp_store,
        )
        paging = None
        if temp_store is not None:
            paging = VolatilePaging(engine, temp_store, config, queue_paging_mark)
        disk = DiskWatch(store, config)
        super().__init__(index, incarnation, gateways, config, outbox, engine, paging, disk)
        self.persistence = QueuePersistence(store, engine, outbox, config)
        self.quota_room = (
            QuotaWaitingRoom(quotas, outbox, lambda d: self.config.send_timeout_ms(d))
            if quotas is not None
            else None
        )
        engine.destination_limit = self.destination_limit
        self.destination_limit.count_with(lambda: len(engine.queues))

    @property
    def engine(self) -> Engine:
        return self.queue_engine

    @property
    def flow_trackers(self) -> list[tuple[str, FlowTracker]]:
        return [
            (STORE_VOLATILE_QUEUES, self.flow_volatile),
            (STORE_PERSISTENT_QUEUES, self.flow_persistent),
        ]

    def recover(self) -> None:
        restored = self.persistence.recover()
        if restored:
            logging.getLogger("mpbroker.pipeline").info(
                "recovered %d persistent messages from the store", restored
            )

    def due_in_s(self) -> float | None:
        return self.persistence.due_in_s()

    def statistics(self, title: str, pid: int, at_ms: int) -> QueueWorkerStats:
        temp = self.paging.statistics() if self.paging is not None else None
        quota_stops = self.quota_room.stops() if self.quota_room is not None else None
        return queue_worker_stats(
            title,
            pid,
            at_ms,
            self.queue_engine,
            self.flow_trackers,
            temp,
            quota_stops,
            self.destination_limit.refused,
        )

    def close(self, *, clean: bool = False) -> None:
        if clean:
            self.persistence.stop_cleanly()
        self.persistence.store.close()
        if self.paging is not None:
            self.paging.close()

    def _handle(self, gateway: int, record: Record, *, reserved: bool = False) -> None:
        if (
            self.quota_room is not None
            and not reserved
            and isinstance(record, Send)
            and not self.quota_room.admit(gateway, record, self.queue_engine.now_ms)
        ):
            return  # it waits for room in its quota
        if isinstance(record, Barrier):
            if (
                self.quota_room is not None
                and not reserved
                and self.quota_room.holds_barrier(gateway, record)
            ):
                return  # it waits for the SENDs of its connection still in the quota room
            # A barrier answers for every earlier frame: commit those first, and answer
            # the acknowledgements before it (a COMMIT's or DISCONNECT's RECEIPT must not
            # overtake the ERROR of an ACK that could not be stored).
            self.persistence.commit()
            self._write_back()
        elif isinstance(record, Send) and record.message.persistent:
            self.persistence.offer(gateway, record)  # the engine gets it once stored
            return
        self.queue_engine.handle(gateway, record)

    def _step(self) -> None:
        self.persistence.commit_if_due()
        self._write_back()
        limit = self.destination_limit
        if limit.reserved and not len(self.persistence.buffer):
            # Every admitted SEND was stored and its queue made, or refused by the store.
            limit.reserved.clear()

    def _write_back(self) -> None:
        """What the engine left since the last time: written to the store and answered;
        quota room given back lets waiting SENDs in."""
        effects = self.queue_engine.take_effects()
        self.persistence.write_back(effects)
        for line in effects.expiry_log:
            expiry_log.info("%s", line)
        if self.quota_room is not None:
            admitted, changes = self.quota_room.step(
                effects.quota_granted, self.queue_engine.now_ms
            )
            for gateway, record in admitted:
                self._handle(gateway, record, reserved=True)
            for change in changes:
                if change.reason:  # (a change with a reason is a new stop)
                    self.queue_engine.totals.add(change.destination, STOPS)
                self._announce(
                    FlowState(self.index, STORE_QUOTAS, change.destination, change.reason)
                )

    def _engines(self) -> list[Engine]:
        return [self.queue_engine]

    def _reconfigure(self, config: Config) -> None:
        self.flow_volatile.reconfigure(
            volatile_limits(config), destination_limits(config, STORE_VOLATILE_QUEUES)
        )
        self.flow_persistent.reconfigure(
            store_limits(config.pers_queue_store),
            destination_limits(config, STORE_PERSISTENT_QUEUES),
        )
        self.queue_engine.configure_expiry(_queue_expiry(config, self.topology, self.index))

    def _flow_in_force_extra(self) -> list[FlowState]:
        if self.quota_room is None:
            return []
        return [
            FlowState(self.index, STORE_QUOTAS, destination, reason)
            for destination, reason in self.quota_room.stops().items()
        ]
