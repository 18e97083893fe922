"""Plain-text views of the admin API's pages (`mpbroker admin status|flow`). Pure."""

from __future__ import annotations

from typing import Any

from ._snapshots import (
    FlowView,
    GatewayStats,
    QueueWorkerStats,
    ReplayStats,
    StatusView,
    TopicRow,
    TopicWorkerStats,
    WorkerStats,
)

__all__ = ["render_flow", "render_status", "table"]


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """Columns padded to their widest cell; '-' for a missing value."""
    cells = [[("-" if v is None or v == "" else str(v)) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _mark(high: int, low: int) -> str:
    return "off" if high < 0 else f"{high}/{low}"


def _figures(stats: WorkerStats | None) -> str:
    """A worker's headline figures."""
    if isinstance(stats, QueueWorkerStats | TopicWorkerStats):
        return f"received {stats.received}, delivered {stats.delivered}"
    if isinstance(stats, GatewayStats):
        figures = f"connections {stats.connections}"
        if stats.transactions_open or stats.transactions_discarded or stats.transactions_timed_out:
            figures += (
                f", transactions open {stats.transactions_open}"
                f" ({stats.transactions_bytes} B), discarded {stats.transactions_discarded},"
                f" timed out {stats.transactions_timed_out}"
            )
        return figures
    if isinstance(stats, ReplayStats):
        return f"replaying {len(stats.replaying)}, messages {stats.messages}"
    return ""


def render_status(view: StatusView) -> str:
    rows = [
        [
            w.title,
            w.state,
            w.pid,
            w.incarnation,
            w.heartbeat_age_ms,
            None if w.memory_bytes is None else f"{w.memory_bytes / 2**20:.0f}",
            _figures(w.stats),
        ]
        for w in view.workers
    ]
    workers = table(
        ["worker", "state", "pid", "restarts", "heartbeat ms", "memory MiB", "figures"], rows
    )
    temp = _temp_stores(view)
    if temp:
        workers += "\n\n" + temp
    head = []
    memory = view.memory
    if memory is not None:
        used, limit = memory.used_bytes / 2**20, memory.max_memory / 2**20
        head.append(
            f"memory: level {memory.level}, {used:.0f} MiB of max_memory {limit:.0f} MiB "
            f"({memory.percent} %)"
        )
    d = view.destinations
    if d is not None:
        head.append(
            f"destinations: {d.count} of max_destinations {d.max_destinations} "
            f"({d.per_destination_bytes} B each in the budget), {d.refused} refused"
        )
    return "\n".join(head) + "\n\n" + workers if head else workers


def _temp_stores(view: StatusView) -> str:
    """Each pipeline's temp store (paged non-persistent bodies)."""
    rows = []
    for w in view.workers:
        if not isinstance(w.stats, QueueWorkerStats | TopicWorkerStats):
            continue
        temp = w.stats.temp_store
        if temp is not None:
            rows.append(
                [
                    w.title,
                    "yes" if temp.paging else "no",
                    temp.messages,
                    f"{temp.bytes / 2**20:.1f}",
                    f"{temp.usage_bytes / 2**20:.0f}/{temp.limit_bytes / 2**20:.0f}",
                    "yes" if temp.full else "no",
                ]
            )
    if not rows:
        return ""
    return table(["temp store", "paging", "messages", "MiB", "disk MiB/limit", "full"], rows)


def _not_shown(count: int, what: str) -> str:
    """A line under a table that does not show everything ("" when it does)."""
    return f"\n({count} more {what} not shown)" if count else ""


def render_flow(view: FlowView) -> str:
    parts = []
    dest_rows = []
    for d in view.destinations:
        # Per store what the destination holds, where it holds something or is stopped.
        for store, s in d.stores.items():
            if s.messages or s.stopped:
                dest_rows.append(
                    [
                        d.name,
                        store,
                        s.messages,
                        s.bytes,
                        _mark(s.msg_high, s.msg_low),
                        _mark(s.byte_high, s.byte_low),
                        s.stopped or "no",
                    ]
                )
        if isinstance(d, TopicRow):  # its live buffer too
            dest_rows.append(
                [
                    d.name,
                    "topics (live)",
                    d.deepest_backlog,
                    None,
                    _mark(d.live_msg_high, d.live_msg_low),
                    None,
                    d.stopped or "no",
                ]
            )
    parts.append(
        table(
            [
                "destination",
                "store",
                "messages",
                "bytes",
                "msg high/low",
                "byte high/low",
                "stopped",
            ],
            dest_rows,
        )
        + _not_shown(view.destinations_not_shown, "destinations")
    )
    global_rows = [
        [
            worker,
            store,
            s.messages,
            s.bytes,
            _mark(s.global_msg_high, s.global_msg_low),
            _mark(s.global_byte_high, s.global_byte_low),
            s.stopped or "no",
        ]
        for worker, stores in view.global_stores.items()
        for store, s in stores.items()
    ]
    if global_rows:
        parts.append(
            table(
                ["worker", "store", "messages", "bytes", "global msg", "global bytes", "stopped"],
                global_rows,
            )
        )
    producers = [
        [p.gateway, p.peer, p.destination, p.limit, p.waiting_ms] for p in view.stopped_producers
    ]
    parts.append(
        table(["gateway", "producer", "destination", "limit", "waiting ms"], producers)
        if producers
        else "no producer is stopped"
    )
    consumers = [
        [
            c.destination,
            c.subscription,
            c.ack,
            f"{c.unacknowledged}/{c.prefetch}",
            c.backlog,
            c.ready,
            c.selector,
        ]
        for c in view.consumers
    ]
    parts.append(
        table(
            ["destination", "subscription", "ack", "window", "backlog", "ready", "selector"],
            consumers,
        )
        + _not_shown(view.consumers_not_shown, "consumers")
    )
    return "\n\n".join(parts)
