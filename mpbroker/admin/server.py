"""The admin API: HTTP JSON on a loopback port, served from a thread of the supervisor.

It reads what every worker publishes in its stats block (seqlocked JSON, or the block's
spill file when it is larger; at most `admin.stats_interval_ms` old) and the control block
(state, pid, heartbeat), so asking never disturbs the data path:

- `GET /status`: every worker with its state and published figures;
- `GET /flow`: flow control now ("Flow Control Live"): every destination's counts,
  watermarks and stops, the global stops, the producers held and for how long, every
  consumer's window and `ready: yes/no`, the durable subscriptions.
  `?offset=N&limit=M` pages its long lists (`FlowView`).
- `GET /metrics`: the status in the Prometheus text format (`metrics`).

With a users file, every request needs HTTP Basic credentials of a user in group `admin`
(`access.AdminGuard`); the Host header is checked first (DNS rebinding), so a page that
rebinds a name of its own never gets as far as a credentials prompt.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import msgspec

from mpbroker import __version__
from mpbroker.clock import epoch_ms
from mpbroker.logs import client_text, log_collapsed
from mpbroker.security import User
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
from .access import CHALLENGE, Access, AdminGuard
from .metrics import CONTENT_TYPE, SeriesCap, exposition

__all__ = [
    "LOCAL_NAMES",
    "AdminServer",
    "Page",
    "WorkerRef",
    "allowed_names",
    "flow_view",
    "host_allowed",
    "host_name",
    "page_of",
    "status_view",
]

log = logging.getLogger("mpbroker.admin")

_STATE_NAMES = {
    STATE_EMPTY: "down",
    STATE_STARTING: "starting",
    STATE_READY: "ready",
    STATE_STOPPING: "stopping",
}

# (title, role, index, control-block slot)
WorkerRef = tuple[str, str, int, int]
# (offset, limit): items offset to offset + limit - 1 of each long list (limit None: all).
Page = tuple[int, int | None]
_Item = TypeVar("_Item")


class BadRequest(ValueError):
    """A query a page does not understand (HTTP 400)."""


def page_of(query: Mapping[str, list[str]]) -> Page:
    """The page a query string asks for (`offset`, `limit`: whole numbers); BadRequest
    naming the parameter otherwise."""
    unknown = sorted(set(query) - {"offset", "limit"})
    if unknown:
        raise BadRequest(f"unknown parameter {unknown[0]!r} (offset and limit are known)")
    numbers: dict[str, int] = {}
    for name, values in query.items():
        try:
            numbers[name] = int(values[-1])
        except ValueError:
            raise BadRequest(f"{name} must be a whole number, not {values[-1]!r}") from None
        if numbers[name] < 0:
            raise BadRequest(f"{name} must be 0 or more, not {numbers[name]}")
    return numbers.get("offset", 0), numbers.get("limit")


def _paged(items: list[_Item], page: Page) -> tuple[list[_Item], int]:
    """The page's items, and how many it leaves out."""
    offset, limit = page
    shown = items[offset:] if limit is None else items[offset : offset + limit]
    return shown, len(items) - len(shown)


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


def flow_view(status: StatusView, page: Page = (0, None)) -> FlowView:
    """The flow-control part of a status, gathered over the workers; each row names the
    worker it came from. `page` cuts the long lists; the rows left out, by the page or by
    a worker that could not publish them, are counted."""
    destinations: list[tuple[str, QueueRow | TopicRow]] = []
    stores: dict[str, dict[str, GlobalStoreFigures]] = {}
    producers: list[HeldSend] = []
    consumers: list[tuple[str, ConsumerRow]] = []
    durable: list[tuple[str, DurableRow]] = []
    destinations_unpublished = consumers_unpublished = 0
    for worker in status.workers:
        stats = worker.stats
        title = worker.title
        if isinstance(stats, GatewayStats):
            producers += [_replace(row, gateway=title) for row in stats.stopped_producers]
        elif isinstance(stats, QueueWorkerStats | TopicWorkerStats):
            destinations += [(title, row) for row in stats.destinations]
            stores[title] = stats.stores
            consumers += [(title, row) for row in stats.consumers]
            destinations_unpublished += stats.destinations_not_shown
            consumers_unpublished += stats.consumers_not_shown
            if isinstance(stats, TopicWorkerStats):
                durable += [(title, row) for row in stats.durable_subscriptions]
    shown_destinations, destinations_left = _paged(destinations, page)
    shown_consumers, consumers_left = _paged(consumers, page)
    shown_durable, durable_left = _paged(durable, page)
    return FlowView(
        at_ms=status.at_ms,
        destinations=_named(shown_destinations),
        destinations_not_shown=destinations_left + destinations_unpublished,
        global_stores=stores,
        stopped_producers=producers,
        consumers=_named(shown_consumers),
        consumers_not_shown=consumers_left + consumers_unpublished,
        durable_subscriptions=_named(shown_durable),
        durable_subscriptions_not_shown=durable_left,
    )


_replace = msgspec.structs.replace
_Row = TypeVar("_Row", QueueRow | TopicRow, ConsumerRow, DurableRow)


def _named(rows: list[tuple[str, _Row]]) -> list[_Row]:
    """Each row with the worker it came from. Only the rows a page shows are copied: with
    10,000 destinations, copying all of them to show a few would be most of the page's
    cost."""
    return [_replace(row, worker=title) for title, row in rows]


LOCAL_NAMES: frozenset[str] = frozenset({"localhost", "127.0.0.1", "::1"})
"""Names the admin API always answers to."""


def allowed_names(host: str, host_names: str) -> frozenset[str]:
    """The names an admin API bound to `host` answers to: the local ones, `host` (unless it
    is a wildcard address) and the comma-separated `host_names`, lower case."""
    names = set(LOCAL_NAMES)
    if host not in ("", "0.0.0.0", "::"):
        names.add(host.lower())
    names.update(n.strip().lower() for n in host_names.split(",") if n.strip())
    return frozenset(names)


def host_name(header: str) -> str:
    """The name in a Host header, without its port: "Example:8161" -> "example",
    "[::1]:8161" -> "::1"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def host_allowed(header: str | None, names: frozenset[str]) -> bool:
    """Whether a request with this Host header is answered. A request without one (an
    HTTP/1.0 client) is: browsers, which DNS rebinding works through, always send it."""
    return header is None or host_name(header) in names


class AdminServer:
    """The HTTP server of the admin API, in a thread; `status` makes the status page.
    `names`: what the Host header may say (`allowed_names`); other requests get 403.
    `users`: the users file's users (None: there is none, and no request needs
    credentials); `use_users` swaps in those read again on SIGHUP.
    `metrics_max_destinations`: destinations (and durable subscriptions) with series of
    their own in `GET /metrics`."""

    def __init__(
        self,
        host: str,
        port: int,
        status: Callable[[], StatusView],
        names: frozenset[str] = LOCAL_NAMES,
        users: dict[str, User] | None = None,
        metrics_max_destinations: int = 1000,
    ) -> None:
        views: dict[str, Callable[[Page], StatusView | FlowView]] = {
            "/status": lambda page: status(),
            "/flow": lambda page: flow_view(status(), page),
        }
        self.guard = guard = AdminGuard(users)
        # Scrapes may come at once (a thread each); the caps remember what they admitted.
        metrics_lock = threading.Lock()
        destination_cap = SeriesCap(metrics_max_destinations)
        subscription_cap = SeriesCap(metrics_max_destinations)

        def metrics() -> bytes:
            with metrics_lock:
                return exposition(status(), destination_cap, subscription_cap, __version__)

        class Handler(BaseHTTPRequestHandler):
            # A client that opens a connection and sends nothing does not keep a thread.
            timeout = 10

            def do_GET(self) -> None:
                host = self.headers.get("Host")
                if not host_allowed(host, names):
                    log_collapsed(
                        log,
                        logging.WARNING,
                        "admin host refused",
                        self._peer(),
                        "admin: refused a request from %s for Host %s (not in admin.host_names)",
                        self.client_address[0],
                        client_text(host or ""),
                    )
                    self._reply(
                        403,
                        {
                            "error": f"Host {host!r} is not a name of this admin API (admin.host_names)"
                        },
                    )
                    return
                # Before the page is looked up: without credentials, not even which pages
                # exist is told. In this thread: a check costs tens of ms of scrypt.
                access = guard.admit(self.headers.get("Authorization"))
                if access.status != 200:
                    self._refuse(access)
                    return
                url = urlsplit(self.path)
                if url.path == "/metrics":
                    self._metrics(url.query)
                    return
                view = views.get(url.path)
                if view is None:
                    pages = [*views, "/metrics"]
                    self._reply(404, {"error": f"no such page {self.path!r}", "pages": pages})
                    return
                try:
                    page = page_of(parse_qs(url.query, keep_blank_values=True))
                except BadRequest as exc:
                    self._reply(400, {"error": str(exc)})
                    return
                try:
                    self._reply(200, encode(view(page)))
                except Exception as exc:  # never take the supervisor down with a page
                    log.exception("admin page %s failed", client_text(self.path))
                    self._reply(500, {"error": str(exc)})

            def _metrics(self, query: str) -> None:
                if query:
                    # Nothing is ignored: /metrics takes no parameters.
                    name = next(iter(parse_qs(query, keep_blank_values=True)), query)
                    self._reply(400, {"error": f"unknown parameter {name!r} (/metrics takes none)"})
                    return
                try:
                    text = metrics()
                except Exception as exc:  # never take the supervisor down with a page
                    log.exception("admin page /metrics failed")
                    self._reply(500, {"error": str(exc)})
                    return
                self._reply(200, text, content_type=CONTENT_TYPE)

            def _read_only(self) -> None:
                # Anything but GET: a JSON answer like every other (BaseHTTPRequestHandler's
                # own is an HTML 501).
                self._reply(
                    405,
                    {"error": f"{self.command} not allowed: the admin API is read-only (GET)"},
                    {"Allow": "GET"},
                )

            do_POST = do_PUT = do_DELETE = do_PATCH = _read_only

            def _peer(self) -> str:
                # host:port, as a gateway names a peer: log_collapsed takes the address
                # from it (a bare "::1" would lose its last group as a "port").
                host, port = self.client_address[:2]
                return f"{host}:{port}"

            def _refuse(self, access: Access) -> None:
                # Never the password; the user name is the client's text.
                log_collapsed(
                    log,
                    logging.WARNING,
                    access.kind,
                    self._peer(),
                    "admin: refused a request from %s%s: %s (HTTP %d)",
                    self.client_address[0],
                    "" if access.user is None else f" by {client_text(repr(access.user))}",
                    access.error,
                    access.status,
                )
                challenge = {"WWW-Authenticate": CHALLENGE} if access.status == 401 else {}
                self._reply(access.status, {"error": access.error}, challenge)

            def _reply(
                self,
                code: int,
                body: dict[str, Any] | bytes,
                headers: Mapping[str, str] | None = None,
                content_type: str = "application/json",
            ) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(code)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                # The request line is the client's text.
                log.debug("admin: %s", client_text(format % args))

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.address: tuple[str, int] = self.httpd.server_address[:2]  # type: ignore[assignment]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name="admin-api", daemon=True
        )

    def use_users(self, users: dict[str, User] | None) -> None:
        """Check credentials against `users` from now on (SIGHUP read the users file
        again); what was remembered of the old ones is forgotten."""
        self.guard.use(users)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        if self.thread.is_alive():
            self.httpd.shutdown()
            self.thread.join(5)
        self.httpd.server_close()
