"""What both pipelines do with the records of their partition, between the rings.

A pipeline worker's loop (workers/pipeline.py) reads a batch from every ring and hands each
record to its pipeline (`receive`), lets it do what is due after the batch (`step`), and
writes what it wants sent (`take_output`) to the rings. The pipeline owns the partition's
engines and stores; it knows nothing of rings, doorbells or processes.

Shared by both kinds:

- the restart protocol: a restarted pipeline holds the records its predecessor left in
  the rings until every gateway has re-registered its subscriptions (`Registered`), so a
  topic message sent meanwhile still finds its subscribers; only subscription records pass
  while holding, and after `_HOLD_TIMEOUT_S` it goes on without the gateways that did not
  answer;
- flow control's announcements: the stops and releases of every watched store go to every
  gateway (`FlowState`), and a restarted gateway hears the stops in force;
- the engines' clock and their expiry scans;
- paging of non-persistent messages to the temp store;
- the store's free disk space (`DiskWatch`): persistent producers stop below the limit.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from typing import ClassVar, Final

from mpbroker.admin import QueueWorkerStats, TopicWorkerStats
from mpbroker.config import Config
from mpbroker.engine import Engine, Outbox, QueueEngine
from mpbroker.flow import STORE_DISK, STORE_TEMP, DestinationLimit, FlowTracker
from mpbroker.memory import max_destinations
from mpbroker.records import FlowState, Hello, PipelineHello, Record, Registered, Subscribe

from ._disk import DiskWatch
from ._paging import VolatilePaging

__all__ = ["Pipeline"]

log = logging.getLogger("mpbroker.pipeline")

# How long a restarted pipeline waits for gateways to re-register before it goes on
# without the ones that did not answer (a gateway that is itself restarting).
_HOLD_TIMEOUT_S: Final = 3.0


class Pipeline(ABC):
    """One partition's destinations: records from gateways in, records for them out.

    `index` is the pipeline's index (p2p first, then pubsub), `incarnation` how often it
    was restarted (0: first start), `gateways` how many gateways send to it.
    """

    role: ClassVar[str]

    def __init__(
        self,
        index: int,
        incarnation: int,
        gateways: int,
        config: Config,
        outbox: Outbox,
        queue_engine: QueueEngine,
        paging: VolatilePaging | None,
        disk: DiskWatch | None = None,
    ) -> None:
        self.index = index
        self.incarnation = incarnation
        self.gateways = gateways
        self.config = config
        self.outbox = outbox
        self.queue_engine = queue_engine
        self.paging = paging
        # The store's filesystem against store.disk_free_limit_bytes (None: not watched).
        self.disk = disk
        self._unregistered: set[int] = set(range(gateways)) if incarnation else set()
        self._held: list[tuple[int, Record]] = []
        self._hold_until = time.monotonic() + _HOLD_TIMEOUT_S
        self._next_expiry_scan_ms = 0
        # broker.max_destinations: the kinds count their destinations in it, and the
        # worker shares the count with the other pipelines (`DestinationLimit.others`).
        self.destination_limit = DestinationLimit(
            max_destinations(config), round(config.memory.refuse_destinations_percent * 10)
        )
        self._bound_totals()

    # -- what the worker calls -----------------------------------------------------------

    @property
    @abstractmethod
    def engine(self) -> Engine:
        """The engine of the pipeline's own kind of destination (its counters)."""

    @property
    @abstractmethod
    def flow_trackers(self) -> list[tuple[str, FlowTracker]]:
        """The store limits this pipeline watches, by config section."""

    def hello(self) -> None:
        """Tell every gateway we (re)started, so it registers its subscriptions again."""
        record = PipelineHello(self.index, self.incarnation)
        for gateway in range(self.gateways):
            self.outbox.add(gateway, record)

    @abstractmethod
    def recover(self) -> None:
        """Take back what the stores hold (after a restart or a crash)."""

    def receive(self, gateway: int, record: Record) -> None:
        """A record from a gateway's ring."""
        if isinstance(record, Hello):
            # It knows of no stop: tell it the ones in force.
            for state in self._flow_in_force():
                self.outbox.add(gateway, state)
            if record.incarnation > 0:
                log.info("gateway %d restarted: dropping its consumers", gateway)
        if self._unregistered:
            if isinstance(record, Registered | Hello):
                self._unregistered.discard(gateway)
            elif not isinstance(record, Subscribe):
                self._held.append((gateway, record))
                return
            else:
                # A gateway registering again what our predecessor held: its destination
                # was counted before, and is never refused for the limit now.
                limit = self.destination_limit
                limit.open = True
                try:
                    self._handle(gateway, record)
                finally:
                    limit.open = False
                return
        if not isinstance(record, Registered):
            self._handle(gateway, record)

    def tick(self, now_ms: int) -> None:
        """Before each batch: the engines' clock, and their expiry scans when due (a
        topic's live buffer is scanned like a queue: iBus' live-buffer cleanup)."""
        engines = self._engines()
        for engine in engines:
            engine.tick(now_ms)
        interval = self.config.queues.expiry_scan_interval_s
        if interval and now_ms >= self._next_expiry_scan_ms:
            self._next_expiry_scan_ms = now_ms + int(interval * 1000)
            expired = sum(engine.expire_scan(now_ms) for engine in engines)
            if expired:
                log.info("expired %d messages", expired)

    def step(self, memwatch_level: int, memory_permille: int = 0) -> None:
        """After each batch: what is due (commits, write-back, paging, the held records
        once every gateway re-registered); the flow changes go out. `memory_permille`:
        MemWatch's last reading in thousandths of max_memory (new destinations are refused
        past memory.refuse_destinations_percent)."""
        self.destination_limit.memory_permille = memory_permille
        if self._held and (not self._unregistered or time.monotonic() > self._hold_until):
            self._release_held()
        self._step()
        if self.paging is not None:
            stopped = self.paging.step(memwatch_level)
            if stopped is not None:
                self._announce(FlowState(self.index, STORE_TEMP, "", self._temp_stop(stopped)))
        if self.disk is not None:
            change = self.disk.check(time.monotonic())
            if change is not None:
                self._announce(FlowState(self.index, STORE_DISK, "", change))
        self._announce_flow_changes()

    def take_output(self) -> dict[int, list[Record]]:
        """Records for each gateway since the last call, in order."""
        return self.outbox.take()

    def holding(self) -> bool:
        """Records wait for gateways to re-register (the worker polls until they do)."""
        return bool(self._held)

    @abstractmethod
    def due_in_s(self) -> float | None:
        """Seconds until store work is due (a commit, a cleanup batch); None: nothing."""

    @abstractmethod
    def statistics(self, title: str, pid: int, at_ms: int) -> QueueWorkerStats | TopicWorkerStats:
        """What the admin API shows of this pipeline (`title`, `pid`: its worker's)."""

    def reload(self, config: Config) -> None:
        """SIGHUP: new flow settings; every destination is judged again by them."""
        self.config = config
        for engine in self._engines():
            engine.configure_windows(config.consumer_window_bytes)  # new subscriptions
        self._reconfigure(config)
        # Derived from the budget, which the reloaded watermarks change.
        self.destination_limit.limit = max_destinations(config)
        self._bound_totals()
        if self.paging is not None:
            self.paging.configure(config)
        log.info("flow settings reloaded")

    @abstractmethod
    def close(self, *, clean: bool = False) -> None:
        """Close the stores. `clean`: the worker stops in order (a signal, not an error):
        the stored messages still in consumers' windows are counted as delivered and the
        stores marked, so the next start flags `redelivered` only on messages that were
        delivered (after a crash it flags every one)."""

    # -- what each kind does -------------------------------------------------------------

    @abstractmethod
    def _handle(self, gateway: int, record: Record) -> None:
        """One record, past the restart hold."""

    @abstractmethod
    def _step(self) -> None:
        """What is due after a batch."""

    @abstractmethod
    def _engines(self) -> list[Engine]:
        """Every engine with consumers."""

    @abstractmethod
    def _reconfigure(self, config: Config) -> None:
        """Apply reloaded flow settings to what this kind owns."""

    def _flow_in_force_extra(self) -> list[FlowState]:
        """Stops in force besides the trackers' and paging's (the live buffer, quotas)."""
        return []

    def _flow_changes_extra(self) -> list[FlowState]:
        """Stop changes since the last batch besides the trackers'."""
        return []

    # -- shared helpers ------------------------------------------------------------------

    def _bound_totals(self) -> None:
        """The totals of destinations that are gone are forgotten past the number of
        destinations the broker may hold (they count in a destination's cost)."""
        for engine in self._engines():
            engine.totals.cap = self.destination_limit.limit

    def _temp_stop(self, stopped: bool) -> str:
        return f"limit_bytes {self.config.temp_store.limit_bytes}" if stopped else ""

    def _release_held(self) -> None:
        if self._unregistered:
            log.warning(
                "gateways %s did not re-register within %.0f s; going on without them",
                sorted(self._unregistered),
                _HOLD_TIMEOUT_S,
            )
            self._unregistered.clear()
        held, self._held = self._held, []
        for gateway, record in held:
            self._handle(gateway, record)

    def _flow_in_force(self) -> list[FlowState]:
        index = self.index
        states = [
            FlowState(index, store, destination, reason)
            for store, tracker in self.flow_trackers
            for destination, reason in tracker.stopped().items()
        ]
        states += self._flow_in_force_extra()
        if self.paging is not None and self.paging.stopped:
            states.append(FlowState(index, STORE_TEMP, "", self._temp_stop(True)))
        if self.disk is not None and self.disk.stopped:
            states.append(FlowState(index, STORE_DISK, "", self.disk.reason))
        return states

    def _announce_flow_changes(self) -> None:
        """Stops and releases since the last batch go to every gateway."""
        states = [
            FlowState(self.index, store, change.destination, change.reason)
            for store, tracker in self.flow_trackers
            for change in tracker.changes()
        ]
        states += self._flow_changes_extra()
        for state in states:
            self._announce(state)

    def _announce(self, state: FlowState) -> None:
        what = state.destination or f"every destination ({state.store})"
        if state.reason:
            log.info("flow: producers to %s stopped: %s reached", what, state.reason)
        else:
            log.info("flow: producers to %s may go again", what)
        for gateway in range(self.gateways):
            self.outbox.add(gateway, state)
