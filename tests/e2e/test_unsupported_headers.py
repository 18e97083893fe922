"""Nothing silently ignored, end to end: the headers and destinations ActiveMQ, Artemis and
RabbitMQ clients send for features mpbroker does not have are refused by name with stomp.py
and raw frames, and nothing of the refused frame takes effect (docs/headers.md)."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator

import pytest
import stomp

from mpbroker.client import connect
from mpbroker.harness import BrokerProcess, RawClient
from mpbroker.session._headers import RULES, rule_for

RawFactory = Callable[[BrokerProcess], RawClient]


class Recorder(stomp.ConnectionListener):  # type: ignore[misc]
    """What a stomp.py connection received, in order."""

    def __init__(self) -> None:
        self.frames: queue.Queue[stomp.utils.Frame] = queue.Queue()

    def on_message(self, frame: stomp.utils.Frame) -> None:
        self.frames.put(frame)

    def on_error(self, frame: stomp.utils.Frame) -> None:
        self.frames.put(frame)

    def on_receipt(self, frame: stomp.utils.Frame) -> None:
        self.frames.put(frame)

    def next(self, timeout: float = 10) -> stomp.utils.Frame:
        return self.frames.get(timeout=timeout)


StompFactory = Callable[[], tuple[stomp.Connection12, "Recorder"]]


@pytest.fixture
def stomp_py(broker: BrokerProcess) -> Iterator[StompFactory]:
    """stomp.py 1.2 connections to the module's broker, all closed at the end."""
    made: list[stomp.Connection12] = []

    def make() -> tuple[stomp.Connection12, Recorder]:
        conn = stomp.Connection12([(broker.host, broker.port)])
        recorder = Recorder()
        conn.set_listener("r", recorder)
        conn.connect(wait=True)
        made.append(conn)
        return conn, recorder

    yield make
    for conn in made:
        if conn.is_connected():
            conn.disconnect()


def fill(broker: BrokerProcess, destination: str, count: int) -> None:
    with connect(broker.host, broker.port) as conn:
        for n in range(count):
            conn.send(destination, f"m{n}", receipt=True)


def drain(broker: BrokerProcess, destination: str, count: int) -> list[str]:
    """Every message waiting on `destination` (there must be `count`), consumed."""
    with connect(broker.host, broker.port) as conn:
        sub = conn.subscribe(destination, ack="client-individual")
        got = []
        for _ in range(count):
            message = sub.get(timeout=10)
            assert message is not None
            got.append(message.text)
            conn.ack(message)
        assert sub.get(timeout=0.3) is None
    return got


def test_a_browse_is_refused_and_leaves_the_queue_as_it_was(
    broker: BrokerProcess, stomp_py: StompFactory
) -> None:
    fill(broker, "/queue/browsed", 3)
    conn, recorder = stomp_py()
    conn.subscribe("/queue/browsed", id="b", headers={"browser": "true", "receipt": "s"})
    error = recorder.next()
    assert error.cmd == "ERROR"
    assert error.headers["message"] == (
        "unsupported header browser on SUBSCRIBE: queue browsing is not supported yet"
    )
    assert error.headers["receipt-id"] == "s"
    assert recorder.frames.empty()
    assert drain(broker, "/queue/browsed", 3) == ["m0", "m1", "m2"]


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("JMSXGroupID", "orders-42"),
        ("JMSXGroupSeq", "1"),
        ("AMQ_SCHEDULED_DELAY", "60000"),
        ("AMQ_SCHEDULED_PERIOD", "1000"),
        ("AMQ_SCHEDULED_REPEAT", "3"),
        ("AMQ_SCHEDULED_CRON", "* * * * *"),
        ("_AMQ_SCHED_DELIVERY", "4102444800000"),
        ("_AMQ_DUPL_ID", "abc"),
        ("_AMQ_LVQ_NAME", "key"),
    ],
)
def test_a_send_with_a_header_for_a_missing_feature_is_refused_and_not_delivered(
    broker: BrokerProcess, stomp_py: StompFactory, header: str, value: str
) -> None:
    destination = f"/queue/refused.{header}"
    conn, recorder = stomp_py()
    conn.send(destination, "not for anyone", headers={header: value, "receipt": "r"})
    error = recorder.next()
    assert error.cmd == "ERROR"
    assert error.headers["message"].startswith(f"unsupported header {header} on SEND: ")
    assert error.headers["receipt-id"] == "r"
    fill(broker, destination, 1)
    assert drain(broker, destination, 1) == ["m0"]


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("activemq.exclusive", "true"),
        ("activemq.priority", "10"),
        ("activemq.retroactive", "true"),
        ("activemq.noLocal", "true"),
        ("activemq.maximumPendingMessageLimit", "10"),
    ],
)
def test_a_subscribe_asking_for_a_missing_consumer_feature_is_refused_and_takes_nothing(
    broker: BrokerProcess, stomp_py: StompFactory, header: str, value: str
) -> None:
    destination = f"/queue/consumer.{header}"
    fill(broker, destination, 2)
    conn, recorder = stomp_py()
    conn.subscribe(destination, id="c", headers={header: value})
    error = recorder.next()
    assert error.cmd == "ERROR"
    assert error.headers["message"].startswith(f"unsupported header {header} on SUBSCRIBE: ")
    assert recorder.frames.empty()
    assert drain(broker, destination, 2) == ["m0", "m1"]


def test_the_default_values_of_refused_headers_are_accepted(
    broker: BrokerProcess, stomp_py: StompFactory
) -> None:
    conn, recorder = stomp_py()
    conn.subscribe(
        "/queue/defaults",
        id="d",
        headers={"activemq.exclusive": "false", "browser": "false", "activemq.priority": "0"},
    )
    conn.send("/queue/defaults", "now", headers={"AMQ_SCHEDULED_DELAY": "0"})
    message = recorder.next()
    assert message.cmd == "MESSAGE" and message.body == "now"


@pytest.mark.parametrize(
    ("destination", "what"),
    [
        ("/topic/prices.*", "wildcard destinations (* and >) are not supported yet"),
        ("/topic/prices.>", "wildcard destinations (* and >) are not supported yet"),
        ("/topic/prices.#", "wildcard destinations (#) are not supported yet"),
        ("/queue/a,/topic/b", "composite destinations (a,b) are not supported yet"),
        ("/temp-queue/replies", "temporary destinations are not supported yet"),
        ("/temp-topic/replies", "temporary destinations are not supported yet"),
    ],
)
def test_wildcard_composite_and_temporary_destinations_are_refused_by_name(
    stomp_py: StompFactory, destination: str, what: str
) -> None:
    conn, recorder = stomp_py()
    conn.subscribe(destination, id="w")
    error = recorder.next()
    assert error.cmd == "ERROR"
    assert what in error.headers["message"]
    if "#" in destination:
        return  # a SEND to it is a plain name (RabbitMQ's routing key is literal too)
    conn, recorder = stomp_py()
    conn.send(destination, "x")
    error = recorder.next()
    assert error.cmd == "ERROR"
    assert error.headers["message"].startswith(what)


def refused_by_the_table() -> list[tuple[str, str, str]]:
    """(frame, header, value) of every refusal the table names, families included (with a
    name of the family nobody uses)."""
    cases = []
    for rule in RULES:
        if rule.treatment != "refused":
            continue
        header = rule.header.replace("*", "Unheard")
        value = "1" if rule.default == "0" else "true"
        # (A frame's own rule wins over a family's: an x- header on SEND is carried.)
        cases += [(c, header, value) for c in rule.frames if rule_for(c, header) is rule]
    return cases


# Frames each command is sent as in the walk: accepted without the added header.
_WALK_BASE = {
    "SEND": {"destination": "/queue/walk"},
    "SUBSCRIBE": {"destination": "/queue/walk", "id": "w"},
    "UNSUBSCRIBE": {"id": "s"},
    "ACK": {"id": "1/ID-1"},
    "NACK": {"id": "1/ID-1"},
    "BEGIN": {"transaction": "t2"},
    "COMMIT": {"transaction": "t"},
    "ABORT": {"transaction": "t"},
    "DISCONNECT": {},
}


def test_every_refusal_in_the_table_holds_on_a_real_broker(
    broker: BrokerProcess, raw: RawFactory
) -> None:
    """The walk of the whole table, with raw frames (stomp.py cannot send every frame with
    any header): each refused header, on each frame it is refused on, gets its ERROR."""
    cases = refused_by_the_table()
    assert len(cases) > 60
    for command, header, value in cases:
        client = raw(broker)
        if command == "CONNECT":
            client.send("CONNECT", {"accept-version": "1.2", "host": "/", header: value})
        else:
            client.connect()
            client.send("SUBSCRIBE", {"destination": "/queue/walk.s", "id": "s"})
            client.send("BEGIN", {"transaction": "t"})
            client.send(command, {**_WALK_BASE[command], header: value, "receipt": "r"})
        [error] = client.recv_until_closed(timeout=10)
        assert error.command == "ERROR", (command, header)
        assert error.headers["message"].startswith(f"unsupported header {header} on {command}")
        client.close()
    # Nothing of those SENDs reached the queue.
    fill(broker, "/queue/walk", 1)
    assert drain(broker, "/queue/walk", 1) == ["m0"]
    # A refusal for a header is no access denial.
    assert "access denied" not in broker.log_text()


def test_an_ignored_header_is_logged_once_per_connection(
    broker: BrokerProcess, stomp_py: StompFactory
) -> None:
    start = len(broker.lines)
    conn, recorder = stomp_py()
    for n in range(3):
        conn.subscribe(f"/queue/async.{n}", id=f"a{n}", headers={"activemq.dispatchAsync": "true"})
    conn.send("/queue/async.0", "still delivered")
    assert recorder.next().body == "still delivered"
    broker.wait_for_log(
        r"header activemq\.dispatchAsync on SUBSCRIBE ignored: harmless", start=start
    )
    assert "\n".join(broker.lines[start:]).count("activemq.dispatchAsync") == 1
