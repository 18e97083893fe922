"""The snapshots a pipeline publishes, built from its engines' and trackers' own state.

Built every `admin.stats_interval_ms` (less often when building them costs much: see
`_pacing`), with every destination and consumer: a snapshot larger than its stats block
goes to the block's spill file (`mpbroker.shm.StatsBlock`), so nothing is cut here.
"""

from __future__ import annotations

from collections.abc import Container

from mpbroker.engine import STOPS, Engine, QueueEngine, TopicEngine
from mpbroker.flow import FlowTracker, StoreLimits
from mpbroker.records import ACK_MODES

from ._snapshots import (
    ConsumerRow,
    DurableRow,
    GlobalStoreFigures,
    QueueRow,
    QueueWorkerStats,
    StoreFigures,
    TempStoreStats,
    TopicRow,
    TopicWorkerStats,
)

__all__ = ["queue_worker_stats", "topic_worker_stats"]

_ACK_NAMES = {value: name for name, value in ACK_MODES.items()}

# (store, its tracker, what it stops now): the stops are taken once per snapshot.
_Tracked = list[tuple[str, FlowTracker, dict[str, str]]]


def _tracked(trackers: list[tuple[str, FlowTracker]]) -> _Tracked:
    return [(store, tracker, tracker.stopped()) for store, tracker in trackers]


# One snapshot's store figures, by their values: most destinations hold the same (nothing
# in one store, a message or two in the other, the same watermarks), and a snapshot is
# built for every destination every admin.stats_interval_ms, so identical figures are one
# object (frozen: nothing changes them). What a snapshot allocates per destination stays
# in the worker's memory as arenas it cannot give back.
_Figures = dict[tuple[tuple[str, int, int, StoreLimits, str], ...], dict[str, StoreFigures]]


def _store_figures(name: str, tracked: _Tracked, shared: _Figures) -> dict[str, StoreFigures]:
    """Per store: what `name` holds there, its watermarks and its stop (`shared`: the
    figures this snapshot made so far)."""
    key = tuple(
        (
            store,
            *tracker.counts(name),
            tracker.destination_limits(name) if tracker.destination_limits else tracker.limits,
            stopped.get(name, ""),
        )
        for store, tracker, stopped in tracked
    )
    stores = shared.get(key)
    if stores is not None:
        return stores
    stores = {}
    for store, messages, nbytes, limits, stop in key:
        stores[store] = StoreFigures(
            messages=messages,
            bytes=nbytes,
            msg_high=limits.messages.high,
            msg_low=limits.messages.low,
            byte_high=limits.bytes.high,
            byte_low=limits.bytes.low,
            stopped=stop,
        )
    shared[key] = stores
    return stores


def _global_figures(tracked: _Tracked) -> dict[str, GlobalStoreFigures]:
    return {
        store: GlobalStoreFigures(
            messages=tracker.totals[0],
            bytes=tracker.totals[1],
            global_msg_high=tracker.limits.global_messages.high,
            global_msg_low=tracker.limits.global_messages.low,
            global_byte_high=tracker.limits.global_bytes.high,
            global_byte_low=tracker.limits.global_bytes.low,
            stopped=stopped.get("", ""),
            stops=tracker.stops.get("", 0),
        )
        for store, tracker, stopped in tracked
    }


def _totals(name: str, engine: Engine, tracked: _Tracked) -> tuple[int, int, int, int, int]:
    """(enqueued, dequeued, expired, dead_lettered, stops) of a destination: the engine's
    counts, with the stops of its stores' watermarks added to its own (a topic's live
    buffer)."""
    enqueued, dequeued, expired, dead_lettered, stops = engine.totals.of(name)
    for _, tracker, _ in tracked:
        stops += tracker.stops.get(name, 0)
    return enqueued, dequeued, expired, dead_lettered, stops


def _forget_gone(engine: Engine, tracked: _Tracked, existing: Container[str]) -> None:
    """Bound the totals kept for destinations that are gone (see DestinationTotals)."""
    engine.totals.prune(existing)
    for _, tracker, _ in tracked:
        tracker.prune_stops(existing)


def _consumers(*engines: Engine) -> list[ConsumerRow]:
    """Every consumer's window: in use, size, and whether it can take more (`ready`)."""
    return [
        ConsumerRow(
            destination=consumer.destination,
            subscription=consumer.sub_id,
            gateway=consumer.key[0],
            connection=consumer.key[1],
            ack=_ACK_NAMES.get(consumer.ack_mode, str(consumer.ack_mode)),
            unacknowledged=len(consumer.unacked),
            prefetch=consumer.prefetch,
            unacknowledged_bytes=consumer.unacked_bytes,
            window_bytes=consumer.window_bytes,
            backlog=len(consumer.pending),
            ready="yes" if consumer.ready else "no",
            selector="" if consumer.selector is None else consumer.selector.text,
        )
        for engine in engines
        for consumer in engine.consumers.values()
    ]


def queue_worker_stats(
    title: str,
    pid: int,
    at_ms: int,
    engine: QueueEngine,
    trackers: list[tuple[str, FlowTracker]],
    temp_store: TempStoreStats | None,
    quota_stops: dict[str, str] | None = None,
    destinations_refused: int = 0,
) -> QueueWorkerStats:
    """Every queue: waiting and unacknowledged messages, and per store its counts,
    watermarks and stop; the stores' global counts and stops; every consumer.
    `quota_stops`: the queues whose quotas hold their producers now, and why."""
    tracked = _tracked(trackers)
    quota_stops = quota_stops or {}
    rows = []
    shared: _Figures = {}
    queues = engine.queues
    for name in sorted(queues):
        queue = queues[name]
        enqueued, dequeued, expired, dead_lettered, stops = _totals(name, engine, tracked)
        rows.append(
            QueueRow(
                name=name,
                waiting=len(queue.pending),
                unacknowledged=queue.held_messages - len(queue.pending),
                consumers=len(queue.consumers),
                stores=_store_figures(name, tracked, shared),
                quota_stopped=quota_stops.get(name, ""),
                enqueued=enqueued,
                dequeued=dequeued,
                expired=expired,
                dead_lettered=dead_lettered,
                stops=stops,
            )
        )
    _forget_gone(engine, tracked, engine.queues)
    return QueueWorkerStats(
        title=title,
        pid=pid,
        at_ms=at_ms,
        received=engine.received,
        delivered=engine.delivered,
        destinations=rows,
        destinations_not_shown=0,
        stores=_global_figures(tracked),
        consumers=_consumers(engine),
        consumers_not_shown=0,
        temp_store=temp_store,
        destinations_refused=destinations_refused,
    )


def topic_worker_stats(
    title: str,
    pid: int,
    at_ms: int,
    engine: TopicEngine,
    durable_queues: QueueEngine,
    trackers: list[tuple[str, FlowTracker]],
    durable: list[DurableRow],
    temp_store: TempStoreStats | None,
    destinations_refused: int = 0,
) -> TopicWorkerStats:
    """Every topic with subscribers or stored messages: subscribers, the slowest one's
    backlog, the live watermark and stop, and what its durable backlog holds in the topic
    store; the topic store's and the live buffer's global figures; every subscriber (the
    durable ones' in `durable_queues`)."""
    stops = engine.live_stops()
    tracked = _tracked(trackers)
    names = set(engine.topics) | {
        name for _, tracker in trackers for name in tracker.tracked_destinations()
    }
    # Durable subscribers' windows, what they acknowledged and what expired waiting for
    # them are in their durable queues (`durable_queues`): added to their topics'.
    # A live durable subscriber is the durable queue's consumer, not the topic engine's:
    # counted as its topic's subscriber here. A topic with durable subscriptions is listed
    # whatever it holds.
    durable_sums: dict[str, tuple[int, int, int, int]] = {}
    for row in durable:
        active, unacked, dequeued, expired = durable_sums.get(row.topic, (0, 0, 0, 0))
        durable_sums[row.topic] = (
            active + (row.state != "inactive"),
            unacked + row.unacknowledged,
            dequeued + row.dequeued,
            expired + row.expired,
        )
    names.update(durable_sums)
    rows = []
    shared: _Figures = {}
    for name in sorted(names):
        subscribers = engine.topics.get(name, [])
        mark = engine.live_mark_for(name)
        enqueued, dequeued, expired, dead_lettered, stop_count = _totals(name, engine, tracked)
        durable_active, durable_unacked, durable_dequeued, durable_expired = durable_sums.get(
            name, (0, 0, 0, 0)
        )
        rows.append(
            TopicRow(
                name=name,
                # Parked durable subscriptions (away) are not subscribers; their backlog
                # counts in the deepest one.
                subscribers=sum(not c.parked for c in subscribers) + durable_active,
                deepest_backlog=max((len(c.pending) for c in subscribers), default=0),
                live_msg_high=mark.high,
                live_msg_low=mark.low,
                stopped=stops.get(name, ""),
                stores=_store_figures(name, tracked, shared),
                unacknowledged=sum(len(c.unacked) for c in subscribers) + durable_unacked,
                enqueued=enqueued,
                dequeued=dequeued + durable_dequeued,
                expired=expired + durable_expired,
                dead_lettered=dead_lettered,
                stops=stop_count,
            )
        )
    _forget_gone(engine, tracked, names)
    stores = _global_figures(tracked)
    # The live buffer (slow subscribers' backlogs) as one more global row.
    stores["topics (live)"] = GlobalStoreFigures(
        messages=engine.live_total,
        bytes=engine.live_bytes,
        global_msg_high=engine.global_live.mark.high,
        global_msg_low=engine.global_live.mark.low,
        global_byte_high=engine.global_live_bytes.mark.high,
        global_byte_low=engine.global_live_bytes.mark.low,
        stopped=stops.get("", ""),
        stops=engine.totals.of("")[STOPS],
    )
    return TopicWorkerStats(
        title=title,
        pid=pid,
        at_ms=at_ms,
        received=engine.received,
        delivered=engine.delivered,
        destinations=rows,
        destinations_not_shown=0,
        stores=stores,
        consumers=_consumers(engine, durable_queues),
        consumers_not_shown=0,
        durable_subscriptions=durable,
        temp_store=temp_store,
        destinations_refused=destinations_refused,
    )
