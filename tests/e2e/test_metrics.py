"""`GET /metrics` of a real broker with a users file, scraped as Prometheus would and read
back with the reference client's parser: every value checked against traffic this test
sent (acks, expiry, dead letters, a producer held by flow control, a refused login, a
durable subscription's stored backlog, a worker killed and restarted)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mpbroker.admin.access import authorization
from mpbroker.admin.metrics import CONTENT_TYPE
from mpbroker.client import StompError, connect
from mpbroker.harness import BrokerProcess
from tests.e2e._admin import ask, eventually, get, user_add

pytestmark = pytest.mark.slow

ADMIN = ("ops", "0ps-pw")
APP = {"login": "app", "passcode": "app-pw"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("metrics")
    users = root / "users"
    user_add(users, *ADMIN, "admin")
    user_add(users, "app", "app-pw")
    config = "\n".join(
        [
            "[security]",
            f'users_file = "{users}"',
            "[vol_queue_store]",
            "msg_high = 5",
            "msg_low = 2",
            "[flow]",
            "send_timeout_ms = 60000",
            "[queues]",
            "max_redeliveries = 0",
            "expiry_scan_interval_s = 0.5",
            "",
        ]
    )
    with BrokerProcess(gateways=1, config=config, data_dir=root / "data") as proc:
        yield proc


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(broker: BrokerProcess) -> Samples:
    request = urllib.request.Request(f"http://127.0.0.1:{broker.admin_port}/metrics")
    request.add_header("Authorization", authorization(*ADMIN))
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.headers["Content-Type"] == CONTENT_TYPE
        text = reply.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def shows(broker: BrokerProcess, name: str, expected: float, **labels: str) -> Callable[[], bool]:
    """A check for `eventually`: the scrape has `name{labels}` == expected (the workers
    publish every 500 ms, the replay worker counts backlogs every 5 s)."""
    key = (name, frozenset(labels.items()))
    return lambda: scrape(broker).get(key) == expected


def test_metrics_need_the_admin_credentials(broker: BrokerProcess) -> None:
    code, headers, _ = ask(broker, "/metrics")
    assert code == 401 and "WWW-Authenticate" in headers


def test_head_answers_as_get_without_the_body(broker: BrokerProcess) -> None:
    """`curl -I` and uptime probes ask with HEAD."""
    url = f"http://127.0.0.1:{broker.admin_port}/metrics"
    request = urllib.request.Request(url, method="HEAD")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    refused.value.close()
    assert refused.value.code == 401 and "WWW-Authenticate" in refused.value.headers
    request.add_header("Authorization", authorization(*ADMIN))
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200 and reply.headers["Content-Type"] == CONTENT_TYPE
        assert int(reply.headers["Content-Length"]) > 0 and reply.read() == b""


def test_a_queue_s_counts_follow_its_traffic(broker: BrokerProcess) -> None:
    queue = {"destination": "/queue/m.count", "kind": "queue"}
    with connect(broker.host, broker.port, **APP) as conn:
        for n in range(4):
            conn.send("/queue/m.count", f"m{n}", receipt=True)
        sub = conn.subscribe("/queue/m.count", ack="client-individual")
        got = [sub.get(timeout=10) for _ in range(4)]
        for message in got[:2]:
            assert message is not None
            conn.ack(message, receipt=True)
        eventually(shows(broker, "mpbroker_destination_messages_dequeued_total", 2, **queue))
        samples = scrape(broker)
        for name, expected in [
            ("mpbroker_destination_messages_enqueued_total", 4),
            ("mpbroker_destination_messages_in_flight", 2),
            ("mpbroker_destination_messages", 0),
            ("mpbroker_destination_consumers", 1),
            ("mpbroker_destination_flow_stopped", 0),
        ]:
            assert samples[(name, frozenset(queue.items()))] == expected, name
        gateway = frozenset({("worker", "gateway 0")})
        assert samples[("mpbroker_connections", gateway)] >= 1
        assert samples[("mpbroker_frames_received_total", gateway)] >= 8
        assert samples[("mpbroker_frames_sent_total", gateway)] >= 8
        memory = samples[("mpbroker_memory_used_bytes", frozenset())]
        assert 0 < memory < samples[("mpbroker_memory_max_bytes", frozenset())]
        p2p = frozenset({("worker", "p2p 0"), ("role", "p2p")})
        assert 0 < samples[("mpbroker_worker_memory_bytes", p2p)] < memory


def test_expired_and_dead_lettered_messages_are_counted(broker: BrokerProcess) -> None:
    with connect(broker.host, broker.port, **APP) as conn:
        soon = str(int(time.time() * 1000) + 200)
        conn.send("/queue/m.exp", "late", {"expires": soon}, receipt=True)
        conn.send("/queue/m.exp", "kept", receipt=True)
        # max_redeliveries = 0: a NACKed message goes to the dead-letter queue at once.
        conn.send("/queue/m.dlq", "refused", receipt=True)
        sub = conn.subscribe("/queue/m.dlq", ack="client")
        message = sub.get(timeout=10)
        assert message is not None
        conn.nack(message, receipt=True)
        exp = {"destination": "/queue/m.exp", "kind": "queue"}
        eventually(shows(broker, "mpbroker_destination_messages_expired_total", 1, **exp))
        dlq = {"destination": "/queue/m.dlq", "kind": "queue"}
        eventually(shows(broker, "mpbroker_destination_messages_dead_lettered_total", 1, **dlq))
        samples = scrape(broker)
        assert samples[("mpbroker_destination_messages", frozenset(exp.items()))] == 1
        dead = {"destination": "/queue/DLQ.m.dlq", "kind": "queue"}
        assert (
            samples[("mpbroker_destination_messages_enqueued_total", frozenset(dead.items()))] == 1
        )
        assert samples[("mpbroker_destination_messages", frozenset(dead.items()))] == 1


def test_a_held_producer_and_the_stop_are_shown(broker: BrokerProcess) -> None:
    flow = {"destination": "/queue/m.flow", "kind": "queue"}
    with connect(broker.host, broker.port, **APP) as producer:
        for n in range(5):
            producer.send("/queue/m.flow", f"f{n}", receipt=True)
        producer.send("/queue/m.flow", "held")  # msg_high 5: held until the queue drains
        eventually(shows(broker, "mpbroker_destination_producers_held", 1, **flow))
        samples = scrape(broker)
        assert samples[("mpbroker_destination_flow_stopped", frozenset(flow.items()))] == 1
        assert samples[("mpbroker_destination_flow_stops_total", frozenset(flow.items()))] == 1
        assert samples[("mpbroker_producers_held", frozenset({("worker", "gateway 0")}))] == 1
        with connect(broker.host, broker.port, **APP) as consumer:
            sub = consumer.subscribe("/queue/m.flow")
            bodies = [m.text for m in (sub.get(timeout=10) for _ in range(6)) if m is not None]
            assert bodies == ["f0", "f1", "f2", "f3", "f4", "held"]
            # (While its consumer keeps the queue: an idle queue is forgotten.)
            eventually(shows(broker, "mpbroker_destination_flow_stopped", 0, **flow))
            held = scrape(broker)[("mpbroker_destination_producers_held", frozenset(flow.items()))]
            assert held == 0
        # The queue is gone (nothing in it, nobody on it): its series with it.
        eventually(
            lambda: ("mpbroker_destination_messages", frozenset(flow.items())) not in scrape(broker)
        )


def test_a_refused_login_is_counted_by_reason(broker: BrokerProcess) -> None:
    key = (
        "mpbroker_connections_refused_total",
        frozenset({("worker", "gateway 0"), ("reason", "authentication")}),
    )
    before = scrape(broker).get(key, 0)
    with pytest.raises(StompError):
        connect(broker.host, broker.port, login="app", passcode="wrong")
    eventually(lambda: scrape(broker).get(key) == before + 1)


def test_a_durable_subscription_s_stored_backlog(broker: BrokerProcess) -> None:
    durable = {"activemq.subscriptionName": "audit"}
    with connect(broker.host, broker.port, client_id="metrics-app", **APP) as conn:
        conn.subscribe("/topic/m.audit", headers=durable)
    with connect(broker.host, broker.port, **APP) as conn:
        for n in range(3):
            conn.send("/topic/m.audit", f"a{n}", {"persistent": "true"}, receipt=True)
    labels = {"subscription": "metrics-app/audit", "topic": "/topic/m.audit"}
    eventually(shows(broker, "mpbroker_durable_subscription_messages", 3, **labels), timeout=20)
    samples = scrape(broker)
    assert samples[("mpbroker_durable_subscription_active", frozenset(labels.items()))] == 0
    topic = frozenset({("destination", "/topic/m.audit"), ("kind", "topic")})
    assert samples[("mpbroker_destination_messages_enqueued_total", topic)] == 3
    # The topic's own figure counts them too: they wait for its (durable) subscriber,
    # though in the store, not in its live buffer.
    assert samples[("mpbroker_destination_messages", topic)] == 3
    # Back, it takes its backlog and acknowledges it: the topic counts its dequeues.
    with connect(broker.host, broker.port, client_id="metrics-app", **APP) as conn:
        sub = conn.subscribe("/topic/m.audit", ack="client-individual", headers=durable)
        for _ in range(3):
            message = sub.get(timeout=10)
            assert message is not None
            conn.ack(message, receipt=True)
        dequeued = dict(topic)
        eventually(shows(broker, "mpbroker_destination_messages_dequeued_total", 3, **dequeued))
        eventually(shows(broker, "mpbroker_durable_subscription_active", 1, **labels))
        # Its subscriber counts as the topic's (the topic is there while it has durable
        # subscriptions, whatever it holds).
        eventually(shows(broker, "mpbroker_destination_consumers", 1, **dequeued))
    eventually(shows(broker, "mpbroker_durable_subscription_messages", 0, **labels), timeout=20)
    assert scrape(broker)[("mpbroker_destination_messages", topic)] == 0


def test_a_killed_worker_counts_a_restart(broker: BrokerProcess) -> None:
    labels = {"worker": "replay 0", "role": "replay"}
    [replay] = [w for w in get(broker, "/status", ADMIN)["workers"] if w["title"] == "replay 0"]
    os.kill(replay["pid"], signal.SIGKILL)
    eventually(shows(broker, "mpbroker_worker_restarts_total", 1, **labels), timeout=30)
    eventually(shows(broker, "mpbroker_worker_ready", 1, **labels), timeout=30)


def test_the_sample_dashboard_and_scrape_config_ask_for_what_the_broker_serves(
    broker: BrokerProcess,
) -> None:
    ops = Path(__file__).parents[2] / "ops"
    dashboard = json.loads((ops / "grafana-dashboard.json").read_text())
    asked = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"mpbroker_[a-z_]+", target["expr"])
    } | set(re.findall(r"mpbroker_[a-z_]+", json.dumps(dashboard["templating"])))
    served = {name for name, _ in scrape(broker)}
    assert asked and asked <= served, asked - served
    config = (ops / "prometheus.yml").read_text()
    assert "metrics_path: /metrics" in config and '"127.0.0.1:8161"' in config
