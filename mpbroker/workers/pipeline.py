"""Pipeline worker (p2p or pubsub): rings from the gateways -> engine -> rings back.

A plain synchronous loop, no event loop: it has no sockets. It drains every inbound ring
in batches, lets the engine handle each record, writes the engine's output with one ring
publish per gateway per batch, and parks on its doorbell when there is nothing to do.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Callable

from mpbroker import records
from mpbroker.clock import epoch_ms
from mpbroker.config import Config
from mpbroker.engine import Engine, Outbox, QueueEngine, TopicEngine
from mpbroker.errors import LimitReached, NeverFits
from mpbroker.flow import (
    STORE_LIVE,
    STORE_PERSISTENT_QUEUES,
    STORE_QUOTAS,
    STORE_TEMP,
    STORE_TOPICS,
    STORE_VOLATILE_QUEUES,
    FlowTracker,
    QuotaBook,
    Watermark,
    destination_limits,
    expiry_policies,
    store_limits,
)
from mpbroker.records import (
    Barrier,
    FlowState,
    Hello,
    PipelineHello,
    Refuse,
    Registered,
    ReplayBatch,
    ReplayHello,
    Send,
    Subscribe,
    message_size,
)
from mpbroker.shm import (
    STATE_READY,
    ControlBlock,
    Doorbell,
    Ring,
    RingReader,
    StatsBlock,
    park,
)
from mpbroker.stores import MessageStore, TopicStore

from . import _stats
from ._bootstrap import StopOnSignal
from ._gc import LevelGC
from ._layout import WorkerSpec, durable_registry, store_directory, temp_directory
from ._outlet import Outlet
from ._reload import ConfigWatch
from .durable import Durables
from .paging import (
    VolatilePaging,
    live_byte_mark,
    paging_enabled,
    queue_paging_mark,
    topic_paging_mark,
    volatile_limits,
)
from .persistence import QueuePersistence

__all__ = ["run_pipeline"]

log = logging.getLogger("mpbroker.pipeline")
# The expiry policy `log`: one line per expired message, in WebLogic's format.
expiry_log = logging.getLogger("mpbroker.expiry")

# How long a restarted pipeline waits for gateways to re-register before it goes on
# without the ones that did not answer (a gateway that is itself restarting).
_HOLD_TIMEOUT_S = 3.0

COUNTER_RECEIVED = 0
COUNTER_DELIVERED = 1


def _live_marks(config: Config) -> Callable[[str], Watermark]:
    """A topic's live-buffer watermarks: its [destinations] table's, or topics.live_*."""
    default = Watermark(config.topics.live_msg_high, config.topics.live_msg_low)

    def mark_for(topic: str) -> Watermark:
        table = config.destination(topic)
        if table is None or table.live_msg_high is None or table.live_msg_low is None:
            return default
        # High and low are set together in a table (the config refuses half a pair).
        return Watermark(table.live_msg_high, table.live_msg_low)

    return mark_for


class Pipeline:
    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        layout = spec.layout
        config = spec.config
        self.index = spec.index
        self.control = ControlBlock.attach(layout.control)
        self.slot = self.control.slot(spec.slot)
        self.stats = StatsBlock.attach(layout.stats(spec.slot))
        self.next_stats_ms = 0
        self.config_watch = ConfigWatch(self.control, spec)
        self.level_gc = LevelGC(self.control, spec.config)
        self.doorbell = Doorbell.create(layout.pipeline_bell(spec.index))
        self.gateway_bells = [
            Doorbell.attach(layout.gateway_bell(g), missing_ok=True) for g in range(layout.gateways)
        ]
        self.rings: list[Ring] = []
        self.readers: list[RingReader] = []
        self.outlets: list[Outlet] = []
        for g in range(layout.gateways):
            in_ring = Ring.attach(layout.to_pipeline(g, spec.index))
            out_ring = Ring.attach(layout.to_gateway(spec.index, g))
            self.rings += [in_ring, out_ring]
            self.readers.append(in_ring.reader())
            self.outlets.append(Outlet(out_ring.writer(self.gateway_bells[g])))
        self.park_readers = list(self.readers)
        self.outbox = Outbox()
        # A restarted pipeline holds what its predecessor left in the rings until every
        # gateway has re-registered its subscriptions (`Registered`), so that a topic
        # message sent while we were down still finds its subscribers. Only subscription
        # records pass while holding.
        self.unregistered: set[int] = set(range(layout.gateways)) if spec.incarnation else set()
        self.held: list[tuple[int, records.Record]] = []
        self.hold_until = time.monotonic() + _HOLD_TIMEOUT_S
        self.next_expiry_scan_ms = 0
        self.engine: Engine
        self.queue_engine: QueueEngine
        self.persistence: QueuePersistence | None = None
        self.durables: Durables | None = None
        # pubsub only: the replay worker's ring to us, and ours to it.
        self.replay_reader: RingReader | None = None
        self.replay_outlet: Outlet | None = None
        self.replay_bell: Doorbell | None = None
        # Flow control: the store limits this worker watches, by config section.
        self.flow_trackers: list[tuple[str, FlowTracker]] = []
        self.topic_engine: TopicEngine | None = None
        # Named quotas (p2p): SENDs waiting for room, by ticket, in arrival order, with
        # their deadline; and the destinations whose producers the gateways hold meanwhile.
        self.quotas: QuotaBook | None = None
        self.quota_held: dict[int, tuple[int, Send, int]] = {}
        self.quota_tickets = itertools.count(1)
        self.quota_stops: dict[str, str] = {}
        self.paging: VolatilePaging | None = None
        if spec.role == "p2p":
            engine = QueueEngine(config.queues, spec.index, self.outbox)
            engine.flow_volatile = FlowTracker(
                volatile_limits(config), destination_limits(config, STORE_VOLATILE_QUEUES)
            )
            engine.flow_persistent = FlowTracker(
                store_limits(config.pers_queue_store),
                destination_limits(config, STORE_PERSISTENT_QUEUES),
            )
            self.flow_trackers = [
                (STORE_VOLATILE_QUEUES, engine.flow_volatile),
                (STORE_PERSISTENT_QUEUES, engine.flow_persistent),
            ]
            topology = layout.topology
            engine.expiry_for = expiry_policies(
                config, owns=lambda queue: topology.owner(queue) == spec.index
            )
            if config.quotas:
                self.quotas = engine.quotas = QuotaBook(config)
            store = MessageStore.open(store_directory(config, "p2p", spec.index), config.store)
            self.persistence = QueuePersistence(store, engine, self.outbox, config)
            if paging_enabled(config):
                self.paging = VolatilePaging(
                    engine, config, temp_directory(config, "p2p", spec.index), queue_paging_mark
                )
            self.engine = self.queue_engine = engine
        else:
            topics = TopicEngine(config.topics, spec.index, self.outbox)
            topics.live_mark_for = _live_marks(config)
            topics.global_live_bytes.mark = live_byte_mark(config)
            if paging_enabled(config):
                self.paging = VolatilePaging(
                    topics, config, temp_directory(config, "pubsub", spec.index), topic_paging_mark
                )
            queues = QueueEngine(config.queues, spec.index, self.outbox)
            topic_store = TopicStore(
                store_directory(config, "pubsub", spec.index),
                durable_registry(config, spec.index),
                config.store,
            )
            self.durables = Durables(
                topic_store, topics, queues, self.outbox, config, spec.index, spec.incarnation
            )
            self.durables.flow = FlowTracker(
                store_limits(config.topic_store), destination_limits(config, STORE_TOPICS)
            )
            self.flow_trackers = [(STORE_TOPICS, self.durables.flow)]
            self.engine = self.topic_engine = topics
            self.queue_engine = queues
            batches = Ring.attach(layout.from_replay(spec.index))
            requests = Ring.attach(layout.to_replay(spec.index))
            self.rings += [batches, requests]
            self.replay_bell = Doorbell.attach(
                layout.replay_bell(layout.replayer_of(spec.index)), missing_ok=True
            )
            self.replay_reader = batches.reader()
            self.park_readers.append(self.replay_reader)
            self.replay_outlet = Outlet(requests.writer(self.replay_bell))

    def _configure_windows(self, config: Config) -> None:
        for engine in (self.engine, self.queue_engine):
            engine.window_bytes_for = config.consumer_window_bytes

    def announce(self) -> None:
        """Tell every gateway we (re)started so it registers its subscriptions again."""
        hello = PipelineHello(self.spec.index, self.spec.incarnation)
        for g in range(len(self.outlets)):
            self.outbox.add(g, hello)
        self.flush()

    def step(self) -> bool:
        """Handle one batch from every ring; True if there was anything to do."""
        self._expiry(epoch_ms())
        batch_records = self.spec.config.rings.batch_records
        decode = records.decode
        busy = False
        for gateway, reader in enumerate(self.readers):
            batch = reader.read_batch(batch_records)
            if not batch:
                continue
            busy = True
            for kind, payload in batch:
                record = decode(kind, payload)
                if isinstance(record, Hello):
                    # That gateway restarted: what we still owed its old connections is moot.
                    self.outlets[gateway].clear()
                    # It knows of no stop: tell it the ones in force.
                    for state in self._flow_in_force():
                        self.outbox.add(gateway, state)
                    if record.incarnation > 0:
                        log.info("gateway %d restarted: dropping its consumers", gateway)
                if self.unregistered:
                    if isinstance(record, Registered | Hello):
                        self.unregistered.discard(gateway)
                    elif not isinstance(record, Subscribe):
                        self.held.append((gateway, record))
                        continue
                if not isinstance(record, Registered):
                    self._handle(gateway, record)
        if self.held and (not self.unregistered or time.monotonic() > self.hold_until):
            self._release_held()
        if self.durables is not None:
            busy |= self._replay_step(self.durables)
        elif self.persistence is not None:
            self.persistence.commit_if_due()
            self.persistence.write_back()
            if self.quotas is not None:
                self._quota_step(self.quotas)
        if self.paging is not None:
            self._paging_step(self.paging)
        self.flush()
        return busy

    def _paging_step(self, paging: VolatilePaging) -> None:
        stopped = paging.step(self.control.memwatch_level)
        if stopped is not None:
            self._announce(FlowState(self.spec.index, STORE_TEMP, "", self._temp_stop(stopped)))

    def _temp_stop(self, stopped: bool) -> str:
        return f"limit_bytes {self.spec.config.temp_store.limit_bytes}" if stopped else ""

    def _replay_step(self, durables: Durables) -> bool:
        """Batches from the replay worker; requests for more; the store's write-back."""
        assert self.replay_reader is not None
        batch = self.replay_reader.read_batch(self.spec.config.rings.batch_records)
        for kind, payload in batch:
            record = records.decode(kind, payload)
            if isinstance(record, ReplayBatch):
                durables.replayed(record)
            elif isinstance(record, ReplayHello):
                if record.incarnation > 0:
                    log.info("replay worker %d restarted: asking again", record.worker)
                durables.replayer_restarted()
        durables.pump()
        durables.persistence.commit_if_due()
        durables.persistence.write_back(self.queue_engine)
        return bool(batch)

    def _handle(self, gateway: int, record: records.Record, *, reserved: bool = False) -> None:
        if self.durables is not None:
            if isinstance(record, Barrier):
                # A barrier answers for every earlier frame: commit those first.
                self.durables.persistence.commit()
            self.durables.handle(gateway, record)
            return
        if (
            self.quotas is not None
            and not reserved
            and isinstance(record, Send)
            and not self._reserve(self.quotas, gateway, record)
        ):
            return  # it waits for room in its quota
        if self.persistence is not None:
            if isinstance(record, Barrier):
                self.persistence.commit()
            elif isinstance(record, Send) and record.message.persistent:
                self.persistence.offer(gateway, record)  # the engine gets it once stored
                return
        self.engine.handle(gateway, record)

    def _reserve(self, quotas: QuotaBook, gateway: int, record: Send) -> bool:
        """Room for a SEND in its destination's quota: True if it may go on now; else it
        waits here (at most its send timeout) or, if it can never fit, is refused."""
        message = record.message
        message.size = message_size(message)
        destination = message.destination
        if not quotas.fits_ever(destination, message.size):
            refusal = NeverFits(
                destination,
                quotas.describe(destination),
                message.size,
                "The message was not accepted.",
            )
            self.outbox.add(gateway, Refuse.of(record.conn, refusal, record.receipt))
            return False
        ticket = next(self.quota_tickets)
        if quotas.request(ticket, destination, message.size):
            return True
        deadline = epoch_ms() + self.spec.config.send_timeout_ms(destination)
        self.quota_held[ticket] = (gateway, record, deadline)
        return False

    def _quota_step(self, quotas: QuotaBook) -> None:
        """Let in the SENDs their quota has room for now; refuse those whose send timeout
        passed; stop and release the producers of destinations with waiting senders."""
        engine = self.queue_engine
        granted, engine.quota_granted = engine.quota_granted, []
        now = epoch_ms()
        for ticket, (gateway, record, deadline) in list(self.quota_held.items()):
            if now < deadline:
                continue
            del self.quota_held[ticket]
            granted += quotas.cancel(ticket)
            destination = record.message.destination
            timeout = self.spec.config.send_timeout_ms(destination)
            refusal = LimitReached(
                destination,
                quotas.describe(destination),
                detail=f"The message was not accepted: it waited send_timeout_ms {timeout} for "
                "room in the quota.",
            )
            self.outbox.add(gateway, Refuse.of(record.conn, refusal, record.receipt))
        for ticket in granted:
            held = self.quota_held.pop(ticket, None)
            if held is not None:
                self._handle(held[0], held[1], reserved=True)
        waiting = {record.message.destination for _, record, _ in self.quota_held.values()}
        index = self.spec.index
        for destination in waiting - self.quota_stops.keys():
            reason = self.quota_stops[destination] = quotas.describe(destination)
            self._announce(FlowState(index, STORE_QUOTAS, destination, reason))
        for destination in self.quota_stops.keys() - waiting:
            del self.quota_stops[destination]
            self._announce(FlowState(index, STORE_QUOTAS, destination, ""))

    def _expiry(self, now_ms: int) -> None:
        """Keep the queue engine's clock, and scan for expired messages on schedule."""
        engine = self.queue_engine
        engine.now_ms = now_ms
        interval = self.spec.config.queues.expiry_scan_interval_s
        if interval and now_ms >= self.next_expiry_scan_ms:
            self.next_expiry_scan_ms = now_ms + int(interval * 1000)
            expired = engine.expire_scan(now_ms)
            if expired:
                log.info("expired %d messages", expired)

    def _release_held(self) -> None:
        if self.unregistered:
            log.warning(
                "gateways %s did not re-register within %.0f s; going on without them",
                sorted(self.unregistered),
                _HOLD_TIMEOUT_S,
            )
            self.unregistered.clear()
        held, self.held = self.held, []
        for gateway, record in held:
            self._handle(gateway, record)

    def _flow_in_force(self) -> list[FlowState]:
        index = self.spec.index
        states = [
            FlowState(index, store, destination, reason)
            for store, tracker in self.flow_trackers
            for destination, reason in tracker.stopped().items()
        ]
        if self.topic_engine is not None:
            states += [
                FlowState(index, STORE_LIVE, topic, reason)
                for topic, reason in self.topic_engine.live_stops().items()
            ]
        states += [
            FlowState(index, STORE_QUOTAS, destination, reason)
            for destination, reason in self.quota_stops.items()
        ]
        if self.paging is not None and self.paging.stopped:
            states.append(FlowState(index, STORE_TEMP, "", self._temp_stop(True)))
        return states

    def _announce_flow_changes(self) -> None:
        """Stops and releases since the last batch go to every gateway."""
        index = self.spec.index
        states = [
            FlowState(index, store, change.destination, change.reason)
            for store, tracker in self.flow_trackers
            for change in tracker.changes()
        ]
        if self.topic_engine is not None and self.topic_engine.flow_changes:
            states += [
                FlowState(index, STORE_LIVE, change.destination, change.reason)
                for change in self.topic_engine.flow_changes
            ]
            self.topic_engine.flow_changes.clear()
        for state in states:
            self._announce(state)

    def _announce(self, state: FlowState) -> None:
        what = state.destination or f"every destination ({state.store})"
        if state.reason:
            log.info("flow: producers to %s stopped: %s reached", what, state.reason)
        else:
            log.info("flow: producers to %s may go again", what)
        for gateway in range(len(self.outlets)):
            self.outbox.add(gateway, state)

    def flush(self) -> None:
        self._announce_flow_changes()
        if self.queue_engine.expiry_log:
            for line in self.queue_engine.expiry_log:
                expiry_log.info("%s", line)
            self.queue_engine.expiry_log.clear()
        for gateway, batch in self.outbox.take().items():
            outlet = self.outlets[gateway]
            for record in batch:
                outlet.add(record)
        for outlet in self.outlets:
            outlet.flush()
        if self.replay_outlet is not None and self.durables is not None:
            for record in self.durables.to_replay:
                self.replay_outlet.add(record)
            self.durables.to_replay.clear()
            self.replay_outlet.flush()

    def _outlets_waiting(self) -> bool:
        """A ring was full: records wait for a slow or restarting reader."""
        return any(self.outlets) or bool(self.replay_outlet)

    def run(self, stop: StopOnSignal) -> None:
        """Serve until `stop` is asked for (a signal) or the supervisor is gone."""
        self._configure_windows(self.spec.config)
        park_timeout = self.spec.config.rings.park_timeout_ms / 1000
        parent = os.getppid()
        if self.persistence is not None:
            restored = self.persistence.recover()
            if restored:
                log.info("recovered %d persistent messages from the store", restored)
        if self.durables is not None:
            orphans = self.durables.recover()
            if orphans:
                log.info("settled %d stored topic messages no subscription wanted", orphans)
        self.announce()
        self.slot.pid = os.getpid()
        self.slot.incarnation = self.spec.incarnation
        self.slot.beat()  # before READY: the supervisor judges ready workers by it
        self.slot.state = STATE_READY
        while not stop.requested:
            busy = self.step()
            self.slot.beat()
            self.slot.set_counter(COUNTER_RECEIVED, self.engine.received)
            self.slot.set_counter(COUNTER_DELIVERED, self.engine.delivered)
            self._publish_stats()
            self.level_gc.tick()
            reloaded = self.config_watch.poll()
            if reloaded is not None:
                self.reload(reloaded)
            if busy:
                continue
            due = self._commit_due_in_s()
            if due is not None:
                # A batch waits for its commit delay: sleep no longer than that.
                park(self.park_readers, self.doorbell, max(0.0, due))
                continue
            if self.held:
                # Holding for re-registration: poll until it completes or times out.
                park(self.park_readers, self.doorbell, 0.01)
                continue
            if self._outlets_waiting():
                # A gateway is slow or restarting: retry soon rather than park.
                time.sleep(0.001)
                continue
            if os.getppid() != parent:
                log.warning("supervisor is gone: stopping")
                return
            park(self.park_readers, self.doorbell, park_timeout)

    def reload(self, config: Config) -> None:
        """SIGHUP: new flow settings; every destination is judged again by them."""
        spec = self.spec = dataclasses.replace(self.spec, config=config)
        self._configure_windows(config)  # for new subscriptions
        for store, tracker in self.flow_trackers:
            limits = (
                volatile_limits(config)
                if store == STORE_VOLATILE_QUEUES
                else store_limits(getattr(config, store))
            )
            tracker.reconfigure(limits, destination_limits(config, store))
        if self.paging is not None:
            self.paging.configure(config)
        if self.topic_engine is not None:
            topics = config.topics
            self.topic_engine.reconfigure_live(
                Watermark(topics.live_msg_high, topics.live_msg_low),
                _live_marks(config),
                Watermark(topics.global_live_msg_high, topics.global_live_msg_low),
                live_byte_mark(config),
            )
        if self.durables is not None:
            self.durables.persistence.configure_expiry(config)
        else:
            topology = spec.layout.topology
            self.queue_engine.expiry_for = expiry_policies(
                config, owns=lambda queue: topology.owner(queue) == spec.index
            )
        log.info("flow settings reloaded")

    def _publish_stats(self) -> None:
        now = epoch_ms()
        if now < self.next_stats_ms:
            return
        self.next_stats_ms = now + self.spec.config.admin.stats_interval_ms
        snapshot: dict[str, object] = {
            "title": self.spec.title,
            "pid": os.getpid(),
            "at_ms": now,
            "received": self.engine.received,
            "delivered": self.engine.delivered,
        }
        if self.durables is None:
            snapshot.update(_stats.queues(self.queue_engine, self.flow_trackers))
            snapshot.update(_stats.consumers(self.queue_engine))
        else:
            assert self.topic_engine is not None
            snapshot.update(_stats.topics(self.topic_engine, self.flow_trackers))
            snapshot.update(_stats.consumers(self.topic_engine, self.queue_engine))
            snapshot["durable_subscriptions"] = self.durables.stats()
        if self.paging is not None:
            snapshot["temp_store"] = self.paging.statistics()
        _stats.publish(self.stats, snapshot)

    def _commit_due_in_s(self) -> float | None:
        if self.durables is not None:
            return self.durables.persistence.due_in_s()
        if self.persistence is not None:
            return self.persistence.due_in_s()
        return None

    def close(self) -> None:
        if self.persistence is not None:
            self.persistence.store.close()
        if self.paging is not None:
            self.paging.close()
        if self.durables is not None:
            self.durables.store.close()
        if self.replay_bell is not None:
            self.replay_bell.close()
        for ring in self.rings:
            ring.close()
        for bell in self.gateway_bells:
            bell.close()
        self.doorbell.close()
        self.stats.close()
        self.control.close()


def run_pipeline(spec: WorkerSpec) -> None:
    stop = StopOnSignal()
    pipeline = Pipeline(spec)
    stop.wake(pipeline.doorbell)
    try:
        pipeline.run(stop)
    finally:
        pipeline.close()
