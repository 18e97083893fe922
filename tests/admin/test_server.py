"""The admin server's pages: every destination gathered over the workers, paged on demand,
with honest counts of what a page leaves out; snapshots of any size read back."""

from __future__ import annotations

import errno
import http.client
import itertools
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mpbroker import logs
from mpbroker.admin import (
    ConsumerRow,
    DurableRow,
    FlowView,
    GatewayStats,
    QueueRow,
    QueueWorkerStats,
    ReplayStats,
    StatusView,
    TopicRow,
    TopicWorkerStats,
    WorkerStats,
    WorkerStatus,
    decode,
    encode,
    waiting_of,
    with_durable_backlogs,
    without_details,
)
from mpbroker.admin.access import authorization
from mpbroker.admin.server import (
    LOCAL_NAMES,
    AdminServer,
    BadRequest,
    Selection,
    allowed_names,
    flow_view,
    host_allowed,
    host_name,
    page_of,
    status_view,
)
from mpbroker.logs import Collapser
from mpbroker.security import User, hash_password
from mpbroker.shm import ControlBlock, StatsBlock, remove_instance, segment_name
from mpbroker.workers._base import publish
from tests.http import ask as ask_url

_counter = itertools.count()
_replace = msgspec.structs.replace


@pytest.fixture
def instance() -> Iterator[str]:
    """A broker instance of this test's own; its entries are removed at the end."""
    name = f"{os.getpid()}a{next(_counter)}"
    yield name
    remove_instance(name)


def queue(name: str) -> QueueRow:
    return QueueRow(name=name, waiting=1, unacknowledged=0, consumers=0, stores={})


def topic(name: str) -> TopicRow:
    return TopicRow(
        name=name,
        subscribers=1,
        deepest_backlog=0,
        live_msg_high=5000,
        live_msg_low=4000,
        stopped="",
        stores={},
    )


def consumer(destination: str) -> ConsumerRow:
    return ConsumerRow(
        destination=destination,
        subscription="s",
        gateway=0,
        connection=1,
        ack="auto",
        unacknowledged=0,
        prefetch=10,
        unacknowledged_bytes=0,
        window_bytes=-1,
        backlog=0,
        ready="yes",
    )


def p2p(queues: int) -> QueueWorkerStats:
    names = [f"/queue/q{n:05d}" for n in range(queues)]
    return QueueWorkerStats(
        title="p2p 0",
        pid=2,
        at_ms=0,
        received=0,
        delivered=0,
        destinations=[queue(name) for name in names],
        destinations_not_shown=0,
        stores={},
        consumers=[consumer(name) for name in names[:2]],
        consumers_not_shown=0,
    )


def pubsub(topics: int) -> TopicWorkerStats:
    names = [f"/topic/t{n:05d}" for n in range(topics)]
    return TopicWorkerStats(
        title="pubsub 0",
        pid=3,
        at_ms=0,
        received=0,
        delivered=0,
        destinations=[topic(name) for name in names],
        destinations_not_shown=0,
        stores={},
        consumers=[consumer(name) for name in names],
        consumers_not_shown=0,
        durable_subscriptions=[DurableRow(name="c/d", topic=names[0], state="live")],
    )


def status(*stats: WorkerStats) -> StatusView:
    return StatusView(
        at_ms=1,
        workers=[
            WorkerStatus(
                title=s.title,
                role="x",
                index=0,
                state="ready",
                pid=s.pid,
                incarnation=0,
                heartbeat_age_ms=0,
                stats=s,
            )
            for s in stats
        ],
    )


def test_flow_lists_every_destination_of_every_worker_and_names_its_worker() -> None:
    view = flow_view(status(p2p(3000), pubsub(2000)))
    assert len(view.destinations) == 5000
    assert (view.destinations[0].name, view.destinations[0].worker) == ("/queue/q00000", "p2p 0")
    assert (view.destinations[-1].name, view.destinations[-1].worker) == (
        "/topic/t01999",
        "pubsub 0",
    )
    assert len(view.consumers) == 2002
    assert view.consumers[-1].worker == "pubsub 0"
    assert view.durable_subscriptions[0].worker == "pubsub 0"
    assert (
        view.destinations_not_shown,
        view.consumers_not_shown,
        view.durable_subscriptions_not_shown,
    ) == (0, 0, 0)


def test_a_topic_s_backlog_counts_what_its_durable_subscriptions_owe() -> None:
    """Persistent messages stored for a durable subscriber that is away are in no live
    buffer: the replay worker counts them (`backlogs`), and the admin API adds the deepest
    such backlog to its topic's row, so /flow sorts and pages by it."""
    stats = _replace(
        pubsub(3),
        destinations=[
            _replace(topic("/topic/t00000"), deepest_backlog=5),
            _replace(topic("/topic/t00001"), deepest_backlog=1),
            topic("/topic/t00002"),
        ],
        durable_subscriptions=[
            # away: 7 stored, 1 kept in memory (that one is in the live buffer too)
            DurableRow(name="a/x", topic="/topic/t00001", state="inactive", kept=1),
            DurableRow(name="b/x", topic="/topic/t00001", state="live"),  # 2 stored
            DurableRow(name="c/x", topic="/topic/t00002", state="inactive"),  # owes none
        ],
    )
    replay = ReplayStats(
        title="replay 0",
        pid=4,
        at_ms=0,
        replaying=[],
        waiting_for_a_place=[],
        in_flight_bytes=0,
        batches=0,
        messages=0,
        backlogs={"a/x": 7, "b/x": 2},
    )
    before = status(p2p(0), stats, replay)
    assert [d.durable_backlog for d in flow_view(before).destinations] == [0, 0, 0]
    joined = with_durable_backlogs(before)
    view = flow_view(joined)
    assert [d.durable_backlog for d in view.destinations] == [0, 8, 0]
    assert [waiting_of(d) for d in view.destinations] == [5, 8, 0]
    # The deepest backlogs first: the topic whose durable subscriber is away leads.
    for key in ("backlog", "waiting"):
        view = flow_view(joined, selection=Selection(sort=key, descending=True))
        assert [d.name for d in view.destinations] == [
            "/topic/t00001",
            "/topic/t00000",
            "/topic/t00002",
        ], key
    # In the JSON where there is one; left out (0) where there is none.
    rows = json.loads(encode(view))["destinations"]
    assert [row.get("durable_backlog") for row in rows] == [8, None, None]


def test_a_page_shows_its_slice_of_each_list_and_counts_the_rest() -> None:
    whole = status(p2p(3), pubsub(4))
    view = flow_view(whole, (2, 3))
    assert [d.name for d in view.destinations] == [
        "/queue/q00002",
        "/topic/t00000",
        "/topic/t00001",
    ]
    assert [d.worker for d in view.destinations] == ["p2p 0", "pubsub 0", "pubsub 0"]
    assert view.destinations_not_shown == 4
    assert [c.destination for c in view.consumers] == [
        "/topic/t00000",
        "/topic/t00001",
        "/topic/t00002",
    ]
    assert view.consumers_not_shown == 3
    assert (view.durable_subscriptions, view.durable_subscriptions_not_shown) == ([], 1)
    # Past the end: nothing, everything counted.
    empty = flow_view(whole, (100, None))
    assert (empty.destinations, empty.destinations_not_shown) == ([], 7)
    # Every page together is the whole list, in order.
    pages = [flow_view(whole, (n, 2)).destinations for n in range(0, 7, 2)]
    assert [d.name for page in pages for d in page] == [
        d.name for d in flow_view(whole).destinations
    ]


def test_rows_a_worker_could_not_publish_are_counted_too() -> None:
    view = flow_view(status(without_details(p2p(5), "no room"), pubsub(1)))
    assert [d.name for d in view.destinations] == ["/topic/t00000"]
    assert (view.destinations_not_shown, view.consumers_not_shown) == (5, 2)


@pytest.mark.parametrize(
    ("query", "page"),
    [
        ({}, (0, None)),
        ({"offset": ["10"]}, (10, None)),
        ({"limit": ["0"]}, (0, 0)),
        ({"offset": ["1"], "limit": ["5"]}, (1, 5)),
    ],
)
def test_paging_parameters(query: dict[str, list[str]], page: tuple[int, int | None]) -> None:
    assert page_of(query) == page


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ({"limit": ["ten"]}, "limit must be a whole number, not 'ten'"),
        ({"offset": ["-1"]}, "offset must be 0 or more, not -1"),
        ({"offset": [""]}, "offset must be a whole number, not ''"),
        ({"page": ["2"]}, "unknown parameter 'page'"),
        ({"limit": ["5", "10"]}, "parameter 'limit' given more than once"),
    ],
)
def test_bad_paging_parameters_are_refused(query: dict[str, list[str]], error: str) -> None:
    with pytest.raises(BadRequest, match=error):
        page_of(query)


def test_status_reads_snapshots_larger_than_their_stats_block(instance: str) -> None:
    control = ControlBlock.create(segment_name(instance, "control"), 2)
    blocks = {
        slot: StatsBlock.create(segment_name(instance, f"stats-{slot}"), 4096) for slot in (0, 1)
    }
    try:
        gateway = GatewayStats(
            title="gateway 0", pid=1, at_ms=0, connections=0, stopped_producers=[], stops_known=0
        )
        publish(blocks[0], gateway)
        big = p2p(2000)
        publish(blocks[1], big)  # about 200 KB: in the spill file
        assert blocks[1].spill_path.exists()
        view = status_view(
            control, blocks, [("gateway 0", "gateway", 0, 0), ("p2p 0", "p2p", 0, 1)]
        )
        assert [w.stats for w in view.workers] == [gateway, big]
        assert [w.stats_error for w in view.workers] == [None, None]
    finally:
        for block in blocks.values():
            block.close()
            block.unlink()
        control.close()
        control.unlink()


def test_a_snapshot_that_cannot_be_published_is_replaced_by_its_figures(
    instance: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = StatsBlock.create(segment_name(instance, "stats-0"), 4096)
    try:

        def no_room(fd: int, data: object) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", no_room)  # the spill file cannot be written
        big = p2p(2000)
        publish(block, big)
        monkeypatch.undo()
        shown = decode(block.read(), QueueWorkerStats)
        size = len(encode(msgspec.structs.replace(big, publish_ms=None)))
        assert shown.error == f"state of {size} bytes cannot be published: No space left on device"
        assert (shown.destinations, shown.destinations_not_shown) == ([], 2000)
        assert (shown.consumers, shown.consumers_not_shown) == ([], 2)
    finally:
        block.close()
        block.unlink()


def get(server: AdminServer, path: str, host_header: str | None = None) -> tuple[int, Any]:
    host, port = server.address
    request = urllib.request.Request(f"http://{host}:{port}{path}")
    if host_header is not None:
        request.add_header("Host", host_header)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_the_server_pages_flow_and_refuses_bad_parameters() -> None:
    server = AdminServer("127.0.0.1", 0, lambda: status(p2p(3), pubsub(2)))
    server.start()
    try:
        code, page = get(server, "/flow?offset=1&limit=2")
        assert code == 200
        flow = decode(json.dumps(page), FlowView)
        assert [d.name for d in flow.destinations] == ["/queue/q00001", "/queue/q00002"]
        assert flow.destinations_not_shown == 3
        code, whole = get(server, "/flow")
        assert (code, len(whole["destinations"]), whole["destinations_not_shown"]) == (200, 5, 0)
        assert get(server, "/flow?limit=x") == (
            400,
            {"error": "limit must be a whole number, not 'x'"},
        )
        code, _ = get(server, "/status")
        assert code == 200
    finally:
        server.close()


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost:8161", "localhost"),
        ("LOCALHOST", "localhost"),
        ("127.0.0.1:8161", "127.0.0.1"),
        ("[::1]:8161", "::1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("broker.example:80", "broker.example"),
    ],
)
def test_the_name_in_a_host_header(header: str, name: str) -> None:
    assert host_name(header) == name


def test_the_names_an_admin_api_answers_to() -> None:
    assert allowed_names("127.0.0.1", "") == LOCAL_NAMES
    assert allowed_names("0.0.0.0", "") == LOCAL_NAMES  # a wildcard is no name
    names = allowed_names("10.0.0.5", " Broker.Example , mq ")
    assert names == LOCAL_NAMES | {"10.0.0.5", "broker.example", "mq"}
    assert host_allowed("mq:8161", names) and host_allowed(None, names)
    assert not host_allowed("evil.example:8161", names)


def test_a_request_for_another_host_name_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    """DNS rebinding: a page on evil.example points that name at 127.0.0.1; the browser's
    request then says Host: evil.example."""
    server = AdminServer("127.0.0.1", 0, lambda: status(p2p(1)), allowed_names("127.0.0.1", "mq"))
    server.start()
    try:
        port = server.address[1]
        assert get(server, "/status", f"evil.example:{port}") == (
            403,
            {
                "error": f"Host 'evil.example:{port}' is not a name of this admin API "
                "(admin.host_names)"
            },
        )
        assert get(server, "/status", f"mq:{port}")[0] == 200
        assert get(server, "/status", f"localhost:{port}")[0] == 200
        assert get(server, "/status")[0] == 200  # urllib names the address it connects to
    finally:
        server.close()
    assert any(
        "refused a request from 127.0.0.1 for Host evil.example" in r.getMessage()
        for r in caplog.records
    )


def ask(server: AdminServer, path: str, **headers: str) -> tuple[int, Message, Any]:
    """Status, headers and JSON body of a GET with these headers."""
    host, port = server.address
    return ask_url(f"http://{host}:{port}{path}", **headers)


def test_with_users_only_a_user_in_group_admin_reads_the_pages(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Refusals are collapsed per kind: start from a clean slate, whatever ran before.
    monkeypatch.setattr(logs, "_collapser", Collapser())
    fast = {"n": 2**4, "r": 1}
    users = {
        "root": User("root", hash_password("r00t", **fast), ("admin",)),
        "alice": User("alice", hash_password("s3cret", **fast), ("producers",)),
    }
    server = AdminServer("127.0.0.1", 0, lambda: status(p2p(2)), users=users)
    server.start()
    challenge = 'Basic realm="mpbroker", charset="UTF-8"'
    try:
        code, headers, body = ask(server, "/status")
        assert (code, headers["WWW-Authenticate"], headers["Content-Type"]) == (
            401,
            challenge,
            "application/json",
        )
        assert body == {
            "error": "authentication required: HTTP Basic credentials of a user in group 'admin'"
        }
        # Without credentials, not even which pages there are.
        assert ask(server, "/nonesuch")[0] == 401
        wrong = ask(server, "/status", Authorization=authorization("root", "guess"))
        unknown = ask(server, "/flow", Authorization=authorization("mallory", "r00t"))
        for code, headers, body in (wrong, unknown):
            assert (code, headers["WWW-Authenticate"], body) == (
                401,
                challenge,
                {"error": "authentication failed"},
            )
        malformed = ask(server, "/status", Authorization="Basic !!!")
        assert (malformed[0], malformed[2]) == (
            401,
            {"error": "malformed Authorization header: the credentials are not base64"},
        )
        code, headers, body = ask(server, "/status", Authorization=authorization("alice", "s3cret"))
        assert (code, body) == (403, {"error": "user 'alice' is not in group 'admin'"})
        assert "WWW-Authenticate" not in headers  # other credentials would not help alice
        admin = authorization("root", "r00t")
        code, _, page = ask(server, "/status", Authorization=admin)
        assert (code, [w["title"] for w in page["workers"]]) == (200, ["p2p 0"])
        code, _, page = ask(server, "/flow?limit=1", Authorization=admin)
        assert (code, page["destinations_not_shown"]) == (200, 1)
        assert ask(server, "/nonesuch", Authorization=admin)[0] == 404
        # The Host header is checked first: a rebinding page never sees a credentials prompt.
        code, headers, _ = ask(server, "/status", Host="evil.example")
        assert code == 403 and "WWW-Authenticate" not in headers
        # SIGHUP read the users again: the new password gets in, the old one (remembered
        # a moment ago) no longer does.
        server.use_users({"root": User("root", hash_password("n3w", **fast), ("admin",))})
        assert ask(server, "/status", Authorization=admin)[0] == 401
        assert ask(server, "/status", Authorization=authorization("root", "n3w"))[0] == 200
    finally:
        server.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "mpbroker.admin"]
    for expected in (
        "admin: refused a request from 127.0.0.1: authentication required: HTTP Basic "
        "credentials of a user in group 'admin' (HTTP 401)",
        "admin: refused a request from 127.0.0.1 by 'root': authentication failed (HTTP 401)",
        "admin: refused a request from 127.0.0.1: malformed Authorization header: the "
        "credentials are not base64 (HTTP 401)",
        "admin: refused a request from 127.0.0.1 by 'alice': user 'alice' is not in group "
        "'admin' (HTTP 403)",
    ):
        assert expected in lines, lines
    # The second failed password from the same address within 10 s is only counted...
    assert not any("mallory" in line for line in lines)
    # ... and no password is ever logged.
    assert not any(word in line for line in lines for word in ("r00t", "guess", "s3cret", "n3w"))


def test_anything_but_get_and_head_is_refused_in_json() -> None:
    server = AdminServer("127.0.0.1", 0, lambda: status(p2p(2)))
    server.start()
    try:
        host, port = server.address
        request = urllib.request.Request(f"http://{host}:{port}/status", method="POST", data=b"")
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        assert caught.value.code == 405
        assert caught.value.headers["Allow"] == "GET, HEAD"
        assert json.load(caught.value) == {
            "error": "POST not allowed: the admin API is read-only (GET, HEAD)"
        }
    finally:
        server.close()


@pytest.mark.parametrize(
    "method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT", "PROPFIND"]
)
def test_every_method_not_served_is_a_json_405_with_allow(method: str) -> None:
    """OPTIONS and TRACE got BaseHTTPRequestHandler's HTML 501; every method but GET and
    HEAD gets the documented JSON 405, over real HTTP."""
    server = AdminServer("127.0.0.1", 0, lambda: status(p2p(2)))
    server.start()
    try:
        code, headers, body = request(server, method, "/status")
        assert (code, headers["Allow"], headers["Content-Type"]) == (
            405,
            "GET, HEAD",
            "application/json",
        )
        assert json.loads(body) == {
            "error": f"{method} not allowed: the admin API is read-only (GET, HEAD)"
        }
        assert request(server, "GET", "/status")[0] == 200  # and it serves on
    finally:
        server.close()


def request(
    server: AdminServer, method: str, path: str, **headers: str
) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (but Date and Server, which say when and who) and the bytes of the
    body of one request, read off the socket: nothing after the headers for HEAD."""
    host, port = server.address
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request(method, path, headers=headers)
        reply = conn.getresponse()
        # HEAD: http.client would not read a body; whatever the server sent is on the socket.
        body = reply.read() if method != "HEAD" else reply.fp.read() if reply.fp else b""
        kept = {k: v for k, v in reply.getheaders() if k not in ("Date", "Server")}
        return reply.status, kept, body
    finally:
        conn.close()


def test_head_is_answered_as_get_without_the_body() -> None:
    """curl -I and uptime probes: the status and headers of a GET (its Content-Length
    too), behind the same Host check and credentials, and no body."""
    fast = {"n": 2**4, "r": 1}
    users = {"root": User("root", hash_password("r00t", **fast), ("admin",))}
    server = AdminServer("127.0.0.1", 0, lambda: status(p2p(2), pubsub(1)), users=users)
    server.start()
    admin = {"Authorization": authorization("root", "r00t")}
    try:
        for path, headers, code in [
            ("/metrics", admin, 200),
            ("/", admin, 200),
            ("/static/dashboard.js", admin, 200),
            ("/flow?limit=1", admin, 200),
            ("/flow?sort=size", admin, 400),
            ("/nonesuch", admin, 404),
            ("/metrics", {}, 401),
            ("/metrics", {**admin, "Host": "evil.example"}, 403),
        ]:
            got, got_headers, got_body = request(server, "GET", path, **headers)
            head, head_headers, head_body = request(server, "HEAD", path, **headers)
            assert (got, head) == (code, code), path
            assert head_headers == got_headers, path
            assert int(head_headers["Content-Length"]) == len(got_body) > 0, path
            assert head_body == b"", path
    finally:
        server.close()


THREADS_DECODING = """
import sys, threading
sys.setswitchinterval(1e-6)  # switch threads as often as possible: the race shows
from mpbroker.admin import WorkerStats, decode, encode
from tests.admin.test_server import p2p, pubsub
samples = [encode(p2p(3)), encode(pubsub(3))]
start = threading.Barrier(8)
def work(i):
    start.wait()
    for _ in range(20):
        decode(samples[i % 2], WorkerStats)
threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print("ok")
"""


def test_stats_are_decoded_from_many_threads_at_once_in_a_new_process() -> None:
    """The admin API decodes worker stats in a thread per request; msgspec learning a type
    in two threads at once crashed the supervisor (SIGSEGV in msgspec's _core). Before the
    decoders were made once under a lock, 11 of 20 of these processes crashed."""
    root = Path(__file__).resolve().parents[2]
    for _ in range(10):
        run = subprocess.run(
            [sys.executable, "-c", THREADS_DECODING],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (run.returncode, run.stdout.strip()) == (0, "ok"), run.stderr[-2000:]
