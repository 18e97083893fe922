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
    control: ControlBlock, stats: dict[int, StatsBlock], workers: list[WorkerRef]
) -> dict[str, Any]:
    now = monotonic_ms()
    rows = []
    for title, role, index, slot_index in workers:
        slot = control.slot(slot_index)
        try:
            raw = stats[slot_index].read()
            published: Any = json.loads(raw) if raw else {}
        except (ShmError, ValueError) as exc:
            published = {"error": f"cannot read its stats: {exc}"}
        rows.append(
            {
                "title": title,
                "role": role,
                "index": index,
                "state": _STATE_NAMES.get(slot.state, str(slot.state)),
                "pid": slot.pid,
                "incarnation": slot.incarnation,
                "heartbeat_age_ms": max(0, now - slot.heartbeat_ms) if slot.heartbeat_ms else None,
                "stats": published,
            }
        )
    return {"at_ms": epoch_ms(), "workers": rows}


def flow_view(status: dict[str, Any]) -> dict[str, Any]:
    """The flow-control part of a status, gathered over the workers."""
    destinations: list[dict[str, Any]] = []
    stores: dict[str, Any] = {}
    producers: list[dict[str, Any]] = []
    consumers: list[dict[str, Any]] = []
    durable: list[dict[str, Any]] = []
    for worker in status["workers"]:
        stats = worker["stats"]
        title = worker["title"]
        for row in stats.get("destinations", []):
            destinations.append({**row, "worker": title})
        if "stores" in stats:
            stores[title] = stats["stores"]
        for row in stats.get("stopped_producers", []):
            producers.append({**row, "gateway": title})
        for row in stats.get("consumers", []):
            consumers.append({**row, "worker": title})
        for row in stats.get("durable_subscriptions", []):
            durable.append({**row, "worker": title})
    return {
        "at_ms": status["at_ms"],
        "destinations": destinations,
        "global": stores,
        "stopped_producers": producers,
        "consumers": consumers,
        "durable_subscriptions": durable,
    }


class AdminServer:
    def __init__(self, host: str, port: int, status: Callable[[], dict[str, Any]]) -> None:
        views: dict[str, Callable[[], dict[str, Any]]] = {
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
                    self._reply(200, view())
                except Exception as exc:  # never take the supervisor down with a page
                    log.exception("admin page %s failed", self.path)
                    self._reply(500, {"error": str(exc)})

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body, indent=1).encode()
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
