"""The admin API: HTTP JSON on a loopback port, served from a thread of the supervisor.

It reads what every worker publishes in its stats block (seqlocked JSON, or the block's
spill file when it is larger; at most `admin.stats_interval_ms` old) and the control block
(state, pid, heartbeat), so asking never disturbs the data path:

- `GET /status`: every worker with its state and published figures;
- `GET /flow`: flow control now ("Flow Control Live"): every destination's counts,
  watermarks and stops, the global stops, the producers held and for how long, every
  consumer's window and `ready: yes/no`, the durable subscriptions.
  `?offset=N&limit=M` pages its long lists (`FlowView`); `sort`, `order` and `filter`
  choose the destinations before they are paged (`Selection`);
- `GET /status?offset=N&limit=M` pages each pipeline's destinations and consumers the same
  way (`limit=0`: the workers' figures without their lists, what the dashboard polls);
- `GET /metrics`: the status in the Prometheus text format (`metrics`);
- `GET /` and `GET /static/<file>`: the dashboard, a page of static files (`mpbroker/admin/
  static/`) that polls the two JSON pages; a strict Content-Security-Policy, no frames.

`HEAD` of any path is answered as `GET` without the body; other methods get a JSON 405.

With a users file, every request needs HTTP Basic credentials of a user in group `admin`
(`access.AdminGuard`); the Host header is checked first (DNS rebinding), so a page that
rebinds a name of its own never gets as far as a credentials prompt.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeVar
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
    consumers_of,
    decode,
    encode,
    stopped_by,
    waiting_of,
    with_durable_backlogs,
)
from .access import CHALLENGE, Access, AdminGuard

if TYPE_CHECKING:
    from .metrics import SeriesCap

__all__ = [
    "LOCAL_NAMES",
    "SORT_KEYS",
    "STATIC_FILES",
    "AdminServer",
    "Page",
    "Selection",
    "WorkerRef",
    "allowed_names",
    "flow_query",
    "flow_view",
    "host_allowed",
    "host_name",
    "page_of",
    "select_destinations",
    "status_page",
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
_replace = msgspec.structs.replace


class BadRequest(ValueError):
    """A query a page does not understand (HTTP 400)."""


def page_of(query: Mapping[str, list[str]], known: tuple[str, ...] = ("offset", "limit")) -> Page:
    """The page a query string asks for (`offset`, `limit`: whole numbers); BadRequest
    naming the parameter otherwise, or a parameter not in `known`."""
    unknown = sorted(set(query) - set(known))
    if unknown:
        names = ", ".join(known[:-1]) + f" and {known[-1]}"
        raise BadRequest(f"unknown parameter {unknown[0]!r} ({names} are known)")
    repeated = sorted(name for name, values in query.items() if len(values) > 1)
    if repeated:
        # Which of two values was meant is not for us to guess.
        raise BadRequest(f"parameter {repeated[0]!r} given more than once")
    numbers: dict[str, int] = {}
    for name in ("offset", "limit"):
        if name not in query:
            continue
        values = query[name]
        try:
            numbers[name] = int(values[-1])
        except ValueError:
            raise BadRequest(f"{name} must be a whole number, not {values[-1]!r}") from None
        if numbers[name] < 0:
            raise BadRequest(f"{name} must be 0 or more, not {numbers[name]}")
    return numbers.get("offset", 0), numbers.get("limit")


def _backlog(row: QueueRow | TopicRow) -> int:
    # A queue's waiting and unacknowledged messages; a topic's for its slowest subscriber,
    # a durable one's stored messages included (`waiting_of`).
    return waiting_of(row) + row.unacknowledged if isinstance(row, QueueRow) else waiting_of(row)


# Per sort key: what it sorts by (for a row and the worker that owns it), and whether it
# sorts largest first unless `order` says otherwise (the numbers and the stops: what a
# person looks for is at the top).
_SortKey = Callable[[str, QueueRow | TopicRow], Any]
_SORTS: dict[str, tuple[_SortKey, bool]] = {
    "name": (lambda worker, row: row.name, False),
    "kind": (lambda worker, row: isinstance(row, TopicRow), False),
    "backlog": (lambda worker, row: _backlog(row), True),
    "waiting": (lambda worker, row: waiting_of(row), True),
    "unacknowledged": (lambda worker, row: row.unacknowledged, True),
    "consumers": (lambda worker, row: consumers_of(row), True),
    "stopped": (lambda worker, row: stopped_by(row) != "", True),
    "worker": (lambda worker, row: worker, False),
}
SORT_KEYS: tuple[str, ...] = tuple(_SORTS)
"""What `GET /flow?sort=` sorts the destinations by."""
_ORDERS = ("asc", "desc")
_FLOW_PARAMETERS = ("offset", "limit", "sort", "order", "filter")


@dataclass(frozen=True, slots=True)
class Selection:
    """Which destinations a `/flow` page shows, before it is paged: those whose name holds
    `filter` (any case; "" every one), sorted by `sort` (None: as the workers list them,
    p2p workers first, each in name order), largest first when `descending`. Equal ones
    stay in name order."""

    sort: str | None = None
    descending: bool = False
    filter: str = ""


def flow_query(query: Mapping[str, list[str]]) -> tuple[Page, Selection]:
    """The page and the selection a `/flow` query string asks for; BadRequest naming the
    parameter (and what it may be) otherwise."""
    page = page_of(query, _FLOW_PARAMETERS)
    sort = query["sort"][-1] if "sort" in query else None
    if sort is not None and sort not in _SORTS:
        raise BadRequest(f"sort must be one of {', '.join(SORT_KEYS)}, not {sort!r}")
    order = query["order"][-1] if "order" in query else None
    if order is not None:
        if order not in _ORDERS:
            raise BadRequest(f"order must be asc or desc, not {order!r}")
        if sort is None:
            raise BadRequest("order needs sort (one of " + ", ".join(SORT_KEYS) + ")")
    descending = _SORTS[sort][1] if sort is not None and order is None else order == "desc"
    return page, Selection(sort, descending, query.get("filter", [""])[-1])


def select_destinations(
    destinations: list[tuple[str, QueueRow | TopicRow]], selection: Selection
) -> list[tuple[str, QueueRow | TopicRow]]:
    """The (worker, row) pairs `selection` keeps, in its order. Pure."""
    chosen = destinations
    if selection.filter:
        needle = selection.filter.casefold()
        chosen = [pair for pair in chosen if needle in pair[1].name.casefold()]
    if selection.sort is not None:
        key, _ = _SORTS[selection.sort]
        # Name order first: sorted() is stable (reverse=True too), so equal keys keep it.
        chosen = sorted(chosen, key=lambda pair: (pair[1].name, pair[0]))
        chosen.sort(key=lambda pair: key(*pair), reverse=selection.descending)
    return chosen


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
    process_memory: Mapping[int, int] | None = None,
) -> StatusView:
    """Every worker's state (from the control block) and last snapshot (its stats block);
    `process_memory`: MemWatch's last reading of each process, by pid."""
    now = monotonic_ms()
    process_memory = process_memory or {}
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
                memory_bytes=process_memory.get(slot.pid) if slot.pid else None,
            )
        )
    # Each topic's durable backlog: the replay workers' counts joined to its row here, so
    # /status, /flow and /metrics agree on it.
    return with_durable_backlogs(StatusView(at_ms=epoch_ms(), workers=rows, memory=memory))


def status_page(status: StatusView, page: Page) -> StatusView:
    """`status` with each pipeline's destinations and consumers cut to `page`; their
    `*_not_shown` counts grow by the rows cut out."""
    if page == (0, None):
        return status
    workers = []
    for worker in status.workers:
        stats = worker.stats
        if isinstance(stats, QueueWorkerStats | TopicWorkerStats):
            destinations, destinations_left = _paged(list(stats.destinations), page)
            consumers, consumers_left = _paged(stats.consumers, page)
            stats = _replace(
                stats,
                destinations=destinations,
                destinations_not_shown=stats.destinations_not_shown + destinations_left,
                consumers=consumers,
                consumers_not_shown=stats.consumers_not_shown + consumers_left,
            )
            worker = _replace(worker, stats=stats)
        workers.append(worker)
    return _replace(status, workers=workers)


def flow_view(
    status: StatusView, page: Page = (0, None), selection: Selection = Selection()
) -> FlowView:
    """The flow-control part of a status, gathered over the workers; each row names the
    worker it came from. `selection` filters and sorts the destinations, then `page` cuts
    the long lists; the rows left out, by the filter, by the page or by a worker that
    could not publish them, are counted."""
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
    selected = select_destinations(destinations, selection)
    shown_destinations, destinations_left = _paged(selected, page)
    destinations_left += len(destinations) - len(selected)  # filtered out
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
        destinations_matching=len(selected) if selection.filter else None,
    )


_Row = TypeVar("_Row", QueueRow | TopicRow, ConsumerRow, DurableRow)


def _named(rows: list[tuple[str, _Row]]) -> list[_Row]:
    """Each row with the worker it came from. Only the rows a page shows are copied: with
    10,000 destinations, copying all of them to show a few would be most of the page's
    cost."""
    return [_replace(row, worker=title) for title, row in rows]


STATIC_FILES: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
"""The dashboard's files (in `mpbroker/admin/static/`) and their Content-Type:
`GET /` is index.html, `GET /static/<name>` the others; nothing else is served."""

# Every answer: never cached, never sniffed as another type, never in a frame. The page may
# load its script, style and data only from this server (no inline script or style: a
# destination's name in the page can never run), and a favicon given inline.
_SECURITY_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
}


def _static_pages() -> dict[str, tuple[bytes, str]]:
    """Path -> (body, Content-Type) of the dashboard's files, read from the package."""
    folder = resources.files("mpbroker.admin") / "static"
    pages = {}
    for name, kind in STATIC_FILES.items():
        path = "/" if name == "index.html" else f"/static/{name}"
        pages[path] = ((folder / name).read_bytes(), kind)
    return pages


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
        def status_json(query: Mapping[str, list[str]]) -> StatusView:
            page = page_of(query)  # before the status is made: a bad query costs nothing
            return status_page(status(), page)

        def flow_json(query: Mapping[str, list[str]]) -> FlowView:
            page, selection = flow_query(query)
            return flow_view(status(), page, selection)

        views: dict[str, Callable[[Mapping[str, list[str]]], StatusView | FlowView]] = {
            "/status": status_json,
            "/flow": flow_json,
        }
        static = _static_pages()
        self.guard = guard = AdminGuard(users)
        # Scrapes may come at once (a thread each); the caps remember what they admitted.
        # prometheus-client is imported at the first scrape: a broker nobody scrapes does
        # not hold it (1.4 MiB of the supervisor's memory).
        metrics_lock = threading.Lock()
        caps: list[SeriesCap] = []

        def metrics() -> bytes:
            from .metrics import SeriesCap, exposition

            with metrics_lock:
                if not caps:
                    caps.extend(SeriesCap(metrics_max_destinations) for _ in range(2))
                return exposition(status(), caps[0], caps[1], __version__)

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
                if url.path in static:
                    if url.query:
                        # Nothing is ignored: the page and its files take no parameters.
                        self._reply(400, {"error": f"{url.path} takes no parameters"})
                        return
                    body, kind = static[url.path]
                    self._reply(200, body, content_type=kind)
                    return
                view = views.get(url.path)
                if view is None:
                    pages = ["/", *views, "/metrics"]
                    self._reply(404, {"error": f"no such page {self.path!r}", "pages": pages})
                    return
                query = parse_qs(url.query, keep_blank_values=True)
                try:
                    self._reply(200, encode(view(query)))
                except BadRequest as exc:
                    self._reply(400, {"error": str(exc)})
                except Exception as exc:  # never take the supervisor down with a page
                    log.exception("admin page %s failed", client_text(self.path))
                    self._reply(500, {"error": str(exc)})

            def _metrics(self, query: str) -> None:
                if query:
                    # Nothing is ignored: /metrics takes no parameters.
                    name = next(iter(parse_qs(query, keep_blank_values=True)), query)
                    self._reply(400, {"error": f"unknown parameter {name!r} (/metrics takes none)"})
                    return
                from .metrics import CONTENT_TYPE

                try:
                    text = metrics()
                except Exception as exc:  # never take the supervisor down with a page
                    log.exception("admin page /metrics failed")
                    self._reply(500, {"error": str(exc)})
                    return
                self._reply(200, text, content_type=CONTENT_TYPE)

            def do_HEAD(self) -> None:
                # What curl -I and uptime probes send: the status and headers GET would
                # give (Content-Length too, so the page is made all the same), through the
                # same Host check and credentials; `_reply` leaves the body out.
                self.do_GET()

            def send_error(
                self, code: int, message: str | None = None, explain: str | None = None
            ) -> None:
                if code != HTTPStatus.NOT_IMPLEMENTED:
                    super().send_error(code, message, explain)
                    return
                # BaseHTTPRequestHandler's answer to a method it has no `do_` for (POST,
                # OPTIONS, TRACE, CONNECT, anything), an HTML 501: ours is a JSON answer
                # like every other, the 405 that says which methods there are. The body
                # such a request may carry is not read: the connection closes.
                self._reply(
                    405,
                    {
                        "error": f"{client_text(self.command, 20)} not allowed: the admin API "
                        "is read-only (GET, HEAD)"
                    },
                    {"Allow": "GET, HEAD", "Connection": "close"},
                )

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
                for name, value in {**_SECURITY_HEADERS, **(headers or {})}.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
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
