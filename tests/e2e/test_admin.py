"""The admin API and `mpbroker admin`: workers, and flow control as it is now."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from mpbroker.client import connect
from mpbroker.harness import BrokerProcess, RawClient
from mpbroker.stomp import Frame, encode_frame
from tests.e2e._admin import eventually, get

RawFactory = Callable[[BrokerProcess], RawClient]

pytestmark = pytest.mark.slow


def test_status_lists_every_worker_ready(broker: BrokerProcess) -> None:
    status = get(broker, "/status")
    titles = {w["title"]: w for w in status["workers"]}
    assert {"gateway 0", "p2p 0", "pubsub 0", "replay 0"} <= set(titles)
    assert all(w["state"] == "ready" and w["pid"] > 0 for w in titles.values())


@pytest.mark.parametrize("method", ["OPTIONS", "TRACE", "PATCH", "CONNECT", "BREW"])
def test_a_method_the_api_does_not_serve_is_a_json_405(broker: BrokerProcess, method: str) -> None:
    """Not the HTML 501 OPTIONS and TRACE used to get: the documented JSON 405 with Allow
    (docs/operations.md, the admin API)."""
    conn = http.client.HTTPConnection("127.0.0.1", broker.admin_port, timeout=10)
    try:
        conn.request(method, "/status")
        reply = conn.getresponse()
        assert (reply.status, reply.getheader("Allow")) == (405, "GET, HEAD")
        assert reply.getheader("Content-Type") == "application/json"
        assert json.loads(reply.read()) == {
            "error": f"{method} not allowed: the admin API is read-only (GET, HEAD)"
        }
    finally:
        conn.close()


def test_flow_shows_a_full_consumer_not_ready_and_a_held_producer(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = "[vol_queue_store]\nmsg_high = 3\nmsg_low = 1\n[flow]\nsend_timeout_ms = 60000\n"
    broker = start_broker("--gateways", "1", config=config)
    consumer = raw(broker)
    consumer.connect()
    consumer.send(
        "SUBSCRIBE",
        {
            "destination": "/queue/watched",
            "id": "w",
            "ack": "client",
            "activemq.prefetchSize": "1",
        },
    )
    producer = raw(broker)
    producer.connect()
    for n in range(3):
        producer.send("SEND", {"destination": "/queue/watched", "receipt": str(n)}, b"x")
        assert producer.recv().command == "RECEIPT"
    producer.send("SEND", {"destination": "/queue/watched", "receipt": "held"}, b"x")

    def consumers() -> list[dict[str, Any]]:
        flow = get(broker, "/flow")
        return [c for c in flow["consumers"] if c["destination"] == "/queue/watched"]

    (row,) = eventually(consumers)
    assert (row["subscription"], row["unacknowledged"], row["prefetch"], row["ready"]) == (
        "w",
        1,
        1,
        "no",
    )
    flow = eventually(lambda: (f := get(broker, "/flow"))["stopped_producers"] and f)
    (held,) = flow["stopped_producers"]
    assert (held["destination"], held["limit"], held["store"]) == (
        "/queue/watched",
        "msg_high 3",
        "vol_queue_store",
    )
    (queue,) = [d for d in flow["destinations"] if d["name"] == "/queue/watched"]
    store = queue["stores"]["vol_queue_store"]
    assert (store["messages"], store["msg_high"], store["msg_low"], store["stopped"]) == (
        3,
        3,
        1,
        "msg_high 3",
    )
    # The command line shows the same, as text.
    out = subprocess.run(
        [sys.executable, "-m", "mpbroker", "admin", "flow", "--port", str(broker.admin_port)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert "/queue/watched" in out and "msg_high 3" in out
    # ... ready "no", then its selector ("-": none).
    assert any(
        line.split()[-2:] == ["no", "-"] for line in out.splitlines() if line.startswith("/queue")
    )


def test_admin_command_says_when_no_broker_answers() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mpbroker", "admin", "status", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert "cannot reach the admin API at http://127.0.0.1:1/status" in done.stderr


def test_flow_shows_what_a_topic_holds_for_durable_subscribers(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1")
    durable = {"activemq.subscriptionName": "d"}
    for client_id in ("app", "audit"):
        with connect(broker.host, broker.port, client_id=client_id) as conn:
            conn.subscribe("/topic/kept", headers=durable, receipt=True)
    producer = raw(broker)
    producer.connect()
    for n in range(3):
        producer.send(
            "SEND",
            {"destination": "/topic/kept", "persistent": "true", "receipt": str(n)},
            b"x" * 10,
        )
        assert producer.recv().command == "RECEIPT"
    # One non-persistent message, kept in memory for each of them, and a queue of 2.
    producer.send("SEND", {"destination": "/topic/kept", "receipt": "np"}, b"y")
    assert producer.recv().command == "RECEIPT"
    for n in range(2):
        producer.send("SEND", {"destination": "/queue/shallow", "receipt": f"q{n}"}, b"z")
        assert producer.recv().command == "RECEIPT"

    def row_of(flow: dict[str, Any]) -> dict[str, Any]:
        # ({} until its worker published it)
        return next((d for d in flow["destinations"] if d["name"] == "/topic/kept"), {})

    def owed(messages: int) -> Callable[[], dict[str, Any] | None]:
        """A check for `eventually`: the topic's row once its durable backlog (0: left out
        of the JSON) is `messages`. The replay worker counts the stored ones every 5 s."""

        def check() -> dict[str, Any] | None:
            row = row_of(get(broker, "/flow"))
            return row if row and row.get("durable_backlog", 0) == messages else None

        return check

    row = eventually(owed(4), timeout=20)
    # Each message stored once for both subscriptions; the live buffer holds only the
    # non-persistent one; the deepest durable backlog is 3 stored and 1 kept, not the sum
    # over both subscriptions, nor the kept one twice.
    assert row["stores"]["topic_store"]["messages"] == 3
    assert (row["deepest_backlog"], row["subscribers"], row["stopped"]) == (1, 0, "")
    # The deepest backlogs first: the topic (4) before the queue (2).
    for key in ("backlog", "waiting"):
        top = get(broker, f"/flow?sort={key}&limit=2")["destinations"]
        assert [d["name"] for d in top] == ["/topic/kept", "/queue/shallow"], key
    flow = get(broker, "/flow")
    assert {d["name"]: d["state"] for d in flow["durable_subscriptions"]} == {
        "app/d": "inactive",
        "audit/d": "inactive",
    }
    [replay] = [w for w in get(broker, "/status")["workers"] if w["role"] == "replay"]
    assert replay["stats"]["backlogs"] == {"app/d": 3, "audit/d": 3}
    # Both come back and take what they owe: the topic owes nothing any more.
    for client_id in ("app", "audit"):
        with connect(broker.host, broker.port, client_id=client_id) as conn:
            sub = conn.subscribe("/topic/kept", ack="client-individual", headers=durable)
            for _ in range(4):
                message = sub.get(timeout=10)
                assert message is not None
                conn.ack(message, receipt=True)
    row = eventually(owed(0), timeout=20)
    assert "durable_backlog" not in row and row["deepest_backlog"] == 0


def test_flow_lists_thousands_of_destinations_and_pages_them(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1")
    queues = {f"/queue/many.{n:04d}" for n in range(1000)}
    topics = {f"/topic/many.{n:04d}" for n in range(1000)}
    producer = raw(broker)
    producer.connect()
    subscriber = raw(broker)
    subscriber.connect()
    # Pipelined, one receipt at the end: a message in each queue, a subscriber on each topic.
    producer.send_bytes(
        b"".join(encode_frame(Frame("SEND", {"destination": q}, b"x")) for q in sorted(queues))
    )
    producer.send("SEND", {"destination": "/queue/many.0000", "receipt": "sent"}, b"x")
    subscriber.send_bytes(
        b"".join(
            encode_frame(Frame("SUBSCRIBE", {"destination": t, "id": t})) for t in sorted(topics)
        )
    )
    subscriber.send(
        "SUBSCRIBE", {"destination": "/topic/many.0000", "id": "last", "receipt": "subscribed"}
    )
    assert producer.recv().headers["receipt-id"] == "sent"
    assert subscriber.recv().headers["receipt-id"] == "subscribed"

    def listed() -> dict[str, Any] | None:
        flow = get(broker, "/flow")
        names = {d["name"] for d in flow["destinations"]}
        return flow if names >= queues | topics else None

    flow = eventually(listed, timeout=30)
    # Far more than admin.stats_bytes (256 KiB) holds: the workers' snapshots spilled.
    assert len(flow["destinations"]) == 2000 and flow["destinations_not_shown"] == 0
    assert len(flow["consumers"]) == 1001 and flow["consumers_not_shown"] == 0
    status = get(broker, "/status")
    for worker in status["workers"]:
        stats = worker["stats"]
        assert "error" not in stats, stats["error"]
        if worker["role"] in ("p2p", "pubsub"):
            assert stats["destinations_not_shown"] == 0
    # Paged: the pages together are the whole list, and each counts what it leaves out.
    pages = [get(broker, f"/flow?offset={n}&limit=700") for n in (0, 700, 1400)]
    assert [len(p["destinations"]) for p in pages] == [700, 700, 600]
    assert [p["destinations_not_shown"] for p in pages] == [1300, 1300, 1400]
    assert [d["name"] for p in pages for d in p["destinations"]] == [
        d["name"] for d in get(broker, "/flow")["destinations"]
    ]
