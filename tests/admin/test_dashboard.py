"""What the dashboard needs of the admin API: `/flow` sorted and filtered before it is paged
(and its 400s), `/status` paged, each worker's memory, and the static files served with
their types and security headers, behind the Host check and the credentials like every
page. The page itself runs in a real Chromium in tests/e2e/test_dashboard.py."""

from __future__ import annotations

import itertools
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import pytest

import mpbroker.admin
from mpbroker import logs
from mpbroker.admin import (
    QueueRow,
    StoreFigures,
    TopicRow,
    WorkerStatus,
)
from mpbroker.admin.access import authorization
from mpbroker.admin.server import (
    SORT_KEYS,
    STATIC_FILES,
    AdminServer,
    BadRequest,
    Selection,
    allowed_names,
    flow_query,
    flow_view,
    select_destinations,
    status_page,
    status_view,
)
from mpbroker.admin.text import render_status
from mpbroker.logs import Collapser
from mpbroker.security import User, hash_password
from mpbroker.shm import ControlBlock, StatsBlock, remove_instance, segment_name
from tests.admin.test_server import p2p, pubsub, status

_counter = itertools.count()

STATIC = Path(mpbroker.admin.__file__).parent / "static"


def stores(stopped: str = "") -> dict[str, StoreFigures]:
    figures = StoreFigures(
        messages=0, bytes=0, msg_high=10, msg_low=5, byte_high=-1, byte_low=-1, stopped=stopped
    )
    return {"vol_queue_store": figures}


def q(name: str, waiting: int, unacked: int = 0, consumers: int = 0, stop: str = "") -> QueueRow:
    return QueueRow(
        name=name,
        waiting=waiting,
        unacknowledged=unacked,
        consumers=consumers,
        stores=stores(stop),
    )


def t(name: str, backlog: int, subscribers: int = 1, stop: str = "") -> TopicRow:
    return TopicRow(
        name=name,
        subscribers=subscribers,
        deepest_backlog=backlog,
        live_msg_high=5000,
        live_msg_low=4000,
        stopped=stop,
        stores={},
    )


ROWS: list[tuple[str, QueueRow | TopicRow]] = [
    ("p2p 0", q("/queue/Orders", 5, 3, consumers=1)),
    ("p2p 0", q("/queue/audit", 8, 0, stop="msg_high 10")),
    ("p2p 1", q("/queue/billing", 2, 9, consumers=2)),
    ("pubsub 0", t("/topic/orders.news", 7, subscribers=3, stop="live_msg_high 5000")),
    ("pubsub 0", t("/topic/prices", 0)),
]


def names(rows: list[tuple[str, QueueRow | TopicRow]]) -> list[str]:
    return [row.name for _, row in rows]


@pytest.mark.parametrize(
    ("sort", "descending", "expected"),
    [
        # backlog: waiting + unacknowledged of a queue, deepest_backlog of a topic
        ("backlog", True, ["/queue/billing", "/queue/Orders", "/queue/audit", "/topic/orders.news", "/topic/prices"]),
        ("backlog", False, ["/topic/prices", "/topic/orders.news", "/queue/Orders", "/queue/audit", "/queue/billing"]),
        ("waiting", True, ["/queue/audit", "/topic/orders.news", "/queue/Orders", "/queue/billing", "/topic/prices"]),
        ("unacknowledged", True, ["/queue/billing", "/queue/Orders", "/queue/audit", "/topic/orders.news", "/topic/prices"]),
        ("consumers", True, ["/topic/orders.news", "/queue/billing", "/queue/Orders", "/topic/prices", "/queue/audit"]),
        ("name", False, ["/queue/Orders", "/queue/audit", "/queue/billing", "/topic/orders.news", "/topic/prices"]),
        ("kind", True, ["/topic/orders.news", "/topic/prices", "/queue/Orders", "/queue/audit", "/queue/billing"]),
        # the stopped first, the flowing ones after, each in name order
        ("stopped", True, ["/queue/audit", "/topic/orders.news", "/queue/Orders", "/queue/billing", "/topic/prices"]),
        ("worker", True, ["/topic/orders.news", "/topic/prices", "/queue/billing", "/queue/Orders", "/queue/audit"]),
    ],
)  # fmt: skip
def test_destinations_sort_by_each_key_equal_ones_in_name_order(
    sort: str, descending: bool, expected: list[str]
) -> None:
    assert names(select_destinations(ROWS, Selection(sort, descending))) == expected


def test_the_filter_is_a_substring_of_the_name_in_any_case() -> None:
    assert names(select_destinations(ROWS, Selection(filter="ORDERS"))) == [
        "/queue/Orders",
        "/topic/orders.news",
    ]
    assert names(select_destinations(ROWS, Selection(filter="nothing"))) == []
    # Without a sort the workers' own order stays.
    assert select_destinations(ROWS, Selection()) == ROWS


@pytest.mark.parametrize(
    ("query", "page", "selection"),
    [
        ({}, (0, None), Selection()),
        ({"sort": ["backlog"]}, (0, None), Selection("backlog", True)),
        ({"sort": ["name"]}, (0, None), Selection("name", False)),
        ({"sort": ["name"], "order": ["desc"]}, (0, None), Selection("name", True)),
        ({"sort": ["backlog"], "order": ["asc"]}, (0, None), Selection("backlog", False)),
        (
            {"filter": ["ord"], "offset": ["50"], "limit": ["25"]},
            (50, 25),
            Selection(filter="ord"),
        ),
        ({"filter": [""]}, (0, None), Selection()),
    ],
)
def test_flow_query_parameters(
    query: dict[str, list[str]], page: tuple[int, int | None], selection: Selection
) -> None:
    assert flow_query(query) == (page, selection)


@pytest.mark.parametrize(
    ("query", "error"),
    [
        (
            {"sort": ["size"]},
            "sort must be one of name, kind, backlog, waiting, unacknowledged, consumers, "
            "stopped, worker, not 'size'",
        ),
        ({"sort": ["name"], "order": ["down"]}, "order must be asc or desc, not 'down'"),
        ({"order": ["asc"]}, r"order needs sort \(one of name, kind, backlog"),
        (
            {"page": ["2"]},
            "unknown parameter 'page' \\(offset, limit, sort, order and filter are known\\)",
        ),
        ({"limit": ["-1"]}, "limit must be 0 or more, not -1"),
    ],
)
def test_bad_flow_parameters_are_refused(query: dict[str, list[str]], error: str) -> None:
    with pytest.raises(BadRequest, match=error):
        flow_query(query)


def test_sort_keys_are_the_documented_ones() -> None:
    assert SORT_KEYS == (
        "name",
        "kind",
        "backlog",
        "waiting",
        "unacknowledged",
        "consumers",
        "stopped",
        "worker",
    )


def test_a_sorted_filtered_page_counts_everything_it_leaves_out() -> None:
    whole = status(p2p(300), pubsub(50))  # every queue has 1 waiting, every topic 0
    page, selection = flow_query(
        {"filter": ["Q001"], "sort": ["name"], "order": ["desc"], "offset": ["2"], "limit": ["3"]}
    )
    view = flow_view(whole, page, selection)
    # /queue/q00100 .. /queue/q00199 match; name descending, from the third one
    assert [d.name for d in view.destinations] == [
        "/queue/q00197",
        "/queue/q00196",
        "/queue/q00195",
    ]
    assert view.destinations_matching == 100
    assert view.destinations_not_shown == 350 - 3
    # Without a filter, the count of what matches is left out (every one does).
    unfiltered = flow_view(whole, (0, 5), Selection("backlog", True))
    assert unfiltered.destinations_matching is None
    assert unfiltered.destinations[0].name == "/queue/q00000"
    assert unfiltered.destinations_not_shown == 345


def test_status_pages_each_pipelines_lists_and_counts_the_rest() -> None:
    whole = status(p2p(30), pubsub(20))
    assert status_page(whole, (0, None)) is whole
    cut = status_page(whole, (0, 0))
    queues, topics = (w.stats for w in cut.workers)
    assert (queues.destinations, queues.destinations_not_shown) == ([], 30)  # type: ignore[union-attr]
    assert (queues.consumers, queues.consumers_not_shown) == ([], 2)  # type: ignore[union-attr]
    assert (topics.destinations_not_shown, topics.consumers_not_shown) == (20, 20)  # type: ignore[union-attr]
    # The durable subscriptions stay whole (they have no count of their own to grow).
    assert len(topics.durable_subscriptions) == 1  # type: ignore[union-attr]
    some = status_page(whole, (28, 5))
    assert [d.name for d in some.workers[0].stats.destinations] == [  # type: ignore[union-attr]
        "/queue/q00028",
        "/queue/q00029",
    ]


@pytest.fixture
def instance() -> Iterator[str]:
    name = f"{os.getpid()}d{next(_counter)}"
    yield name
    remove_instance(name)


def test_each_workers_memory_comes_from_memwatchs_reading_of_its_pid(instance: str) -> None:
    control = ControlBlock.create(segment_name(instance, "control"), 3)
    blocks = {n: StatsBlock.create(segment_name(instance, f"stats-{n}"), 4096) for n in range(3)}
    try:
        control.slot(0).pid = 4242
        control.slot(1).pid = 4343  # restarted since the reading: not in it
        refs = [("gateway 0", "gateway", 0, 0), ("p2p 0", "p2p", 0, 1), ("p2p 1", "p2p", 1, 2)]
        view = status_view(control, blocks, refs, process_memory={4242: 50 * 2**20, 1: 7})
        assert [w.memory_bytes for w in view.workers] == [50 * 2**20, None, None]
        assert "memory_bytes" not in json.loads(mpbroker.admin.encode(view.workers[1]))
        text = render_status(view)
        assert text.splitlines()[0].split()[:7] == [
            "worker",
            "state",
            "pid",
            "restarts",
            "heartbeat",
            "ms",
            "memory",
        ]
        assert text.splitlines()[1].split()[:5] == ["gateway", "0", "down", "4242", "0"]
        assert " 50 " in text.splitlines()[1]
    finally:
        for block in blocks.values():
            block.close()
            block.unlink()
        control.close()
        control.unlink()


def fetch(
    server: AdminServer, path: str, **headers: str
) -> tuple[int, Message, bytes]:  # any body, not only JSON
    host, port = server.address
    request = urllib.request.Request(f"http://{host}:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.headers, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


SECURITY = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
}


@pytest.fixture
def server() -> Iterator[AdminServer]:
    server = AdminServer("127.0.0.1", 0, lambda: status(p2p(3), pubsub(2)))
    server.start()
    yield server
    server.close()


@pytest.mark.parametrize(
    ("path", "name", "kind"),
    [
        ("/", "index.html", "text/html; charset=utf-8"),
        ("/static/dashboard.js", "dashboard.js", "text/javascript; charset=utf-8"),
        ("/static/dashboard.css", "dashboard.css", "text/css; charset=utf-8"),
    ],
)
def test_the_dashboards_files_are_served_with_their_type_and_security_headers(
    server: AdminServer, path: str, name: str, kind: str
) -> None:
    code, headers, body = fetch(server, path)
    assert (code, headers["Content-Type"]) == (200, kind)
    assert body == (STATIC / name).read_bytes()
    assert {key: headers[key] for key in SECURITY} == SECURITY
    policy = headers["Content-Security-Policy"]
    for directive in ("default-src 'self'", "script-src 'self'", "frame-ancestors 'none'"):
        assert directive in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy


@pytest.mark.parametrize("path", ["/?from=bookmark", "/static/dashboard.js?v=2"])
def test_the_page_and_its_files_refuse_parameters_rather_than_ignore_them(
    server: AdminServer, path: str
) -> None:
    code, headers, body = fetch(server, path)
    assert code == 400 and headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"error": f"{path.partition('?')[0]} takes no parameters"}


def test_the_page_loads_only_its_own_files_and_has_no_inline_script() -> None:
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    assert '<script src="/static/dashboard.js" defer></script>' in page
    assert page.count("<script") == 1
    assert "http://" not in page and "https://" not in page  # no CDN
    assert " style=" not in page and "<style" not in page
    assert set(STATIC_FILES) == {p.name for p in STATIC.iterdir()}
    script = (STATIC / "dashboard.js").read_text(encoding="utf-8")
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script


@pytest.mark.parametrize(
    "path", ["/static/", "/static/nonesuch.js", "/static/../server.py", "/index.html", "/static"]
)
def test_nothing_else_is_served_from_the_package(server: AdminServer, path: str) -> None:
    code, headers, body = fetch(server, path)
    assert (code, headers["Content-Type"]) == (404, "application/json")
    assert json.loads(body)["pages"] == ["/", "/status", "/flow", "/metrics"]


def test_the_json_pages_take_the_dashboards_parameters(server: AdminServer) -> None:
    code, _, body = fetch(server, "/flow?sort=name&order=desc&limit=2&filter=Q")
    page = json.loads(body)
    assert code == 200
    assert [d["name"] for d in page["destinations"]] == ["/queue/q00002", "/queue/q00001"]
    assert (page["destinations_not_shown"], page["destinations_matching"]) == (3, 3)
    code, _, body = fetch(server, "/flow?sort=size")
    assert code == 400 and json.loads(body)["error"].startswith("sort must be one of name,")
    code, _, body = fetch(server, "/status?limit=0")
    workers = json.loads(body)["workers"]
    assert code == 200
    assert [w["stats"]["destinations"] for w in workers] == [[], []]
    assert [w["stats"]["destinations_not_shown"] for w in workers] == [3, 2]
    code, _, body = fetch(server, "/status?sort=name")
    assert (code, json.loads(body)) == (
        400,
        {"error": "unknown parameter 'sort' (offset and limit are known)"},
    )


def test_the_page_is_behind_the_host_check_and_the_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its refusals are logged collapsed per kind: a collapser of its own, so that they
    # do not hide another test's.
    monkeypatch.setattr(logs, "_collapser", Collapser())
    fast = {"n": 2**4, "r": 1}
    users = {
        "root": User("root", hash_password("r00t", **fast), ("admin",)),
        "alice": User("alice", hash_password("s3cret", **fast), ("producers",)),
    }
    server = AdminServer(
        "127.0.0.1", 0, lambda: status(p2p(1)), allowed_names("127.0.0.1", ""), users
    )
    server.start()
    try:
        for path in ("/", "/static/dashboard.js"):
            code, headers, body = fetch(server, path)
            # A browser asks for a user and password on this answer.
            assert (code, headers["WWW-Authenticate"]) == (
                401,
                'Basic realm="mpbroker", charset="UTF-8"',
            )
            assert headers["Content-Type"] == "application/json"
            assert b"<html" not in body
            alice = fetch(server, path, Authorization=authorization("alice", "s3cret"))
            assert alice[0] == 403
            code, headers, _ = fetch(server, path, Authorization=authorization("root", "r00t"))
            assert code == 200 and headers["Content-Type"].startswith("text/")
            # The Host check comes first: a rebinding page gets neither the page nor a prompt.
            code, headers, _ = fetch(server, path, Host="evil.example")
            assert code == 403 and "WWW-Authenticate" not in headers
    finally:
        server.close()


def test_worker_status_memory_is_optional_in_the_json() -> None:
    worker = WorkerStatus(
        title="p2p 0",
        role="p2p",
        index=0,
        state="ready",
        pid=5,
        incarnation=0,
        heartbeat_age_ms=1,
        stats=None,
        memory_bytes=123,
    )
    assert json.loads(mpbroker.admin.encode(worker))["memory_bytes"] == 123
