"""Pipeline worker (p2p or pubsub): rings from the gateways -> pipeline -> rings back.

A plain synchronous loop, no event loop: it has no sockets. It drains every inbound ring
in batches and hands each record to its pipeline (`mpbroker.pipeline`), lets the pipeline
do what is due after the batch, writes what the pipeline wants sent with one ring publish
per gateway per batch, and parks on its doorbell when there is nothing to do.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from mpbroker import records
from mpbroker.clock import epoch_ms
from mpbroker.pipeline import P2PPipeline, Pipeline, PubSubPipeline, open_temp_store, paging_enabled
from mpbroker.records import Hello, Record
from mpbroker.shm import STATE_EMPTY, ControlBlock, Doorbell, Ring, RingReader, park
from mpbroker.stores import MessageStore, TopicStore

from ._base import StopOnSignal, WorkerBase
from ._counters import PIPELINE_DELIVERED, PIPELINE_DESTINATIONS, PIPELINE_RECEIVED
from ._layout import Layout, WorkerSpec, durable_registry, store_directory, temp_directory
from ._outlet import Outlet

__all__ = ["gateway_watch", "process_ended", "run_pipeline"]

log = logging.getLogger("mpbroker.pipeline")


def open_pipeline(spec: WorkerSpec) -> Pipeline:
    """The pipeline of `spec`'s partition, with its stores opened."""
    config = spec.config
    layout = spec.layout
    temp = None
    if paging_enabled(config):
        temp = open_temp_store(config, temp_directory(config, spec.role, spec.index))
    if spec.role == "p2p":
        store = MessageStore.open(store_directory(config, "p2p", spec.index), config.store)
        return P2PPipeline(
            spec.index, spec.incarnation, layout.gateways, config, layout.topology, store, temp
        )
    topic_store = TopicStore(
        store_directory(config, "pubsub", spec.index),
        durable_registry(config, spec.index),
        config.store,
    )
    return PubSubPipeline(spec.index, spec.incarnation, layout.gateways, config, topic_store, temp)


# The kernel's flag of a task that has begun to exit (include/linux/sched.h): it is set
# before the task's files are closed, so before any client sees its connection drop.
_PF_EXITING = 0x4


def process_ended(pid: int) -> bool:
    """Whether process `pid` has ended or is ending (SIGKILL takes a moment, and a
    client sees its connection drop before the end: the files are closed on the way), as
    /proc says: gone, a zombie (not reaped yet by the fork server, which `kill(pid, 0)`
    would still find) or exiting. What cannot be read otherwise is taken as running."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    # pid (comm) state ppid pgrp session tty_nr tpgid flags ...: comm may hold anything.
    fields = text[text.rfind(b")") + 2 :].split()
    try:
        state, flags = fields[0], int(fields[6])
    except (IndexError, ValueError):
        return False
    return state in (b"Z", b"X") or bool(flags & _PF_EXITING)


def gateway_watch(control: ControlBlock, layout: Layout) -> Callable[[int, int], bool]:
    """Whether `incarnation` of gateway `gateway` is gone, from its slot in the control
    block: the supervisor cleared the slot for a successor, a successor wrote its own
    incarnation, or the process of the slot has ended or is ending (`process_ended`: the
    supervisor may not have seen it yet, and a durable subscriber whose gateway was killed
    may come back through another gateway at once)."""

    def gone(gateway: int, incarnation: int) -> bool:
        slot = control.slot(layout.gateway_slot(gateway))
        if slot.state == STATE_EMPTY or slot.incarnation != incarnation:
            return True
        return process_ended(slot.pid)

    return gone


class PipelineWorker:
    """The process shell of one pipeline: its rings, doorbells and loop."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        layout = spec.layout
        self.base = WorkerBase(spec, layout.pipeline_bell(spec.index))
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
        # pubsub only: the replay worker's ring to us, and ours to it.
        self.replay_reader: RingReader | None = None
        self.replay_outlet: Outlet | None = None
        self.replay_bell: Doorbell | None = None
        if spec.role == "pubsub":
            batches = Ring.attach(layout.from_replay(spec.index))
            requests = Ring.attach(layout.to_replay(spec.index))
            self.rings += [batches, requests]
            self.replay_bell = Doorbell.attach(
                layout.replay_bell(layout.replayer_of(spec.index)), missing_ok=True
            )
            self.replay_reader = batches.reader()
            self.park_readers.append(self.replay_reader)
            self.replay_outlet = Outlet(requests.writer(self.replay_bell))
        self.pipeline = open_pipeline(spec)
        if isinstance(self.pipeline, PubSubPipeline):
            self.pipeline.durables.gateway_gone = gateway_watch(self.base.control, layout)
        self._share_destination_count()

    def _share_destination_count(self) -> None:
        """broker.max_destinations holds over every pipeline: ours is published in our
        slot (each turn, and at once when a check counts a new one), the others' read
        from theirs."""
        layout, base = self.spec.layout, self.base
        slot = base.slot
        others = [
            base.control.slot(layout.pipeline_slot(p))
            for p in range(layout.topology.pipelines)
            if p != self.spec.index
        ]

        def others_count() -> int:
            return sum(other.counter(PIPELINE_DESTINATIONS) for other in others)

        def publish(count: int) -> None:
            slot.set_counter(PIPELINE_DESTINATIONS, count)

        limit = self.pipeline.destination_limit
        limit.others = others_count
        limit.publish = publish

    def step(self) -> bool:
        """Handle one batch from every ring; True if there was anything to do."""
        pipeline = self.pipeline
        pipeline.tick(epoch_ms())
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
                pipeline.receive(gateway, record)
        if self.replay_reader is not None and isinstance(pipeline, PubSubPipeline):
            for kind, payload in self.replay_reader.read_batch(batch_records):
                busy = True
                pipeline.replayed(decode(kind, payload))
        pipeline.step(self.base.memwatch_level, self.base.memwatch_permille)
        self.flush()
        return busy

    def flush(self) -> None:
        """What the pipeline wants sent goes into the rings (what does not fit waits)."""
        for gateway, batch in self.pipeline.take_output().items():
            outlet = self.outlets[gateway]
            for record in batch:
                outlet.add(record)
        for outlet in self.outlets:
            outlet.flush()
        if self.replay_outlet is not None and isinstance(self.pipeline, PubSubPipeline):
            self._send_to_replay(self.replay_outlet, self.pipeline.take_replay_records())

    def _send_to_replay(self, outlet: Outlet, batch: list[Record]) -> None:
        for record in batch:
            outlet.add(record)
        outlet.flush()

    def _outlets_waiting(self) -> bool:
        """A ring was full: records wait for a slow or restarting reader."""
        return any(self.outlets) or bool(self.replay_outlet)

    def run(self, stop: StopOnSignal) -> None:
        """Serve until `stop` is asked for (a signal) or the supervisor is gone."""
        base = self.base
        pipeline = self.pipeline
        park_timeout = self.spec.config.rings.park_timeout_ms / 1000
        pipeline.recover()
        pipeline.hello()
        self.flush()
        base.ready()
        while not stop.requested:
            busy = self.step()
            reloaded = base.turn()
            base.slot.set_counter(PIPELINE_RECEIVED, pipeline.engine.received)
            base.slot.set_counter(PIPELINE_DELIVERED, pipeline.engine.delivered)
            base.slot.set_counter(PIPELINE_DESTINATIONS, pipeline.destination_limit.count)
            now = base.stats_due()
            if now is not None:
                base.publish_stats(pipeline.statistics(self.spec.title, os.getpid(), now))
            if reloaded is not None:
                pipeline.reload(reloaded)
            if busy:
                continue
            due = pipeline.due_in_s()
            if due is not None:
                # A batch waits for its commit delay: sleep no longer than that.
                park(self.park_readers, base.doorbell, max(0.0, due))
                continue
            if pipeline.holding():
                # Holding for re-registration: poll until it completes or times out.
                park(self.park_readers, base.doorbell, 0.01)
                continue
            if self._outlets_waiting():
                # A gateway is slow or restarting: retry soon rather than park.
                time.sleep(0.001)
                continue
            if base.supervisor_gone():
                log.warning("supervisor is gone: stopping")
                return
            park(self.park_readers, base.doorbell, park_timeout)

    def close(self, *, clean: bool = False) -> None:
        """`clean`: it stopped in order (see Pipeline.close)."""
        self.pipeline.close(clean=clean)
        if self.replay_bell is not None:
            self.replay_bell.close()
        for ring in self.rings:
            ring.close()
        for bell in self.gateway_bells:
            bell.close()
        self.base.close()


def run_pipeline(spec: WorkerSpec) -> None:
    stop = StopOnSignal()
    worker = PipelineWorker(spec)
    stop.wake(worker.base.doorbell)
    clean = False
    try:
        worker.run(stop)
        # Asked to stop (not left by the supervisor, not an error): a clean stop.
        clean = stop.requested
    finally:
        worker.close(clean=clean)
