"""`GET /metrics`: the status in the Prometheus text format, read back with the reference
client's own parser; the cap on per-destination series, and what it adds up as "other"."""

from __future__ import annotations

import urllib.request

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from mpbroker.admin import (
    DurableRow,
    GatewayStats,
    HeldSend,
    MemoryLevel,
    MemoryStatus,
    QueueRow,
    QueueWorkerStats,
    ReplayStats,
    StatusView,
    StoreFigures,
    TopicRow,
    TopicWorkerStats,
    WorkerStats,
    WorkerStatus,
    with_durable_backlogs,
)
from mpbroker.admin.access import authorization
from mpbroker.admin.metrics import CONTENT_TYPE, OTHER, SeriesCap, exposition
from mpbroker.admin.server import AdminServer
from mpbroker.security import User, hash_password
from tests.http import ask as ask_url

# -- the cap ---------------------------------------------------------------------------------


def test_the_cap_keeps_the_first_names_for_as_long_as_they_exist() -> None:
    cap = SeriesCap(2)
    assert cap.admit(["/queue/b", "/queue/c", "/queue/a"]) == {"/queue/a", "/queue/b"}
    # A new name that sorts first does not take a kept name's place...
    assert cap.admit(["/queue/0", "/queue/a", "/queue/b"]) == {"/queue/a", "/queue/b"}
    # ... a name gone frees one.
    assert cap.admit(["/queue/0", "/queue/b", "/queue/c"]) == {"/queue/0", "/queue/b"}
    assert SeriesCap(0).admit(["/queue/a"]) == set()


@given(st.lists(st.sets(st.sampled_from([f"/queue/{n}" for n in range(12)])), max_size=8))
def test_the_cap_is_never_passed_and_kept_names_stay_kept(rounds: list[set[str]]) -> None:
    cap = SeriesCap(5)
    before: set[str] = set()
    for names in rounds:
        kept = cap.admit(names)
        assert kept <= names
        assert len(kept) == min(5, len(names))
        assert before & names <= kept
        before = kept


# -- what a scrape says ----------------------------------------------------------------------


def figures(messages: int, nbytes: int, stopped: str = "") -> StoreFigures:
    return StoreFigures(
        messages=messages,
        bytes=nbytes,
        msg_high=100,
        msg_low=50,
        byte_high=-1,
        byte_low=-1,
        stopped=stopped,
    )


def queue_row(name: str, waiting: int, **totals: int) -> QueueRow:
    return QueueRow(
        name=name,
        waiting=waiting,
        unacknowledged=1,
        consumers=2,
        stores={"vol_queue_store": figures(waiting + 1, 10 * (waiting + 1))},
        **totals,
    )


def worker(stats: WorkerStats, role: str, incarnation: int = 0) -> WorkerStatus:
    return WorkerStatus(
        title=stats.title,
        role=role,
        index=0,
        state="ready",
        pid=stats.pid,
        incarnation=incarnation,
        heartbeat_age_ms=250,
        stats=stats,
        memory_bytes=20 * 2**20,
    )


def broker_status(queues: list[QueueRow]) -> StatusView:
    gateway = GatewayStats(
        title="gateway 0",
        pid=10,
        at_ms=1000,
        connections=3,
        stopped_producers=[
            HeldSend(
                peer="127.0.0.1:1",
                destination="/queue/a",
                limit="msg_high 100",
                store="vol_queue_store",
                waiting_ms=5,
            )
        ],
        stops_known=1,
        connections_accepted=7,
        connections_refused={"max_connections": 2, "authentication": 1},
        frames_in=40,
        frames_out=41,
    )
    p2p = QueueWorkerStats(
        title="p2p 0",
        pid=11,
        at_ms=1000,
        received=30,
        delivered=20,
        destinations=queues,
        destinations_not_shown=0,
        stores={},
        consumers=[],
        consumers_not_shown=0,
    )
    pubsub = TopicWorkerStats(
        title="pubsub 0",
        pid=12,
        at_ms=1000,
        received=5,
        delivered=15,
        destinations=[
            TopicRow(
                name="/topic/t",
                subscribers=3,
                deepest_backlog=4,
                live_msg_high=10,
                live_msg_low=5,
                stopped="live_msg_high 10",
                stores={},
                unacknowledged=2,
                enqueued=5,
                dequeued=12,
                stops=1,
            )
        ],
        destinations_not_shown=0,
        stores={},
        consumers=[],
        consumers_not_shown=0,
        durable_subscriptions=[
            DurableRow(name="app/orders", topic="/topic/t", state="live", kept=0, unacknowledged=1),
            DurableRow(name="app/audit", topic="/topic/t", state="inactive", kept=3),
        ],
    )
    replay = ReplayStats(
        title="replay 0",
        pid=13,
        at_ms=1000,
        replaying=[],
        waiting_for_a_place=[],
        in_flight_bytes=0,
        batches=2,
        messages=9,
        backlogs={"app/audit": 6, "app/orders": 1},
        backlogs_at_ms=900,
    )
    memory = MemoryStatus(
        level=1,
        used_bytes=150 * 2**20,
        max_memory=256 * 2**20,
        percent=58.6,
        levels=[MemoryLevel(level=1, percent=50, gc_interval_ms=1000)],
    )
    return StatusView(
        at_ms=1500,
        workers=[
            worker(gateway, "gateway"),
            worker(p2p, "p2p", incarnation=2),
            worker(pubsub, "pubsub"),
            worker(replay, "replay"),
        ],
        memory=memory,
    )


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(status: StatusView, cap: int = 1000) -> Samples:
    """Every sample of the exposition, by (name, sorted labels), parsed by prometheus_client."""
    text = exposition(status, SeriesCap(cap), SeriesCap(cap), "9.9").decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        assert family.name.startswith("mpbroker_"), family.name
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in samples, f"{key} twice"
            samples[key] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_a_scrape_says_what_the_workers_published() -> None:
    queues = [
        queue_row("/queue/a", 4, enqueued=10, dequeued=5, expired=1, dead_lettered=2, stops=3),
        queue_row("/queue/b", 0),
    ]
    samples = scrape(broker_status(queues))
    assert value(samples, "mpbroker_build_info", version="9.9") == 1
    assert value(samples, "mpbroker_memory_used_bytes") == 150 * 2**20
    assert value(samples, "mpbroker_memory_max_bytes") == 256 * 2**20
    assert value(samples, "mpbroker_memwatch_level") == 1
    assert value(samples, "mpbroker_memwatch_level_threshold_ratio", level="1") == 0.5
    p2p = {"worker": "p2p 0", "role": "p2p"}
    assert value(samples, "mpbroker_worker_restarts_total", **p2p) == 2
    assert value(samples, "mpbroker_worker_ready", **p2p) == 1
    assert value(samples, "mpbroker_worker_heartbeat_age_seconds", **p2p) == 0.25
    assert value(samples, "mpbroker_worker_stats_age_seconds", **p2p) == 0.5
    assert value(samples, "mpbroker_worker_memory_bytes", **p2p) == 20 * 2**20
    gateway = {"worker": "gateway 0"}
    assert value(samples, "mpbroker_connections", **gateway) == 3
    assert value(samples, "mpbroker_connections_accepted_total", **gateway) == 7
    refused = "mpbroker_connections_refused_total"
    assert value(samples, refused, worker="gateway 0", reason="max_connections") == 2
    assert value(samples, refused, worker="gateway 0", reason="authentication") == 1
    assert value(samples, "mpbroker_frames_received_total", **gateway) == 40
    assert value(samples, "mpbroker_frames_sent_total", **gateway) == 41
    assert value(samples, "mpbroker_messages_received_total", worker="p2p 0", kind="queue") == 30
    delivered = "mpbroker_messages_delivered_total"
    assert value(samples, delivered, worker="pubsub 0", kind="topic") == 15
    a = {"destination": "/queue/a", "kind": "queue"}
    for name, expected in [
        ("mpbroker_destination_messages", 4),
        ("mpbroker_destination_bytes", 50),
        ("mpbroker_destination_messages_in_flight", 1),
        ("mpbroker_destination_consumers", 2),
        ("mpbroker_destination_producers_held", 1),
        ("mpbroker_destination_flow_stopped", 0),
        ("mpbroker_destination_messages_enqueued_total", 10),
        ("mpbroker_destination_messages_dequeued_total", 5),
        ("mpbroker_destination_messages_expired_total", 1),
        ("mpbroker_destination_messages_dead_lettered_total", 2),
        ("mpbroker_destination_flow_stops_total", 3),
    ]:
        assert value(samples, name, **a) == expected, name
    t = {"destination": "/topic/t", "kind": "topic"}
    assert value(samples, "mpbroker_destination_messages", **t) == 4
    assert value(samples, "mpbroker_destination_flow_stopped", **t) == 1
    assert value(samples, "mpbroker_destination_consumers", **t) == 3
    assert value(samples, "mpbroker_destination_messages_dequeued_total", **t) == 12
    # A durable subscription's backlog: what the store keeps (the replay worker's count)
    # and what memory keeps while it is away.
    audit = {"subscription": "app/audit", "topic": "/topic/t"}
    assert value(samples, "mpbroker_durable_subscription_messages", **audit) == 9
    assert value(samples, "mpbroker_durable_subscription_active", **audit) == 0
    orders = {"subscription": "app/orders", "topic": "/topic/t"}
    assert value(samples, "mpbroker_durable_subscription_messages_in_flight", **orders) == 1
    assert value(samples, "mpbroker_durable_subscription_active", **orders) == 1
    assert value(samples, "mpbroker_replay_messages_total", worker="replay 0") == 9


def test_a_topic_s_messages_count_what_its_deepest_durable_subscription_owes() -> None:
    """app/audit, away, owes 6 stored messages (the replay worker's count) and 3 kept in
    memory: 9, more than the 4 of the topic's live buffer (which holds those 3 too: the
    larger figure, not the sum). The admin API joins the replay worker's count to the
    topic's row (`with_durable_backlogs`) before a scrape reads it."""
    t = {"destination": "/topic/t", "kind": "topic"}
    assert value(scrape(broker_status([])), "mpbroker_destination_messages", **t) == 4
    samples = scrape(with_durable_backlogs(broker_status([])))
    assert value(samples, "mpbroker_destination_messages", **t) == 9
    audit = {"subscription": "app/audit", "topic": "/topic/t"}
    assert value(samples, "mpbroker_durable_subscription_messages", **audit) == 9


def test_destinations_past_the_cap_are_added_up_as_other() -> None:
    queues = [queue_row(f"/queue/q{n}", n, enqueued=n) for n in range(5)]
    samples = scrape(broker_status(queues), cap=2)
    waiting = {
        labels: v
        for (name, labels), v in samples.items()
        if name == "mpbroker_destination_messages"
    }
    assert waiting == {
        (("destination", "/queue/q0"), ("kind", "queue")): 0,
        (("destination", "/queue/q1"), ("kind", "queue")): 1,
        (("destination", OTHER), ("kind", "queue")): 2 + 3 + 4,
        # The topic, past the cap too, has its own kind.
        (("destination", OTHER), ("kind", "topic")): 4,
    }
    other = {"destination": OTHER, "kind": "queue"}
    assert value(samples, "mpbroker_destination_messages_enqueued_total", **other) == 9
    # The durable subscriptions have a cap of their own.
    assert (
        "mpbroker_durable_subscription_messages",
        (("subscription", "app/audit"), ("topic", "/topic/t")),
    ) in samples


def test_the_server_serves_metrics_behind_its_guard() -> None:
    fast = {"n": 2**4, "r": 1}
    users = {"root": User("root", hash_password("r00t", **fast), ("admin",))}
    server = AdminServer(
        "127.0.0.1", 0, lambda: broker_status([queue_row("/queue/a", 1)]), users=users
    )
    server.start()
    host, port = server.address
    try:
        code, _, body = ask_url(f"http://{host}:{port}/metrics")
        assert code == 401
        request = urllib.request.Request(f"http://{host}:{port}/metrics")
        request.add_header("Authorization", authorization("root", "r00t"))
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.headers["Content-Type"] == CONTENT_TYPE
            text = reply.read().decode()
        assert 'mpbroker_destination_messages{destination="/queue/a",kind="queue"} 1.0' in text
        code, _, body = ask_url(
            f"http://{host}:{port}/metrics?name=x", Authorization=authorization("root", "r00t")
        )
        assert (code, body) == (400, {"error": "unknown parameter 'name' (/metrics takes none)"})
    finally:
        server.close()


@pytest.mark.parametrize("cap", [0, 1])
def test_a_cap_of_zero_puts_every_destination_in_other(cap: int) -> None:
    samples = scrape(broker_status([queue_row("/queue/a", 1), queue_row("/queue/b", 2)]), cap=cap)
    names = {
        dict(labels)["destination"]
        for (name, labels) in samples
        if name == "mpbroker_destination_messages"
    }
    assert names == ({OTHER} if cap == 0 else {"/queue/a", OTHER})
