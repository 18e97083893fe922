"""The admin API's JSON, defined once: what every worker publishes and what the pages show.

Frozen msgspec structs, like trio's statistics objects: each field is described in its
class's docstring. Workers build their snapshot (`GatewayStats`, `QueueWorkerStats`,
`TopicWorkerStats`, `ReplayStats`) and publish it as JSON in their stats block; the
supervisor's admin thread reads them back into the same types and serves them in
`StatusView` (`GET /status`) and `FlowView` (`GET /flow`); `mpbroker admin` decodes those
pages into the same types again for its tables. A field that is not set (None) is left out
of the JSON.

Every worker's snapshot names its `role` ("gateway", "p2p", "pubsub", "replay"), and every
destination row its `kind` ("queue", "topic"), so a reader knows which type it holds.
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar

import msgspec

__all__ = [
    "ConsumerRow",
    "DestinationsStatus",
    "DurableRow",
    "FlowView",
    "GatewayStats",
    "GlobalStoreFigures",
    "HeldSend",
    "MemoryLevel",
    "MemoryStatus",
    "QueueRow",
    "QueueWorkerStats",
    "ReplayStats",
    "StatusView",
    "StoreFigures",
    "TempStoreStats",
    "TopicRow",
    "TopicWorkerStats",
    "WorkerStats",
    "WorkerStatus",
    "consumers_of",
    "decode",
    "encode",
    "stopped_by",
    "waiting_of",
    "with_durable_backlogs",
    "without_details",
]


class _Snapshot(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Base of every snapshot: immutable, keyword-built, unset (None) fields left out."""


# -- rows ----------------------------------------------------------------------------------


class StoreFigures(_Snapshot, frozen=True):
    """What one destination holds in one store, against its watermarks.

    Attributes:
        messages: messages it holds there (waiting or delivered and unacknowledged).
        bytes: their bytes.
        msg_high, msg_low: its message watermarks (-1: off).
        byte_high, byte_low: its byte watermarks (-1: off).
        stopped: the limit that stops its producers now ("" when they may send).
    """

    messages: int
    bytes: int
    msg_high: int
    msg_low: int
    byte_high: int
    byte_low: int
    stopped: str


class GlobalStoreFigures(_Snapshot, frozen=True):
    """What a whole store of one worker holds, against its global watermarks.

    Attributes:
        messages, bytes: held over all its destinations.
        global_msg_high, global_msg_low: the store's message watermarks (-1: off).
        global_byte_high, global_byte_low: its byte watermarks (-1: off).
        stopped: the limit that stops every producer to the store now ("" when none).
        stops: times its global limits stopped every producer, since the worker started.
    """

    messages: int
    bytes: int
    global_msg_high: int
    global_msg_low: int
    global_byte_high: int
    global_byte_low: int
    stopped: str
    stops: int = 0


class QueueRow(_Snapshot, frozen=True, tag_field="kind", tag="queue"):
    """One queue.

    Attributes:
        name: the destination.
        waiting: messages waiting for a consumer.
        unacknowledged: messages delivered and not yet acknowledged.
        consumers: subscriptions to it.
        stores: per store (vol_queue_store, pers_queue_store) what it holds there.
        quota_stopped: why its quota ([[quotas]]) holds its producers now ("" when it
            does not).
        enqueued: messages sent to it since its worker started (dead-letter copies
            included).
        dequeued: messages acknowledged by its consumers (auto mode: written to them).
        expired: messages whose time was up before they were consumed.
        dead_lettered: messages moved to its dead-letter queue.
        stops: times its producers were stopped by flow control.
            (These five count since the worker started, and carry on while the
            destination is idle; left out of the JSON while they are 0.)
        worker: in `FlowView` only: the worker that owns it.
    """

    name: str
    waiting: int
    unacknowledged: int
    consumers: int
    stores: dict[str, StoreFigures]
    quota_stopped: str = ""
    enqueued: int = 0
    dequeued: int = 0
    expired: int = 0
    dead_lettered: int = 0
    stops: int = 0
    worker: str | None = None


class TopicRow(_Snapshot, frozen=True, tag_field="kind", tag="topic"):
    """One topic with subscribers or stored messages.

    Attributes:
        name: the destination.
        subscribers: subscriptions to it now with a subscriber (a durable one that is away
            is not counted; the non-persistent messages kept for it count in
            `deepest_backlog`).
        deepest_backlog: messages waiting for its slowest subscriber in its live buffer
            (what its live watermarks judge; a durable subscription's stored messages are
            not in it: see `durable_backlog`).
        live_msg_high, live_msg_low: the live buffer's watermarks for it (-1: off).
        stopped: the live-buffer limit that stops its publishers now ("" when none).
        stores: what its durable subscriptions' backlog holds in the topic store (each
            message once, however many subscriptions owe an ack for it).
        durable_backlog: the most messages one of its durable subscriptions owes an ack
            for: the stored ones (the replay worker's count, at most about 5 s old;
            delivered and unacknowledged ones included) and the non-persistent ones kept
            for it while its subscriber is away. Not published by the pubsub worker, which
            does not count its store: the admin API adds it from the replay workers'
            counts (`with_durable_backlogs`); 0 without durable subscriptions.
        unacknowledged: deliveries in its subscribers' windows, not yet acknowledged.
        enqueued: messages published to it since its worker started (dead-letter copies
            included).
        dequeued: deliveries acknowledged by its subscribers (auto mode: written to them).
        expired: backlog entries whose time was up (a message once per subscriber it
            waited for).
        dead_lettered: always 0 (a topic has no dead-letter queue).
        stops: times its producers were stopped by flow control.
            (These five count since the worker started, and carry on while the
            destination is idle; left out of the JSON while they are 0.)
        worker: in `FlowView` only: the worker that owns it.
    """

    name: str
    subscribers: int
    deepest_backlog: int
    live_msg_high: int
    live_msg_low: int
    stopped: str
    stores: dict[str, StoreFigures]
    durable_backlog: int = 0
    unacknowledged: int = 0
    enqueued: int = 0
    dequeued: int = 0
    expired: int = 0
    dead_lettered: int = 0
    stops: int = 0
    worker: str | None = None


class ConsumerRow(_Snapshot, frozen=True):
    """One subscription's window.

    Attributes:
        destination: what it subscribed to.
        subscription: its STOMP subscription id.
        gateway, connection: where its client is connected.
        ack: its ack mode (auto, client, client-individual).
        unacknowledged: deliveries in its window.
        prefetch: the window in messages.
        unacknowledged_bytes: bytes in its window.
        window_bytes: the window in bytes (-1: messages only).
        backlog: topic messages waiting for room in its window.
        ready: "yes" when it can take another message now, else "no".
        worker: in `FlowView` only: the worker that holds it.
        selector: its JMS message selector ("" when it takes every message).
    """

    destination: str
    subscription: str
    gateway: int
    connection: int
    ack: str
    unacknowledged: int
    prefetch: int
    unacknowledged_bytes: int
    window_bytes: int
    backlog: int
    ready: str
    worker: str | None = None
    selector: str = ""


class DurableRow(_Snapshot, frozen=True):
    """One durable topic subscription.

    Attributes:
        name: "<client-id>/<subscription name>".
        topic: what it subscribes to.
        state: "live" (its subscriber is connected and caught up), "replaying" (its
            subscriber is connected and receives its stored backlog) or "inactive".
        kept: non-persistent messages kept for it in memory (or the temp store) while
            its subscriber is away or replaying; its stored (persistent) backlog is in
            the replay worker's `backlogs`.
        unacknowledged: messages delivered to its subscriber and not yet acknowledged.
        dequeued, expired: messages its subscribers acknowledged, and messages that
            expired waiting for it, since the worker started (they count in its topic's
            `dequeued` and `expired` too).
        worker: in `FlowView` only: the worker that holds it.
    """

    name: str
    topic: str
    state: str
    kept: int = 0
    unacknowledged: int = 0
    dequeued: int = 0
    expired: int = 0
    worker: str | None = None


class HeldSend(_Snapshot, frozen=True):
    """A SEND that flow control holds now.

    Attributes:
        peer: the producer's address.
        destination: where it sends to.
        limit: the limit that holds it (e.g. "msg_high 5000").
        store: the store of that limit (a config section).
        waiting_ms: how long it has waited.
        gateway: in `FlowView` only: the gateway that holds it.
    """

    peer: str
    destination: str
    limit: str
    store: str
    waiting_ms: int
    gateway: str | None = None


class TempStoreStats(_Snapshot, frozen=True):
    """A pipeline's temp store (non-persistent messages paged out of memory).

    Attributes:
        paging: whether messages left waiting are paged out now.
        starts: how often paging started.
        usage_bytes, limit_bytes: disk in use, and the most it may use.
        segments: its files.
        messages, bytes: paged messages waiting, and their sizes.
        paged_out, paged_in: pages written and read back so far.
        full: whether it is full (producers of non-persistent messages are stopped).
    """

    paging: bool
    starts: int
    usage_bytes: int
    limit_bytes: int
    segments: int
    messages: int
    bytes: int
    paged_out: int
    paged_in: int
    full: bool


# -- what each worker publishes ------------------------------------------------------------


class GatewayStats(_Snapshot, frozen=True, tag_field="role", tag="gateway"):
    """What a gateway publishes.

    Attributes:
        title: the worker ("gateway 0").
        pid: its process.
        at_ms: when (epoch ms).
        connections: client connections open on it.
        stopped_producers: the SENDs flow control holds now.
        stops_known: stops its pipelines announced that are in force.
        publish_ms: how long its previous snapshot took to build and publish.
        error: set when the snapshot could not be published whole (its lists are empty).
        transactions_open, transactions_bytes: open transactions over its connections,
            and the message bytes they hold.
        transactions_discarded: rolled back by `transactions.reduce_strategy` to make room
            for another connection's SEND, since it started.
        transactions_timed_out: rolled back by `transactions.timeout_ms`, since it started.
            (These four are left out of the JSON while they are 0.)
        connections_accepted: connections it served since it started (past the limits
            and the TLS handshake).
        connections_refused: connections it refused since it started, by kind:
            max_connections, max_connections_connecting, max_connections_per_address,
            displaced (closed before its CONNECT to make room for a new connection),
            shutting_down, tls_handshake, websocket_handshake (refused, failed or not
            completed in time), authentication (a CONNECT whose login failed).
        frames_in, frames_out: STOMP frames read from clients, and made for them, since
            it started (heart-beats are not frames; a frame made for a connection that
            ended before it was written counts all the same).
    """

    title: str
    pid: int
    at_ms: int
    connections: int
    stopped_producers: list[HeldSend]
    stops_known: int
    publish_ms: float | None = None
    error: str | None = None
    transactions_open: int = 0
    transactions_bytes: int = 0
    transactions_discarded: int = 0
    transactions_timed_out: int = 0
    connections_accepted: int = 0
    connections_refused: dict[str, int] = msgspec.field(default_factory=dict)
    frames_in: int = 0
    frames_out: int = 0


class _PipelineStats(_Snapshot, frozen=True):
    """What both kinds of pipeline publish (see QueueWorkerStats, TopicWorkerStats)."""

    title: str
    pid: int
    at_ms: int
    received: int
    delivered: int
    stores: dict[str, GlobalStoreFigures]
    consumers: list[ConsumerRow]
    destinations_not_shown: int
    consumers_not_shown: int
    temp_store: TempStoreStats | None = None
    publish_ms: float | None = None
    error: str | None = None
    destinations_refused: int = 0


class QueueWorkerStats(_PipelineStats, frozen=True, kw_only=True, tag_field="role", tag="p2p"):
    """What a p2p pipeline publishes.

    Attributes:
        title, pid, at_ms: the worker, its process, when.
        received, delivered: messages taken in and handed to consumers so far.
        destinations: its queues, every one.
        destinations_not_shown: queues left out of `destinations` (0 unless `error`).
        stores: the global figures of its stores (vol_queue_store, pers_queue_store).
        consumers: its consumers' windows, every one.
        consumers_not_shown: consumers left out of `consumers` (0 unless `error`).
        temp_store: its temp store, when paging is configured.
        publish_ms: how long its previous snapshot took to build and publish.
        error: set when the snapshot could not be published whole (its lists are empty).
        destinations_refused: SENDs and SUBSCRIBEs refused since it started because they
            would have made a queue past broker.max_destinations (or while MemWatch was past
            memory.refuse_destinations_percent); left out while 0.
    """

    destinations: list[QueueRow]


class TopicWorkerStats(_PipelineStats, frozen=True, kw_only=True, tag_field="role", tag="pubsub"):
    """What a pubsub pipeline publishes.

    Attributes:
        title, pid, at_ms: the worker, its process, when.
        received, delivered: messages published to it and deliveries made so far.
        destinations: its topics, every one.
        destinations_not_shown: topics left out of `destinations` (0 unless `error`).
        stores: the global figures of the topic store and of the live buffer
            ("topics (live)").
        consumers: its subscribers' windows, every one.
        consumers_not_shown: subscribers left out of `consumers` (0 unless `error`).
        durable_subscriptions: its durable subscriptions.
        temp_store: its temp store, when paging is configured.
        publish_ms: how long its previous snapshot took to build and publish.
        error: set when the snapshot could not be published whole (its lists are empty).
        destinations_refused: SUBSCRIBEs refused since it started because they would have
            made a topic or durable subscription past broker.max_destinations (or while
            MemWatch was past memory.refuse_destinations_percent); left out while 0.
    """

    destinations: list[TopicRow]
    durable_subscriptions: list[DurableRow]


class ReplayStats(_Snapshot, frozen=True, tag_field="role", tag="replay"):
    """What a replay worker publishes.

    Attributes:
        title, pid, at_ms: the worker, its process, when.
        replaying: durable subscriptions holding one of its places now.
        waiting_for_a_place: those waiting for one (`replay.max_concurrent`).
        in_flight_bytes: replayed bytes not yet taken by their owners.
        batches, messages: replayed so far.
        backlogs: per durable subscription of the partitions it serves, the stored
            messages it still owes an ack for (counted every 5 s, less often when counting
            takes more than 5 % of that; a subscription that owes none is left out).
        backlogs_at_ms: when `backlogs` was read (None before the first reading).
        publish_ms: how long its previous snapshot took to build and publish.
        error: set when the snapshot could not be published whole (its lists are empty).
    """

    title: str
    pid: int
    at_ms: int
    replaying: list[str]
    waiting_for_a_place: list[str]
    in_flight_bytes: int
    batches: int
    messages: int
    backlogs: dict[str, int] = msgspec.field(default_factory=dict)
    backlogs_at_ms: int | None = None
    publish_ms: float | None = None
    error: str | None = None


WorkerStats = GatewayStats | QueueWorkerStats | TopicWorkerStats | ReplayStats

# -- the pages -----------------------------------------------------------------------------


class WorkerStatus(_Snapshot, frozen=True):
    """One worker as the supervisor sees it.

    Attributes:
        title: e.g. "p2p 0".
        role: gateway, p2p, pubsub or replay.
        index: its index among the workers of its role (pipelines: p2p first, then pubsub).
        state: down, starting, ready or stopping.
        pid: its process (0 before it started).
        incarnation: how often it was restarted.
        heartbeat_age_ms: how long since its loop last turned (None before its first turn).
        stats: what it published last (None before its first snapshot).
        stats_error: why its snapshot could not be read, if it could not.
        memory_bytes: its memory at MemWatch's last reading (`memory.memwatch_interval_ms`):
            its proportional set size without the shared-memory segments, which count once
            in `MemoryStatus.used_bytes`. None (left out) before MemWatch read this process
            (it just started, or MemWatch is off).
    """

    title: str
    role: str
    index: int
    state: str
    pid: int
    incarnation: int
    heartbeat_age_ms: int | None
    stats: WorkerStats | None
    stats_error: str | None = None
    memory_bytes: int | None = None


class MemoryLevel(_Snapshot, frozen=True):
    """One MemWatch level.

    Attributes:
        level: its number (1, 2, ...).
        percent: the share of `memory.max_memory` where it starts.
        gc_interval_ms: how often workers collect garbage at it (0: never).
    """

    level: int
    percent: float
    gc_interval_ms: int


class MemoryStatus(_Snapshot, frozen=True):
    """MemWatch's last reading.

    Attributes:
        level: the level now (0: below the first).
        used_bytes: the broker's memory (PSS of its processes, plus its segments).
        max_memory: `memory.max_memory`.
        percent: used_bytes of max_memory.
        levels: the configured levels.
    """

    level: int
    used_bytes: int
    max_memory: int
    percent: float
    levels: list[MemoryLevel]


class DestinationsStatus(_Snapshot, frozen=True):
    """The destinations of every pipeline against `broker.max_destinations`.

    Attributes:
        count: queues, topics with subscribers and durable subscriptions held now, over
            every pipeline (each pipeline's count in its control-block slot).
        max_destinations: the limit: the setting, or derived from the memory budget.
        per_destination_bytes: what the memory budget counts for each (measured).
        budget_bytes: max_destinations x per_destination_bytes: their line in the budget.
        refused: SENDs and SUBSCRIBEs refused for the limit (or MemWatch), as the
            pipelines last published.
    """

    count: int
    max_destinations: int
    per_destination_bytes: int
    budget_bytes: int
    refused: int = 0


class StatusView(_Snapshot, frozen=True):
    """`GET /status`: every worker and what it published, and the broker's memory.

    `GET /status?offset=N&limit=M` cuts each pipeline's `destinations` and `consumers` to
    their items N to N+M-1 (as `FlowView` pages them) and adds the rows cut out to their
    `*_not_shown` counts: `limit=0` gives the workers' figures without those lists.

    Attributes:
        at_ms: when the page was made (epoch ms).
        workers: every worker, gateways first.
        memory: MemWatch's last reading (None where the page is made without it).
        destinations: the destinations against broker.max_destinations (None where the
            page is made without them).
    """

    at_ms: int
    workers: list[WorkerStatus]
    memory: MemoryStatus | None = None
    destinations: DestinationsStatus | None = None


class FlowView(_Snapshot, frozen=True):
    """`GET /flow`: flow control now, gathered over the workers ("Flow Control Live").

    `GET /flow?offset=N&limit=M` pages the three long lists (destinations, consumers,
    durable subscriptions) alike: each shows its items N to N+M-1. Before that,
    `filter=TEXT` keeps the destinations whose name holds TEXT (any case) and
    `sort=KEY[&order=asc|desc]` sorts them (`server.Selection`). The `*_not_shown` counts
    say how many of each the page leaves out (filtered out too), or a worker could not
    publish: 0 when every one is shown.

    Attributes:
        at_ms: when the page was made.
        destinations: every destination's counts, watermarks and stops (with `worker`):
            each pipeline's in name order, p2p workers first (unless sorted).
        destinations_not_shown: destinations not in `destinations`.
        destinations_matching: with `filter`, how many destinations match it, shown or
            not (left out without a filter).
        global_stores: per worker, its stores' global figures (JSON: `global`).
        stopped_producers: the SENDs held now, and for how long (with `gateway`).
        consumers: every consumer's window and whether it is ready (with `worker`).
        consumers_not_shown: consumers not in `consumers`.
        durable_subscriptions: every durable subscription (with `worker`).
        durable_subscriptions_not_shown: durable subscriptions not in
            `durable_subscriptions`.
    """

    at_ms: int
    destinations: list[QueueRow | TopicRow]
    destinations_not_shown: int
    global_stores: dict[str, dict[str, GlobalStoreFigures]] = msgspec.field(name="global")
    stopped_producers: list[HeldSend]
    consumers: list[ConsumerRow]
    consumers_not_shown: int
    durable_subscriptions: list[DurableRow]
    durable_subscriptions_not_shown: int
    destinations_matching: int | None = None


# -- what a destination row says, whatever its kind -------------------------------------------


def stopped_by(row: QueueRow | TopicRow) -> str:
    """What stops a destination's producers now ("" when they may send): a topic's live
    buffer first, then its stores in order, then a queue's quota."""
    if isinstance(row, TopicRow) and row.stopped:
        return row.stopped
    stopped = next((figures.stopped for figures in row.stores.values() if figures.stopped), "")
    return stopped or (row.quota_stopped if isinstance(row, QueueRow) else "")


def waiting_of(row: QueueRow | TopicRow) -> int:
    """Messages waiting: a queue's for a consumer; a topic's for its slowest subscriber,
    durable ones included (the larger of `deepest_backlog` and `durable_backlog`: never
    their sum, which would count twice what a durable subscription keeps in memory, and
    never a sum over subscriptions, which would count a message once per subscription)."""
    if isinstance(row, QueueRow):
        return row.waiting
    return max(row.deepest_backlog, row.durable_backlog)


def consumers_of(row: QueueRow | TopicRow) -> int:
    """A queue's consumers, a topic's subscribers."""
    return row.consumers if isinstance(row, QueueRow) else row.subscribers


def with_durable_backlogs(status: StatusView) -> StatusView:
    """`status` with each topic's `durable_backlog` filled in: of its durable
    subscriptions, the most messages one owes an ack for, stored (the replay workers'
    `backlogs`) and kept (its `DurableRow.kept`). No one worker has both figures, so the
    admin API joins them: a pubsub worker never counts its store (a `COUNT` over every
    pending row, which the replay worker makes every 5 s off the owners' loops). Only the
    rows of topics with durable subscriptions are copied."""
    stored: dict[str, int] = {}
    for worker in status.workers:
        if isinstance(worker.stats, ReplayStats):
            stored.update(worker.stats.backlogs)
    workers = []
    for worker in status.workers:
        stats = worker.stats
        if isinstance(stats, TopicWorkerStats) and stats.durable_subscriptions:
            deepest: dict[str, int] = {}
            for durable in stats.durable_subscriptions:
                owed = stored.get(durable.name, 0) + durable.kept
                deepest[durable.topic] = max(deepest.get(durable.topic, 0), owed)
            rows = [
                msgspec.structs.replace(row, durable_backlog=deepest[row.name])
                if row.name in deepest
                else row
                for row in stats.destinations
            ]
            worker = msgspec.structs.replace(
                worker, stats=msgspec.structs.replace(stats, destinations=rows)
            )
        workers.append(worker)
    return msgspec.structs.replace(status, workers=workers)


# -- encoding ------------------------------------------------------------------------------

_encoder = msgspec.json.Encoder()
_T = TypeVar("_T")


def encode(snapshot: _Snapshot) -> bytes:
    """The JSON of a snapshot or page."""
    return _encoder.encode(snapshot)


# msgspec learns a type (its annotations, evaluated in Python) the first time it decodes
# it, and two threads doing that at once for one type crashed the supervisor (SIGSEGV in
# msgspec's _core: the admin API answers the dashboard's parallel requests in threads). So
# each kind's decoder is made once, under a lock, and the admin API's kinds at import.
_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}
_decoders_lock = threading.Lock()


def _decoder(kind: Any) -> msgspec.json.Decoder[Any]:
    decoder = _decoders.get(kind)
    if decoder is None:
        with _decoders_lock:
            decoder = _decoders.get(kind)
            if decoder is None:
                decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    return decoder


def decode(data: bytes | str, kind: type[_T]) -> _T:
    """A snapshot or page back from its JSON (msgspec.ValidationError if it is not one).
    Safe from several threads at once."""
    result: _T = _decoder(kind).decode(data)
    return result


def without_details(snapshot: WorkerStats, error: str) -> WorkerStats:
    """`snapshot` with its lists and tables emptied, its optional parts left out and
    `error` saying why (when the whole of it cannot be published). Each `<list>_not_shown`
    count grows by the rows emptied out of `<list>`, so a reader still knows how many
    there are."""
    changes: dict[str, Any] = {"error": error}
    fields = snapshot.__struct_fields__
    for name in fields:
        value = getattr(snapshot, name)
        if isinstance(value, list):
            changes[name] = []
            count = f"{name}_not_shown"
            if count in fields:
                changes[count] = getattr(snapshot, count) + len(value)
        elif isinstance(value, dict):
            changes[name] = {}
        elif isinstance(value, msgspec.Struct):
            changes[name] = None
    return msgspec.structs.replace(snapshot, **changes)


for _kind in (WorkerStats, StatusView, FlowView):
    _decoder(_kind)
