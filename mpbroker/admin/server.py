"""The admin API: HTTP JSON on a loopback port, served from a thread of the supervisor.

It reads what every worker publishes in its stats block (seqlocked JSON, at most
`admin.stats_interval_ms` old) and the control block (state, pid, heartbeat), so asking
never disturbs the data path:

- `GET /status`: every worker with its state and published figures;
- `GET /flow`: flow control now ("Flow Control Live"): every destination's counts,
  watermarks and stops, the global stops, the producers held and for how long, every
  consumer's window and `ready: yes/no`, the durable subscriptions.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec

from mpbroker.clock import epoch_ms
from mpbroker.shm import (
    STATE_EMPTY,
    STATE_READY,
    STATE_STARTING,
    STATE_STOPPING,
    ControlBlock,
    ShmError,
    StatsBlock,
    monotonic_ms,
)

from ._snapshots import (
    ConsumerRow,
    DurableRow,
    FlowView,
    GatewayStats,
    GlobalStoreFigures,
    HeldSend,
    MemoryStatus,
    QueueRow,
    QueueWorkerStats,
    StatusView,
    TopicRow,
    TopicWorkerStats,
    WorkerStats,
    WorkerStatus,
    decode,
    encode,
)

__all__ = ["AdminServer", "WorkerRef", "flow_view", "status_view"]

log = logging.getLogger("mpbroker.admin")

_STATE_NAMES = {
    STATE_EMPTY: "down",
    STATE_STARTING: "starting",
    STATE_READY: "ready",
    STATE_STOPPING: "stopping",
}

# (title, role, index, control-block slot)
WorkerRef = tuple[str, str, int, int]


def status_view(
    control: ControlBlock,
    stats: dict[int, StatsBlock],
    workers: list[WorkerRef],
    memory: MemoryStatus | None = None,
) -> StatusView:
    """Every worker's state (from the control block) and last snapshot (its stats block)."""
    now = monotonic_ms()
    rows = []
    for title, role, index, slot_index in workers:
        slot = control.slot(slot_index)
        published: WorkerStats | None = None
        problem = None
        try:
            raw = stats[slot_index].read()
            if raw:
                published = decode(raw, WorkerStats)  # type: ignore[arg-type]
        except (ShmError, msgspec.DecodeError) as exc:
            problem = f"cannot read its stats: {exc}"
        rows.append(
            WorkerStatus(
                title=title,
                role=role,
                index=index,
                state=_STATE_NAMES.get(slot.state, str(slot.state)),
                pid=slot.pid,
                incarnation=slot.incarnation,
                heartbeat_age_ms=max(0, now - slot.heartbeat_ms) if slot.heartbeat_ms else None,
                stats=published,
                stats_error=problem,
            )
        )
    return StatusView(at_ms=epoch_ms(), workers=rows, memory=memory)


def flow_view(status: StatusView) -> FlowView:
    """The flow-control part of a status, gathered over the workers; each row names the
    worker it came from."""
    destinations: list[QueueRow | TopicRow] = []
    stores: dict[str, dict[str, GlobalStoreFigures]] = {}
    producers: list[HeldSend] = []
    consumers: list[ConsumerRow] = []
    durable: list[DurableRow] = []
    replace = msgspec.structs.replace
    for worker in status.workers:
        stats = worker.stats
        title = worker.title
        if isinstance(stats, GatewayStats):
            producers += [replace(row, gateway=title) for row in stats.stopped_producers]
        elif isinstance(stats, QueueWorkerStats | TopicWorkerStats):
            destinations += [replace(row, worker=title) for row in stats.destinations]
            stores[title] = stats.stores
            consumers += [replace(row, worker=title) for row in stats.consumers]
            if isinstance(stats, TopicWorkerStats):
                durable += [replace(row, worker=title) for row in stats.durable_subscriptions]
    return FlowView(
        at_ms=status.at_ms,
        destinations=destinations,
        global_stores=stores,
        stopped_producers=producers,
        consumers=consumers,
        durable_subscriptions=durable,
    )


class AdminServer:
    """The HTTP server of the admin API, in a thread; `status` makes the status page."""

    def __init__(self, host: str, port: int, status: Callable[[], StatusView]) -> None:
        views: dict[str, Callable[[], StatusView | FlowView]] = {
            "/status": status,
            "/flow": lambda: flow_view(status()),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                view = views.get(self.path.split("?")[0])
                if view is None:
                    self._reply(404, {"error": f"no such page {self.path!r}", "pages": [*views]})
                    return
                try:
                    self._reply(200, encode(view()))
                except Exception as exc:  # never take the supervisor down with a page
                    log.exception("admin page %s failed", self.path)
                    self._reply(500, {"error": str(exc)})

            def _reply(self, code: int, body: dict[str, Any] | bytes) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("admin: " + format, *args)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.address: tuple[str, int] = self.httpd.server_address[:2]  # type: ignore[assignment]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name="admin-api", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        if self.thread.is_alive():
            self.httpd.shutdown()
            self.thread.join(5)
        self.httpd.server_close()
