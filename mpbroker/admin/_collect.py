"""What a pipeline publishes in its stats block for the admin API (JSON-ready dicts).

Built from the engines' own state every `admin.stats_interval_ms`; lists are cut at
`_MAX_ITEMS` entries (the count of what was left out is given) so a broker with many
destinations or consumers still fits its block.
"""

from __future__ import annotations

from typing import Any

from mpbroker.engine import Engine, QueueEngine, TopicEngine
from mpbroker.flow import FlowTracker, StoreLimits
from mpbroker.records import ACK_MODES

__all__ = ["consumers_snapshot", "queues_snapshot", "topics_snapshot"]

_MAX_ITEMS = 1000
_ACK_NAMES = {value: name for name, value in ACK_MODES.items()}


def _cut(items: list[dict[str, Any]], what: str, out: dict[str, Any]) -> None:
    out[what] = items[:_MAX_ITEMS]
    if len(items) > _MAX_ITEMS:
        out[f"{what}_not_shown"] = len(items) - _MAX_ITEMS


def _marks(limits: StoreLimits) -> dict[str, int]:
    return {
        "msg_high": limits.messages.high,
        "msg_low": limits.messages.low,
        "byte_high": limits.bytes.high,
        "byte_low": limits.bytes.low,
    }


# (store, its tracker, what it stops now): the stops are taken once per snapshot.
_Tracked = list[tuple[str, FlowTracker, dict[str, str]]]


def _tracked(trackers: list[tuple[str, FlowTracker]]) -> _Tracked:
    return [(store, tracker, tracker.stopped()) for store, tracker in trackers]


def _store_rows(name: str, tracked: _Tracked) -> dict[str, Any]:
    """Per store: what `name` holds there, its watermarks and its stop."""
    stores: dict[str, Any] = {}
    for store, tracker, stopped in tracked:
        messages, nbytes = tracker.counts(name)
        limits = tracker.destination_limits(name) if tracker.destination_limits else tracker.limits
        stores[store] = {
            "messages": messages,
            "bytes": nbytes,
            **_marks(limits),
            "stopped": stopped.get(name, ""),
        }
    return stores


def _global_rows(tracked: _Tracked) -> dict[str, Any]:
    return {
        store: {
            "messages": tracker.totals[0],
            "bytes": tracker.totals[1],
            "global_msg_high": tracker.limits.global_messages.high,
            "global_msg_low": tracker.limits.global_messages.low,
            "global_byte_high": tracker.limits.global_bytes.high,
            "global_byte_low": tracker.limits.global_bytes.low,
            "stopped": stopped.get("", ""),
        }
        for store, tracker, stopped in tracked
    }


def queues_snapshot(engine: QueueEngine, trackers: list[tuple[str, FlowTracker]]) -> dict[str, Any]:
    """Every queue: waiting and unacknowledged messages, and per store its counts,
    watermarks and stop; the stores' global counts and stops."""
    tracked = _tracked(trackers)
    rows: list[dict[str, Any]] = []
    for name, queue in sorted(engine.queues.items()):
        stores = _store_rows(name, tracked)
        rows.append(
            {
                "name": name,
                "waiting": len(queue.pending),
                "unacknowledged": queue.held_messages - len(queue.pending),
                "consumers": len(queue.consumers),
                "stores": stores,
            }
        )
    out: dict[str, Any] = {}
    _cut(rows, "destinations", out)
    out["stores"] = _global_rows(tracked)
    return out


def topics_snapshot(engine: TopicEngine, trackers: list[tuple[str, FlowTracker]]) -> dict[str, Any]:
    """Every topic with subscribers or stored messages: subscribers, the slowest one's
    backlog, the live watermark and stop, and what its durable backlog holds in the topic
    store; the topic store's and the live buffer's global figures."""
    stops = engine.live_stops()
    tracked = _tracked(trackers)
    rows = []
    names = set(engine.topics) | {
        name for _, tracker in trackers for name in tracker.tracked_destinations()
    }
    for name in sorted(names):
        subscribers = engine.topics.get(name, [])
        mark = engine.live_mark_for(name)
        rows.append(
            {
                "name": name,
                "subscribers": len(subscribers),
                "deepest_backlog": max((len(c.pending) for c in subscribers), default=0),
                "live_msg_high": mark.high,
                "live_msg_low": mark.low,
                "stopped": stops.get(name, ""),
                "stores": _store_rows(name, tracked),
            }
        )
    out: dict[str, Any] = {}
    _cut(rows, "destinations", out)
    out["stores"] = _global_rows(tracked)
    # The live buffer (slow subscribers' backlogs) as one more global row.
    out["stores"]["topics (live)"] = {
        "messages": engine.live_total,
        "bytes": engine.live_bytes,
        "global_msg_high": engine.global_live.mark.high,
        "global_msg_low": engine.global_live.mark.low,
        "global_byte_high": engine.global_live_bytes.mark.high,
        "global_byte_low": engine.global_live_bytes.mark.low,
        "stopped": stops.get("", ""),
    }
    return out


def consumers_snapshot(*engines: Engine) -> dict[str, Any]:
    """Every consumer's window: in use, size, and whether it can take more (`ready`)."""
    rows = []
    for engine in engines:
        for consumer in engine.consumers.values():
            gateway, conn, _ = consumer.key
            rows.append(
                {
                    "destination": consumer.destination,
                    "subscription": consumer.sub_id,
                    "gateway": gateway,
                    "connection": conn,
                    "ack": _ACK_NAMES.get(consumer.ack_mode, str(consumer.ack_mode)),
                    "unacknowledged": len(consumer.unacked),
                    "prefetch": consumer.prefetch,
                    "unacknowledged_bytes": consumer.unacked_bytes,
                    "window_bytes": consumer.window_bytes,
                    "backlog": len(consumer.pending),
                    "ready": "yes" if consumer.ready else "no",
                }
            )
    out: dict[str, Any] = {}
    _cut(rows, "consumers", out)
    return out
