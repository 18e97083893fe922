"""JMS message selectors end to end: real brokers, stomp.py and our clients.

Queues with disjoint selectors, a rare match behind a long backlog, topic fan-out with
selectors, durable subscriptions with selectors across a restart and replaced by a new
selector, a paged backlog with selectors, and every kind of bad selector."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import stomp

from mpbroker.client import connect
from mpbroker.harness import BrokerProcess, RawClient
from tests.e2e._admin import eventually, worker_stats

RawFactory = Callable[[BrokerProcess], RawClient]


def subscribe(client: RawClient, destination: str, sub_id: str, **headers: str) -> None:
    client.send(
        "SUBSCRIBE", {"destination": destination, "id": sub_id, "receipt": sub_id, **headers}
    )
    frame = client.recv(timeout=15)
    assert frame.headers.get("receipt-id") == sub_id, frame


def send_all(client: RawClient, destination: str, headers: list[dict[str, str]]) -> None:
    """Pipelined SENDs with `headers` (body: their index), one receipt at the end."""
    for n, extra in enumerate(headers):
        client.send("SEND", {"destination": destination, **extra}, b"%d" % n)
    client.send("SEND", {"destination": destination, "receipt": "last", "k": "none"}, b"last")
    frame = client.recv(timeout=30)
    assert frame.headers.get("receipt-id") == "last", frame


def publish_persistent(client: RawClient, destination: str, kinds: list[str]) -> None:
    """Persistent SENDs (body: their index), each with a receipt, all awaited: a message
    kept for a durable subscription is answered once stored, one nobody keeps at once."""
    for n, kind in enumerate(kinds):
        headers = {"destination": destination, "kind": kind, "persistent": "true"}
        client.send("SEND", {**headers, "receipt": f"p{n}"}, b"%d" % n)
    receipts = {client.recv(timeout=30).headers.get("receipt-id") for _ in kinds}
    assert receipts == {f"p{n}" for n in range(len(kinds))}


def bodies(client: RawClient, count: int, *, ack: bool = False) -> list[bytes]:
    frames = [client.recv(timeout=15) for _ in range(count)]
    if ack:
        for frame in frames:
            client.send("ACK", {"id": frame.headers["ack"]})
    return [f.body for f in frames]


def test_queue_consumers_with_disjoint_selectors_get_only_their_own(
    broker: BrokerProcess, raw: RawFactory
) -> None:
    consumers = {color: raw(broker) for color in ("red", "blue", "green")}
    for color, client in consumers.items():
        client.connect()
        subscribe(client, "/queue/colors", "s", selector=f"color = '{color}'")
    producer = raw(broker)
    producer.connect()
    sent = [{"color": ("red", "blue", "green")[n % 3]} for n in range(300)]
    send_all(producer, "/queue/colors", sent)
    for index, (color, client) in enumerate(consumers.items()):
        got = bodies(client, 100)
        assert got == [b"%d" % n for n in range(index, 300, 3)], color
        client.assert_no_frame(0.3)


def test_a_rare_match_is_delivered_promptly_behind_a_long_unselected_backlog(
    broker: BrokerProcess, raw: RawFactory
) -> None:
    producer = raw(broker)
    producer.connect()
    send_all(producer, "/queue/rare", [{"n": str(n % 100)} for n in range(5000)])
    rare = raw(broker)
    rare.connect()
    subscribe(rare, "/queue/rare", "s", selector="n = 99", ack="client-individual")
    got = bodies(rare, 50, ack=True)
    assert got == [b"%d" % n for n in range(99, 5000, 100)]
    # The rest is still queued, in order, for whoever selects it.
    everyone = raw(broker)
    everyone.connect()
    subscribe(everyone, "/queue/rare", "all", selector="n <> 'none'")
    assert bodies(everyone, 3) == [b"0", b"1", b"2"]


class Collector(stomp.ConnectionListener):  # type: ignore[misc]
    """A stomp.py listener keeping the bodies received; `done` once `last` is one of them
    (or `count` arrived), `subscribed` at the first RECEIPT."""

    def __init__(self, *, last: str | None = None, count: int = 0) -> None:
        self.received: list[str] = []
        self.done = threading.Event()
        self.subscribed = threading.Event()
        self.last = last
        self.count = count

    def on_message(self, frame: stomp.utils.Frame) -> None:
        self.received.append(frame.body)
        if frame.body == self.last or len(self.received) == self.count:
            self.done.set()

    def on_receipt(self, frame: stomp.utils.Frame) -> None:
        self.subscribed.set()


def stomp_py(broker: BrokerProcess, listener: Collector) -> stomp.Connection12:
    """A connected stomp.py 1.2 connection with `listener`."""
    conn = stomp.Connection12([(broker.host, broker.port)])
    conn.set_listener("l", listener)
    conn.connect(wait=True)
    return conn


def test_topic_fan_out_with_selectors_stomp_py_and_our_client(broker: BrokerProcess) -> None:
    listener = Collector(count=2)
    listener_conn = stomp_py(broker, listener)
    try:
        listener_conn.subscribe(
            "/topic/prices",
            id="py",
            headers={"selector": "price > 100.5 AND symbol = 'X'", "receipt": "sub"},
        )
        assert listener.subscribed.wait(10)
        with connect(broker.host, broker.port) as conn:
            ours = conn.subscribe("/topic/prices", selector="priority = 9")
            everything = conn.subscribe("/topic/prices")
            sent = [("120", "X", "9"), ("100", "X", "4"), ("150", "Y", "4"), ("101", "X", "4")]
            for price, symbol, priority in sent:
                conn.send(
                    "/topic/prices",
                    f"{symbol}@{price}",
                    headers={"price": price, "symbol": symbol, "priority": priority},
                    receipt=True,
                )
            got = [everything.get(timeout=10) for _ in sent]
            assert [m.text for m in got if m] == ["X@120", "X@100", "Y@150", "X@101"]
            first = ours.get(timeout=10)
            assert first is not None and first.text == "X@120"
            assert ours.get(timeout=0.3) is None
        assert listener.done.wait(10)
        assert listener.received == ["X@120", "X@101"]
    finally:
        listener_conn.disconnect()


def test_an_escape_that_is_a_wildcard_reads_as_activemq_reads_it_stomp_py(
    broker: BrokerProcess,
) -> None:
    """`'_D7xl__' ESCAPE '_'`: the first `_` is a wildcard (it escapes only %, _ or itself),
    the last two one literal `_`, as in ActiveMQ's own selector tests."""
    listener = Collector(last="last")
    conn = stomp_py(broker, listener)
    try:
        selector = "name LIKE '_D7xl__' ESCAPE '_' OR name = 'last' OR name LIKE 'a!b' ESCAPE '!'"
        conn.subscribe("/queue/escapes", id="1", headers={"selector": selector, "receipt": "s"})
        assert listener.subscribed.wait(10)
        for name in ("XD7xl_", "D7xl_", "XD7xlY", "_D7xl_", "ab", "a!b", "last"):
            conn.send("/queue/escapes", name, headers={"name": name})
        assert listener.done.wait(10)
        assert listener.received == ["XD7xl_", "_D7xl_", "a!b", "last"]
    finally:
        conn.disconnect()


@pytest.mark.slow
def test_a_durable_subscription_keeps_its_selector_across_a_restart_and_a_new_one_replaces_it(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    durable = {"activemq.subscriptionName": "picky", "ack": "client-individual"}
    broker = start_broker("--gateways", "1")
    client = raw(broker)
    client.connect(**{"client-id": "app"})
    subscribe(client, "/topic/d", "s", selector="kind = 'keep'", **durable)
    client.close()
    producer = raw(broker)
    producer.connect()
    publish_persistent(producer, "/topic/d", ["keep", "drop"] * 10)
    broker.kill()
    again = start_broker("--gateways", "1", data_dir=broker.data_dir)
    back = raw(again)
    back.connect(**{"client-id": "app"})
    subscribe(back, "/topic/d", "s", selector="kind = 'keep'", **durable)
    assert bodies(back, 10, ack=True) == [b"%d" % n for n in range(0, 20, 2)]
    back.assert_no_frame(0.5)
    back.close()
    producer = raw(again)
    producer.connect()
    publish_persistent(producer, "/topic/d", ["keep", "other"])
    # Another selector replaces the subscription: the old backlog goes with it (JMS). That
    # backlog is the one message it selected: the other was never stored for it.
    other = raw(again)
    other.connect(**{"client-id": "app"})
    subscribe(other, "/topic/d", "s", selector="kind = 'drop'", **durable)
    again.wait_for_log(r"durable subscription 'app/picky' on /topic/d with selector")
    again.wait_for_log(r"durable subscription 'app/picky' removed with 1 waiting messages")
    other.assert_no_frame(0.5)
    publish_persistent(producer, "/topic/d", ["keep", "drop"])
    assert bodies(other, 1, ack=True) == [b"1"]
    other.assert_no_frame(0.5)


PAGING = """
[vol_queue_store]
global_byte_high = 65536
global_byte_low = 32768
[temp_store]
segment_bytes = 65536
page_step_bytes = 32768
"""


@pytest.mark.slow
def test_a_paged_backlog_is_selected_without_reading_what_is_not_delivered(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1", config=PAGING)
    producer = raw(broker)
    producer.connect()
    headers = [{"group": str(n % 10), "pad": "x" * 900} for n in range(1000)]  # ~1 MB
    send_all(producer, "/queue/paged-sel", headers)
    paged = eventually(lambda: worker_stats(broker, "p2p 0")["temp_store"]["messages"])
    assert paged > 500
    picky = raw(broker)
    picky.connect()
    subscribe(picky, "/queue/paged-sel", "s", selector="group IN ('3', '7')")
    got = bodies(picky, 200)
    assert got == [b"%d" % n for n in range(1000) if n % 10 in (3, 7)]
    picky.assert_no_frame(0.3)
    # Only the pages of what was delivered were read back; the rest wait on disk.
    temp = eventually(lambda: worker_stats(broker, "p2p 0")["temp_store"]["paged_in"] >= 1)
    stats = worker_stats(broker, "p2p 0")["temp_store"]
    assert temp and stats["paged_in"] <= 200
    assert stats["messages"] >= paged - 200


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("color = 'red' AND", "selector error at column 18: expected an expression after AND"),
        ("color = 'red", "selector error at column 9: unterminated string"),
        ("(a = 1", "selector error at column"),
        ("a LIKE 'x' ESCAPE 'ab'", "selector error at column"),
        ("a = 1 = 2", "selector error at column"),
        ("a ! 1", "selector error at column"),
    ],
)
def test_a_bad_selector_is_refused_with_its_column_and_nothing_is_subscribed(
    broker: BrokerProcess, raw: RawFactory, selector: str, message: str
) -> None:
    client = raw(broker)
    client.connect()
    client.send(
        "SUBSCRIBE",
        {"destination": "/queue/bad-sel", "id": "s", "selector": selector, "receipt": "r"},
    )
    [error] = client.recv_until_closed(timeout=10)
    assert error.command == "ERROR"
    assert error.headers["message"].startswith(message), error.headers["message"]
    assert error.headers["receipt-id"] == "r"
    assert b"Nothing was subscribed" in error.body
    # Nothing was subscribed: a message sent now waits for a real consumer.
    producer = raw(broker)
    producer.connect()
    send_all(producer, "/queue/bad-sel", [])
    check = raw(broker)
    check.connect()
    subscribe(check, "/queue/bad-sel", "c")
    assert bodies(check, 1) == [b"last"]


def test_a_selector_over_the_configured_length_is_refused(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1", config="[selectors]\nmax_length = 64\n")
    client = raw(broker)
    client.connect()
    long = " OR ".join(f"a = {n}" for n in range(20))
    client.send("SUBSCRIBE", {"destination": "/topic/x", "id": "s", "selector": long})
    [error] = client.recv_until_closed(timeout=10)
    assert error.headers["message"] == (
        f"selector too long: {len(long)} characters, selectors.max_length is 64"
    )
    ok = raw(broker)
    ok.connect()
    subscribe(ok, "/topic/x", "s", selector="a = 1")
