"""`GET /metrics`: the status page in the Prometheus text format.

Built on each scrape from the same `StatusView` as `GET /status` (what every worker
published at most `admin.stats_interval_ms` ago), with the reference client's metric
families and exposition code (`prometheus_client`). Names follow Prometheus' conventions:
the `mpbroker_` prefix, base units (bytes, seconds), `_total` counters. Counters count
since the worker that keeps them started (a restarted worker starts from 0 again, which
Prometheus' `rate()` and `increase()` take as a reset).

Per-destination series are capped (`admin.metrics_max_destinations`) so that a broker
with 10,000 destinations does not make every scrape slow and every TSDB large: the first
destinations seen keep their own series for as long as they exist (`SeriesCap`), and the
rest are added up under `destination="other"`. Durable subscriptions are capped alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from ._snapshots import (
    DurableRow,
    GatewayStats,
    QueueRow,
    QueueWorkerStats,
    ReplayStats,
    StatusView,
    TopicRow,
    TopicWorkerStats,
    consumers_of,
    stopped_by,
    waiting_of,
)

__all__ = ["CONTENT_TYPE", "OTHER", "SeriesCap", "exposition"]

#: The text format every Prometheus reads (the exposition code writes it for our names).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: The `destination` (and `subscription`) label of everything past the cap. Destination
#: names start with "/", so no real one is called this.
OTHER = "other"


class SeriesCap:
    """Which names keep series of their own: at most `limit`, first come first kept.

    A name keeps its series for as long as it is seen (so its counters stay continuous);
    a name gone frees its place for the next new one, taken in name order.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._kept: dict[str, None] = {}

    def admit(self, names: Iterable[str]) -> set[str]:
        """Of `names` (every name there is now), those with series of their own."""
        present = set(names)
        kept = {name: None for name in self._kept if name in present}
        room = self.limit - len(kept)
        if room > 0:
            for name in sorted(present.difference(kept)):
                if room == 0:
                    break
                kept[name] = None
                room -= 1
        self._kept = kept
        return set(kept)


@dataclass
class _Destination:
    """One destination's figures (or the sum of those past the cap)."""

    kind: str
    waiting: int = 0
    bytes: int = 0
    in_flight: int = 0
    consumers: int = 0
    enqueued: int = 0
    dequeued: int = 0
    expired: int = 0
    dead_lettered: int = 0
    stopped: int = 0
    stops: int = 0
    held: int = 0

    def add(self, row: QueueRow | TopicRow, held: int) -> None:
        self.waiting += waiting_of(row)
        self.consumers += consumers_of(row)
        self.in_flight += row.unacknowledged
        self.bytes += sum(store.bytes for store in row.stores.values())
        self.enqueued += row.enqueued
        self.dequeued += row.dequeued
        self.expired += row.expired
        self.dead_lettered += row.dead_lettered
        self.stops += row.stops
        self.stopped += stopped_by(row) != ""
        self.held += held


@dataclass
class _Durable:
    topic: str
    backlog: int = 0
    in_flight: int = 0
    active: int = 0


@dataclass
class _Families:
    """The metric families of one scrape, by name, filled as the workers are read."""

    families: dict[str, Metric] = field(default_factory=dict)

    def gauge(self, name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = GaugeMetricFamily(name, doc, labels=labels)
        assert isinstance(family, GaugeMetricFamily)
        return family

    def counter(self, name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = CounterMetricFamily(name, doc, labels=labels)
        assert isinstance(family, CounterMetricFamily)
        return family

    def collect(self) -> Iterator[Metric]:
        # The registry protocol generate_latest() asks for.
        return iter(self.families.values())


def exposition(
    status: StatusView, destinations: SeriesCap, subscriptions: SeriesCap, version: str
) -> bytes:
    """The Prometheus text of `status`."""
    out = _Families()
    info = InfoMetricFamily("mpbroker_build", "the broker's version", labels=[])
    info.add_metric([], {"version": version})
    out.families["mpbroker_build"] = info
    _memory(out, status)
    _destination_count(out, status)
    held: dict[str, int] = {}
    rows: list[QueueRow | TopicRow] = []
    durable: list[DurableRow] = []
    backlogs: dict[str, int] = {}
    for worker in status.workers:
        labels = [worker.title, worker.role]
        names = ["worker", "role"]
        out.gauge(
            "mpbroker_worker_ready", "1 while the worker is ready, 0 otherwise", names
        ).add_metric(labels, worker.state == "ready")
        out.counter(
            "mpbroker_worker_restarts", "times the supervisor restarted the worker", names
        ).add_metric(labels, worker.incarnation)
        if worker.heartbeat_age_ms is not None:
            out.gauge(
                "mpbroker_worker_heartbeat_age_seconds",
                "time since the worker's loop last turned",
                names,
            ).add_metric(labels, worker.heartbeat_age_ms / 1000)
        if worker.memory_bytes is not None:
            out.gauge(
                "mpbroker_worker_memory_bytes",
                "the worker's memory (PSS) at MemWatch's last reading",
                names,
            ).add_metric(labels, worker.memory_bytes)
        stats = worker.stats
        if stats is not None:
            out.gauge(
                "mpbroker_worker_stats_age_seconds",
                "age of what the worker last published (the figures below)",
                names,
            ).add_metric(labels, max(0, status.at_ms - stats.at_ms) / 1000)
        if isinstance(stats, GatewayStats):
            _gateway(out, worker.title, stats)
            for send in stats.stopped_producers:
                held[send.destination] = held.get(send.destination, 0) + 1
        elif isinstance(stats, QueueWorkerStats | TopicWorkerStats):
            _pipeline(out, worker.title, stats)
            rows += stats.destinations
            if isinstance(stats, TopicWorkerStats):
                durable += stats.durable_subscriptions
        elif isinstance(stats, ReplayStats):
            _replay(out, worker.title, stats)
            backlogs.update(stats.backlogs)
    _destinations(out, rows, held, destinations)
    _durables(out, durable, backlogs, subscriptions)
    return generate_latest(out)


def _memory(out: _Families, status: StatusView) -> None:
    memory = status.memory
    if memory is None:
        return
    out.gauge(
        "mpbroker_memory_used_bytes",
        "the broker's memory as MemWatch measures it (PSS of its processes and segments)",
        [],
    ).add_metric([], memory.used_bytes)
    out.gauge("mpbroker_memory_max_bytes", "memory.max_memory", []).add_metric(
        [], memory.max_memory
    )
    out.gauge(
        "mpbroker_memwatch_level", "MemWatch's level now (0: below the first)", []
    ).add_metric([], memory.level)
    thresholds = out.gauge(
        "mpbroker_memwatch_level_threshold_ratio",
        "where each MemWatch level starts, as a share of memory.max_memory",
        ["level"],
    )
    for level in memory.levels:
        thresholds.add_metric([str(level.level)], level.percent / 100)


def _destination_count(out: _Families, status: StatusView) -> None:
    destinations = status.destinations
    if destinations is None:
        return
    out.gauge(
        "mpbroker_destinations",
        "queues, topics with subscribers and durable subscriptions held now, over every pipeline",
        [],
    ).add_metric([], destinations.count)
    out.gauge("mpbroker_destinations_max", "broker.max_destinations", []).add_metric(
        [], destinations.max_destinations
    )
    out.counter(
        "mpbroker_destinations_refused",
        "SENDs and SUBSCRIBEs refused because they would have made a destination past "
        "broker.max_destinations (or past memory.refuse_destinations_percent)",
        [],
    ).add_metric([], destinations.refused)


def _gateway(out: _Families, title: str, stats: GatewayStats) -> None:
    labels = [title]
    names = ["worker"]
    out.gauge("mpbroker_connections", "client connections open", names).add_metric(
        labels, stats.connections
    )
    out.counter("mpbroker_connections_accepted", "client connections served", names).add_metric(
        labels, stats.connections_accepted
    )
    refused = out.counter(
        "mpbroker_connections_refused",
        "client connections refused, by reason",
        ["worker", "reason"],
    )
    for reason, count in sorted(stats.connections_refused.items()):
        refused.add_metric([title, reason], count)
    out.counter("mpbroker_frames_received", "STOMP frames read from clients", names).add_metric(
        labels, stats.frames_in
    )
    out.counter("mpbroker_frames_sent", "STOMP frames written to clients", names).add_metric(
        labels, stats.frames_out
    )
    out.gauge("mpbroker_producers_held", "SENDs flow control holds now", names).add_metric(
        labels, len(stats.stopped_producers)
    )
    out.gauge("mpbroker_transactions_open", "open transactions", names).add_metric(
        labels, stats.transactions_open
    )
    out.gauge(
        "mpbroker_transactions_bytes", "message bytes open transactions hold", names
    ).add_metric(labels, stats.transactions_bytes)


def _pipeline(out: _Families, title: str, stats: QueueWorkerStats | TopicWorkerStats) -> None:
    kind = "queue" if isinstance(stats, QueueWorkerStats) else "topic"
    labels = [title, kind]
    names = ["worker", "kind"]
    out.counter(
        "mpbroker_messages_received", "messages taken in by the pipeline", names
    ).add_metric(labels, stats.received)
    out.counter(
        "mpbroker_messages_delivered", "deliveries to consumers (a topic: per subscriber)", names
    ).add_metric(labels, stats.delivered)
    store_names = ["worker", "store"]
    for store, figures in sorted(stats.stores.items()):
        store_labels = [title, store]
        out.gauge("mpbroker_store_messages", "messages a store holds", store_names).add_metric(
            store_labels, figures.messages
        )
        out.gauge("mpbroker_store_bytes", "bytes a store holds", store_names).add_metric(
            store_labels, figures.bytes
        )
        out.gauge(
            "mpbroker_store_flow_stopped",
            "1 while the store's global watermarks stop every producer to it",
            store_names,
        ).add_metric(store_labels, bool(figures.stopped))
        out.counter(
            "mpbroker_store_flow_stops",
            "times the store's global watermarks stopped every producer",
            store_names,
        ).add_metric(store_labels, figures.stops)
    temp = stats.temp_store
    if temp is not None:
        names = ["worker"]
        out.gauge(
            "mpbroker_paging", "1 while messages left waiting are paged out", names
        ).add_metric([title], temp.paging)
        out.gauge("mpbroker_temp_store_bytes", "disk the temp store uses", names).add_metric(
            [title], temp.usage_bytes
        )
        out.gauge(
            "mpbroker_temp_store_limit_bytes", "the most disk the temp store may use", names
        ).add_metric([title], temp.limit_bytes)
        out.gauge("mpbroker_temp_store_messages", "paged messages waiting", names).add_metric(
            [title], temp.messages
        )
        out.counter(
            "mpbroker_temp_store_pages_written", "pages written to the temp store", names
        ).add_metric([title], temp.paged_out)
        out.counter(
            "mpbroker_temp_store_pages_read", "pages read back from the temp store", names
        ).add_metric([title], temp.paged_in)


def _replay(out: _Families, title: str, stats: ReplayStats) -> None:
    names = ["worker"]
    out.counter("mpbroker_replay_batches", "batches of stored backlog replayed", names).add_metric(
        [title], stats.batches
    )
    out.counter("mpbroker_replay_messages", "stored messages replayed", names).add_metric(
        [title], stats.messages
    )
    out.gauge(
        "mpbroker_replay_in_flight_bytes", "replayed bytes not yet taken by their owners", names
    ).add_metric([title], stats.in_flight_bytes)


_DESTINATION_GAUGES = (
    (
        "waiting",
        "mpbroker_destination_messages",
        "messages waiting (a topic: for its slowest subscriber, or what its deepest durable"
        " subscription owes an ack for, whichever is more)",
    ),
    ("bytes", "mpbroker_destination_bytes", "bytes the destination holds in its stores"),
    ("in_flight", "mpbroker_destination_messages_in_flight", "delivered and not yet acknowledged"),
    ("consumers", "mpbroker_destination_consumers", "consumers (a topic: subscribers)"),
    ("held", "mpbroker_destination_producers_held", "SENDs to it flow control holds now"),
    ("stopped", "mpbroker_destination_flow_stopped", "1 while flow control stops its producers"),
)
_DESTINATION_COUNTERS = (
    (
        "enqueued",
        "mpbroker_destination_messages_enqueued",
        "messages sent to it (a topic: published)",
    ),
    ("dequeued", "mpbroker_destination_messages_dequeued", "messages its consumers acknowledged"),
    ("expired", "mpbroker_destination_messages_expired", "messages whose time was up"),
    (
        "dead_lettered",
        "mpbroker_destination_messages_dead_lettered",
        "messages moved to its dead-letter queue",
    ),
    ("stops", "mpbroker_destination_flow_stops", "times flow control stopped its producers"),
)


def _destinations(
    out: _Families, rows: list[QueueRow | TopicRow], held: dict[str, int], cap: SeriesCap
) -> None:
    own = cap.admit(row.name for row in rows)
    figures: dict[tuple[str, str], _Destination] = {}
    for row in rows:
        kind = "queue" if isinstance(row, QueueRow) else "topic"
        key = (row.name if row.name in own else OTHER, kind)
        entry = figures.get(key)
        if entry is None:
            entry = figures[key] = _Destination(kind)
        entry.add(row, held.get(row.name, 0))
    names = ["destination", "kind"]
    for attribute, name, doc in _DESTINATION_GAUGES:
        family = out.gauge(name, doc, names)
        for (destination, kind), entry in figures.items():
            family.add_metric([destination, kind], getattr(entry, attribute))
    for attribute, name, doc in _DESTINATION_COUNTERS:
        counter = out.counter(name, doc, names)
        for (destination, kind), entry in figures.items():
            counter.add_metric([destination, kind], getattr(entry, attribute))


def _durables(
    out: _Families, rows: list[DurableRow], stored: dict[str, int], cap: SeriesCap
) -> None:
    own = cap.admit(row.name for row in rows)
    figures: dict[str, _Durable] = {}
    for row in rows:
        name = row.name if row.name in own else OTHER
        entry = figures.get(name)
        if entry is None:
            entry = figures[name] = _Durable(row.topic if name != OTHER else "")
        entry.backlog += stored.get(row.name, 0) + row.kept
        entry.in_flight += row.unacknowledged
        entry.active += row.state != "inactive"
    names = ["subscription", "topic"]
    backlog = out.gauge(
        "mpbroker_durable_subscription_messages",
        "messages a durable subscription owes an ack for (stored, and kept in memory)",
        names,
    )
    in_flight = out.gauge(
        "mpbroker_durable_subscription_messages_in_flight",
        "delivered to its subscriber and not yet acknowledged",
        names,
    )
    active = out.gauge(
        "mpbroker_durable_subscription_active",
        "subscriptions with a subscriber connected (live or replaying)",
        names,
    )
    for name, entry in figures.items():
        labels = [name, entry.topic]
        backlog.add_metric(labels, entry.backlog)
        in_flight.add_metric(labels, entry.in_flight)
        active.add_metric(labels, entry.active)
