"""GatewaySession: one STOMP connection as a sans-IO state machine (frames in; bytes, records out)."""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Iterator
from functools import partial

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpbroker.compression import decompress
from mpbroker.config import AclEntry, Config, replace_settings
from mpbroker.records import (
    ACK_AUTO,
    ACK_CLIENT,
    ACK_INDIVIDUAL,
    Ack,
    Barrier,
    ConnClosed,
    Credit,
    Message,
    Nack,
    Record,
    Refuse,
    Send,
    Subscribe,
    Unsubscribe,
    message_size,
)
from mpbroker.routing import Topology
from mpbroker.security import AccessControl
from mpbroker.session import (
    GatewaySession,
    ReduceStrategy,
    SessionOutput,
    SessionState,
    SessionStateError,
    TransactionBudget,
)
from mpbroker.session._session import _message_tail, _message_tail_escaped
from mpbroker.stomp import SERVER_COMMANDS, Frame, FrameParser
from tests import factories

CONN = 7
NOW = 123_456
TOPOLOGY = Topology(p2p=3, pubsub=2)


def message_ids() -> Iterator[str]:
    return (f"ID-{n}" for n in itertools.count(1))


def new_session(
    config: Config | None = None,
    budget: TransactionBudget | None = None,
    conn: int = CONN,
) -> GatewaySession:
    config = config or Config()
    return GatewaySession(
        conn,
        config,
        TOPOLOGY,
        message_ids(),
        budget or TransactionBudget(config.transactions.max_uncommitted_bytes),
    )


# What each session's take_output() gave and a test has not looked at yet: `frames` reads
# the bytes, `routes` the records, each taking all there is (as the gateway shell does).
# A plain dict emptied after each test: a compiled GatewaySession takes no weak reference.
_taken: dict[GatewaySession, SessionOutput] = {}


@pytest.fixture(autouse=True)
def _forget_taken() -> Iterator[None]:
    yield
    _taken.clear()


def _take(session: GatewaySession) -> SessionOutput:
    kept = _taken.setdefault(session, SessionOutput())
    output = session.take_output()
    kept.data += output.data
    kept.records += output.records
    return kept


def frames(session: GatewaySession) -> list[Frame]:
    """Parse what the session wants written to the socket (taken: the next call sees only
    what came since)."""
    kept = _take(session)
    parser = FrameParser(commands=SERVER_COMMANDS, version=session.version)
    parsed = parser.feed(b"".join(kept.data))
    assert parser.buffered_bytes == 0
    kept.data.clear()
    return parsed


def routes(session: GatewaySession) -> list[tuple[int, Record]]:
    """The records the session wants sent to pipelines (taken, like `frames`)."""
    kept = _take(session)
    taken = list(kept.records)
    kept.records.clear()
    return taken


def frame(command: str, body: bytes = b"", **headers: str) -> Frame:
    return Frame(command, {k.replace("_", "-"): v for k, v in headers.items()}, body)


def connected(version: str = "1.2", config: Config | None = None) -> GatewaySession:
    session = new_session(config)
    session.frame_received(frame("CONNECT", accept_version=version, host="h"), NOW)
    [reply] = frames(session)
    assert reply.command == "CONNECTED"
    return session


def error_of(session: GatewaySession) -> Frame:
    [error] = frames(session)
    assert error.command == "ERROR"
    assert session.state is SessionState.CLOSING
    assert session.is_ending()
    return error


def subscribed(
    session: GatewaySession, sub_id: str = "s1", destination: str = "/queue/q", ack: str = "client"
) -> Subscribe:
    session.frame_received(frame("SUBSCRIBE", id=sub_id, destination=destination, ack=ack), NOW)
    [(_, record)] = routes(session)
    assert isinstance(record, Subscribe)
    return record


#: The messages these tests deliver.
make_message = partial(factories.make_message, body=b"payload", timestamp_ms=1)


# -- CONNECT ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept_version", "expected"),
    [
        (None, "1.0"),
        ("1.0", "1.0"),
        ("1.1", "1.1"),
        ("1.2", "1.2"),
        ("1.0,1.1,1.2", "1.2"),
        ("1.1, 1.0", "1.1"),
        ("1.2,2.0", "1.2"),
    ],
)
def test_connect_negotiates_the_highest_common_version(
    accept_version: str | None, expected: str
) -> None:
    session = new_session()
    headers = {} if accept_version is None else {"accept-version": accept_version}
    session.frame_received(Frame("CONNECT", headers), NOW)
    [reply] = frames(session)
    assert reply.command == "CONNECTED"
    assert reply.headers["version"] == expected
    assert reply.headers["server"] == "mpbroker"
    assert reply.headers["session"] == f"session-{CONN}"
    assert session.version == expected
    assert session.accepts_frames()
    assert session.state is SessionState.CONNECTED


def test_stomp_command_connects_like_connect() -> None:
    session = new_session()
    session.frame_received(frame("STOMP", accept_version="1.2", host="h", client_id="me"), NOW)
    [reply] = frames(session)
    assert reply.command == "CONNECTED"
    assert session.client_id == "me"


def test_connected_offers_the_configured_heart_beat_and_0_0_to_1_0_clients() -> None:
    config = replace_settings(Config(), "stomp", heartbeat_send_ms=500, heartbeat_receive_ms=2000)
    for version in ("1.1", "1.2"):
        session = new_session(config)
        session.frame_received(frame("CONNECT", accept_version=version), NOW)
        assert frames(session)[0].headers["heart-beat"] == "500,2000"
    session = new_session(config)
    session.frame_received(frame("CONNECT", accept_version="1.0", heart_beat="10,10"), NOW)
    # Always there (STOMP 1.0 clients such as RabbitMQ's tests read it), and 1.0 has none.
    assert frames(session)[0].headers["heart-beat"] == "0,0"
    assert session.heartbeat == (0, 0)


@pytest.mark.parametrize(
    ("client", "server", "expected"),
    [
        (None, (1000, 1000), (0, 0)),
        ("0,0", (1000, 1000), (0, 0)),
        ("3000,500", (1000, 1000), (1000, 3000)),
        ("500,5000", (1000, 1000), (5000, 1000)),
        ("500,5000", (0, 1000), (0, 1000)),
        ("500,5000", (1000, 0), (5000, 0)),
        (" 10 , 20 ", (1, 1), (20, 10)),
    ],
)
def test_heart_beat_is_negotiated_against_the_configured_offer(
    client: str | None, server: tuple[int, int], expected: tuple[int, int]
) -> None:
    config = replace_settings(
        Config(), "stomp", heartbeat_send_ms=server[0], heartbeat_receive_ms=server[1]
    )
    session = new_session(config)
    headers = {"accept-version": "1.2"}
    if client is not None:
        headers["heart-beat"] = client
    session.frame_received(Frame("CONNECT", headers), NOW)
    assert session.heartbeat == expected


def test_a_malformed_heart_beat_is_an_error() -> None:
    session = new_session()
    session.frame_received(
        frame("CONNECT", accept_version="1.2", heart_beat="soon", receipt="r"), NOW
    )
    error = error_of(session)
    assert "heart-beat" in error.headers["message"]
    assert error.headers["receipt-id"] == "r"
    assert session.state is SessionState.CLOSING


def test_an_unsupported_version_is_refused_with_the_supported_ones() -> None:
    session = new_session()
    session.frame_received(frame("CONNECT", accept_version="2.0,3.1"), NOW)
    error = error_of(session)
    assert error.headers["message"] == "unsupported protocol version"
    assert b"1.0, 1.1 and 1.2" in error.body
    assert "'2.0,3.1'" in error.body.decode()
    assert error.headers["content-type"] == "text/plain"
    assert session.state is SessionState.CLOSING


def test_a_frame_before_connect_is_an_error() -> None:
    session = new_session()
    session.frame_received(frame("SEND", destination="/queue/q", receipt="r"), NOW)
    error = error_of(session)
    assert error.headers["message"] == "expected CONNECT, got SEND"
    assert error.headers["receipt-id"] == "r"
    assert routes(session) == []


def test_connect_twice_is_an_error() -> None:
    session = connected()
    session.frame_received(frame("CONNECT", accept_version="1.2"), NOW)
    assert error_of(session).headers["message"] == "CONNECT is not valid after CONNECT"


def test_an_unknown_command_after_connect_is_an_error() -> None:
    session = connected()
    session.frame_received(Frame("FLY"), NOW)
    assert error_of(session).headers["message"] == "FLY is not valid after CONNECT"


# -- SEND ------------------------------------------------------------------------------------


@pytest.mark.parametrize("destination", ["/queue/orders", "/queue/b", "/topic/prices", "/topic/z"])
def test_send_is_routed_to_the_pipeline_that_owns_the_destination(destination: str) -> None:
    session = connected()
    session.frame_received(frame("SEND", b"hi", destination=destination), NOW)
    [(pipeline, record)] = routes(session)
    assert pipeline == TOPOLOGY.owner(destination)
    assert isinstance(record, Send)
    assert record.message.destination == destination
    assert frames(session) == []
    session.closed()
    assert routes(session) == [(pipeline, ConnClosed(CONN))]  # it hears of the end


def test_send_becomes_a_message_with_the_users_headers_only() -> None:
    session = connected()
    session.frame_received(
        frame(
            "SEND",
            b"body\x00bytes",
            destination="/queue/q",
            receipt="r1",
            content_length="10",
            content_type="text/plain",
            persistent="true",
            color="blue",
        ),
        NOW,
    )
    [(_, record)] = routes(session)
    assert isinstance(record, Send)
    assert record.conn == CONN
    assert record.receipt == "r1"
    assert record.message == Message(
        "ID-1",
        "/queue/q",
        {"content-type": "text/plain", "persistent": "true", "color": "blue"},
        b"body\x00bytes",
        NOW,
        persistent=True,
    )


def test_each_send_takes_the_next_message_id() -> None:
    session = connected()
    for _ in range(3):
        session.frame_received(frame("SEND", destination="/queue/q"), NOW)
    ids = [r.message.message_id for _, r in routes(session) if isinstance(r, Send)]
    assert ids == ["ID-1", "ID-2", "ID-3"]


@pytest.mark.parametrize(
    ("value", "persistent"), [("true", True), ("TRUE", True), ("True", True), ("false", False)]
)
def test_persistent_is_a_boolean_in_any_case(value: str, persistent: bool) -> None:
    # stomp.py writes a Python True as "True": the message is persistent all the same.
    session = connected()
    session.frame_received(frame("SEND", destination="/queue/q", persistent=value), NOW)
    [(_, record)] = routes(session)
    assert isinstance(record, Send)
    assert record.message.persistent is persistent


@pytest.mark.parametrize("value", ["1", "", "yes"])
def test_a_persistent_header_that_is_no_boolean_is_refused_not_taken_for_false(
    value: str,
) -> None:
    session = connected()
    send = frame("SEND", destination="/queue/q", persistent=value, receipt="r")
    assert session.refuses_send(send)  # before flow control may hold it
    error = error_of(session)
    assert error.headers["message"] == f"header persistent:{value!r} must be true or false"
    assert error.headers["receipt-id"] == "r"
    assert routes(session) == []


def test_send_without_destination_is_an_error_answering_the_receipt() -> None:
    session = connected()
    session.frame_received(frame("SEND", receipt="r9"), NOW)
    error = error_of(session)
    assert error.headers["message"] == "SEND needs a destination header"
    assert error.headers["receipt-id"] == "r9"
    assert routes(session) == []


@pytest.mark.parametrize("destination", ["/queues/x", "orders", "/queue/", "/topic/a\tb"])
def test_send_to_an_unknown_destination_kind_is_an_error_naming_it(destination: str) -> None:
    session = connected()
    session.frame_received(frame("SEND", destination=destination, receipt="r"), NOW)
    error = error_of(session)
    assert repr(destination) in error.headers["message"]
    assert error.headers["receipt-id"] == "r"
    assert routes(session) == []


def test_no_frame_is_read_after_an_error() -> None:
    session = connected()
    session.frame_received(frame("SEND"), NOW)
    error_of(session)
    assert not session.accepts_frames()
    # Feeding one anyway is the shell's bug, named with the state.
    with pytest.raises(SessionStateError, match="frame SEND is not allowed in state closing"):
        session.frame_received(frame("SEND", destination="/queue/q"), NOW)
    assert routes(session) == []
    assert frames(session) == []


# -- SUBSCRIBE / UNSUBSCRIBE -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("ack", "mode"),
    [("auto", ACK_AUTO), ("client", ACK_CLIENT), ("client-individual", ACK_INDIVIDUAL)],
)
def test_subscribe_registers_with_the_owner_pipeline(ack: str, mode: int) -> None:
    session = connected()
    session.frame_received(
        frame("SUBSCRIBE", id="s1", destination="/queue/q", ack=ack, receipt="r"), 0
    )
    [(pipeline, record)] = routes(session)
    assert pipeline == TOPOLOGY.owner("/queue/q")
    assert record == Subscribe(CONN, 1, "s1", "/queue/q", mode, 1000, "r")
    assert frames(session) == []  # the pipeline answers the receipt


def test_ack_mode_defaults_to_auto() -> None:
    session = connected()
    session.frame_received(frame("SUBSCRIBE", id="s1", destination="/topic/t"), NOW)
    [(_, record)] = routes(session)
    assert isinstance(record, Subscribe)
    assert record.ack_mode == ACK_AUTO


def test_each_subscription_gets_its_own_handle() -> None:
    session = connected()
    handles = [subscribed(session, f"s{i}").sub for i in range(3)]
    assert handles == [1, 2, 3]


def test_prefetch_defaults_come_from_the_queue_and_topic_settings() -> None:
    config = replace_settings(
        replace_settings(Config(), "queues", prefetch=5), "topics", prefetch=9
    )
    session = connected(config=config)
    assert subscribed(session, "a", "/queue/q").prefetch == 5
    assert subscribed(session, "b", "/topic/t").prefetch == 9


def test_prefetch_size_header_overrides_the_default() -> None:
    session = connected()
    headers = {"id": "s", "destination": "/queue/q", "activemq.prefetchSize": "3"}
    session.frame_received(Frame("SUBSCRIBE", headers), NOW)
    [(_, record)] = routes(session)
    assert isinstance(record, Subscribe)
    assert record.prefetch == 3


def test_nack_carries_rabbitmq_s_requeue_header() -> None:
    session = connected()
    sub = subscribed(session, "s1")
    for headers, requeue in (
        ({}, True),
        ({"requeue": "true"}, True),
        ({"requeue": "false"}, False),
        # stomp.py writes a Python False as "False" (`conn.nack(id, requeue=False)`).
        ({"requeue": "False"}, False),
        ({"requeue": "TRUE"}, True),
    ):
        session.frame_received(Frame("NACK", {"id": f"{sub.sub}/m1", **headers}), NOW)
        [(_, record)] = routes(session)
        assert record == Nack(CONN, sub.sub, "m1", "", requeue)
    session.frame_received(Frame("NACK", {"id": f"{sub.sub}/m1", "requeue": "no"}), NOW)
    assert error_of(session).headers["message"] == "header requeue:'no' must be true or false"


def test_rabbitmq_prefetch_count_is_a_synonym_and_activemq_s_header_wins() -> None:
    session = connected()
    for headers, expected in (
        ({"prefetch-count": "7"}, 7),
        ({"prefetch-count": "7", "activemq.prefetchSize": "3"}, 3),
    ):
        sub_id = f"s{expected}"
        session.frame_received(
            Frame("SUBSCRIBE", {"id": sub_id, "destination": "/queue/q", **headers}), NOW
        )
        [(_, record)] = routes(session)
        assert isinstance(record, Subscribe) and record.prefetch == expected
    session.frame_received(
        Frame("SUBSCRIBE", {"id": "bad", "destination": "/queue/q", "prefetch-count": "0"}), NOW
    )
    assert "prefetch-count" in error_of(session).headers["message"]


@pytest.mark.parametrize("value", ["0", "-1", "many", ""])
def test_prefetch_size_below_one_or_not_a_number_is_an_error(value: str) -> None:
    session = connected()
    headers = {"id": "s", "destination": "/queue/q", "activemq.prefetchSize": value}
    session.frame_received(Frame("SUBSCRIBE", headers), NOW)
    error = error_of(session)
    assert "activemq.prefetchSize" in error.headers["message"]
    assert ">= 1" in error.headers["message"]


def test_a_selector_travels_with_the_subscription_and_its_re_registration() -> None:
    session = connected()
    headers = {"id": "s", "destination": "/queue/q", "selector": "color = 'red'"}
    session.frame_received(Frame("SUBSCRIBE", headers), NOW)
    [(pipeline, record)] = routes(session)
    assert isinstance(record, Subscribe)
    assert record.selector == "color = 'red'"
    session.pipeline_restarted(pipeline)
    [(_, again)] = routes(session)
    assert isinstance(again, Subscribe) and again.selector == "color = 'red'"


@pytest.mark.parametrize("blank", ["", "   "])
def test_a_blank_selector_selects_everything(blank: str) -> None:
    session = connected()
    session.frame_received(
        Frame("SUBSCRIBE", {"id": "s", "destination": "/topic/t", "selector": blank}), NOW
    )
    [(_, record)] = routes(session)
    assert isinstance(record, Subscribe) and record.selector == ""


def test_a_selector_that_does_not_parse_is_refused_and_nothing_is_subscribed() -> None:
    session = connected()
    headers = {
        "id": "s",
        "destination": "/queue/q",
        "selector": "color = 'red' AND",
        "receipt": "r",
    }
    session.frame_received(Frame("SUBSCRIBE", headers), NOW)
    assert routes(session) == []
    error = error_of(session)
    assert error.headers["message"].startswith("selector error at column ")
    assert "AND" in error.headers["message"]
    assert error.headers["receipt-id"] == "r"
    assert error.body == b"Nothing was subscribed.\n"


def test_a_selector_longer_than_max_length_is_refused() -> None:
    session = connected(config=replace_settings(Config(), "selectors", max_length=10))
    headers = {"id": "s", "destination": "/queue/q", "selector": "a = 'long text'"}
    session.frame_received(Frame("SUBSCRIBE", headers), NOW)
    assert routes(session) == []
    assert error_of(session).headers["message"] == (
        "selector too long: 15 characters, selectors.max_length is 10"
    )


def test_subscribe_with_an_id_already_in_use_is_an_error() -> None:
    session = connected()
    subscribed(session, "dup")
    session.frame_received(
        frame("SUBSCRIBE", id="dup", destination="/queue/other", receipt="r"), NOW
    )
    error = error_of(session)
    assert "'dup' is already in use" in error.headers["message"]
    assert error.headers["receipt-id"] == "r"


def test_subscribe_with_an_unknown_ack_mode_is_an_error() -> None:
    session = connected()
    session.frame_received(frame("SUBSCRIBE", id="s", destination="/queue/q", ack="sometimes"), NOW)
    error = error_of(session)
    assert "'sometimes'" in error.headers["message"]
    assert b"auto, client, client-individual" in error.body


def test_subscribe_needs_an_id_in_1_2() -> None:
    session = connected("1.2")
    session.frame_received(frame("SUBSCRIBE", destination="/queue/q"), NOW)
    assert error_of(session).headers["message"] == "SUBSCRIBE needs an id header"


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_subscribe_without_id_uses_the_destination_in_older_versions(version: str) -> None:
    session = connected(version)
    session.frame_received(frame("SUBSCRIBE", destination="/queue/q"), NOW)
    [(_, record)] = routes(session)
    assert isinstance(record, Subscribe)
    assert record.sub_id == "/queue/q"
    session.frame_received(frame("UNSUBSCRIBE", destination="/queue/q"), NOW)
    [(_, unsubscribe)] = routes(session)
    assert unsubscribe == Unsubscribe(CONN, record.sub, "")


def test_subscribe_to_a_bad_destination_is_an_error() -> None:
    session = connected()
    session.frame_received(frame("SUBSCRIBE", id="s", destination="/elsewhere/q"), NOW)
    assert "/elsewhere/q" in error_of(session).headers["message"]


def test_unsubscribe_goes_to_the_pipeline_of_the_subscription() -> None:
    session = connected()
    sub = subscribed(session, "s1", "/topic/t")
    session.frame_received(frame("UNSUBSCRIBE", id="s1", receipt="r"), NOW)
    assert routes(session) == [(TOPOLOGY.owner("/topic/t"), Unsubscribe(CONN, sub.sub, "r"))]
    assert not session.deliver(sub.sub, make_message(destination="/topic/t"))


def test_unsubscribe_of_an_unknown_id_is_an_error() -> None:
    session = connected()
    session.frame_received(frame("UNSUBSCRIBE", id="ghost", receipt="r"), NOW)
    error = error_of(session)
    assert error.headers["message"] == "no subscription with id 'ghost'"
    assert error.headers["receipt-id"] == "r"


def test_unsubscribe_without_id_is_an_error() -> None:
    session = connected()
    session.frame_received(frame("UNSUBSCRIBE"), NOW)
    assert error_of(session).headers["message"] == "UNSUBSCRIBE needs an id header"


def test_a_subscription_id_can_be_reused_after_unsubscribe() -> None:
    session = connected()
    first = subscribed(session, "s")
    session.frame_received(frame("UNSUBSCRIBE", id="s"), NOW)
    routes(session)
    second = subscribed(session, "s")
    assert second.sub != first.sub


# -- MESSAGE ---------------------------------------------------------------------------------


def test_deliver_writes_a_message_frame_for_the_subscription() -> None:
    session = connected()
    sub = subscribed(session, "s1", ack="client")
    message = make_message("m1", headers={"color": "blue", "content-type": "text/plain"})
    assert session.deliver(sub.sub, message)
    [msg] = frames(session)
    assert msg.command == "MESSAGE"
    assert msg.headers == {
        "subscription": "s1",
        "message-id": "m1",
        "destination": "/queue/q",
        "ack": f"{sub.sub}/m1",
        "color": "blue",
        "content-type": "text/plain",
        "content-length": "7",
    }
    assert msg.body == b"payload"


def test_auto_mode_messages_carry_no_ack_header() -> None:
    session = connected()
    sub = subscribed(session, ack="auto")
    session.deliver(sub.sub, make_message())
    [msg] = frames(session)
    assert "ack" not in msg.headers


def test_redelivered_messages_say_so() -> None:
    session = connected()
    sub = subscribed(session)
    session.deliver(sub.sub, make_message(redelivered=True))
    session.deliver(sub.sub, make_message("m2"))
    first, second = frames(session)
    assert first.headers["redelivered"] == "true"
    assert "redelivered" not in second.headers


def test_user_headers_cannot_override_the_brokers_message_headers() -> None:
    session = connected()
    sub = subscribed(session, "mine")
    spoof = {"subscription": "theirs", "message-id": "fake", "destination": "/queue/x"}
    session.deliver(sub.sub, make_message("real", headers=spoof))
    [msg] = frames(session)
    assert msg.headers["subscription"] == "mine"
    assert msg.headers["message-id"] == "real"
    assert msg.headers["destination"] == "/queue/q"


def test_header_values_survive_1_2_escaping() -> None:
    session = connected("1.2")
    sub = subscribed(session)
    value = "a:b\\c\nd"
    session.deliver(sub.sub, make_message(headers={"odd": value}))
    [msg] = frames(session)
    assert msg.headers["odd"] == value


_HEADER_TEXT = st.text(st.sampled_from("ab:\\\r\n é-"), max_size=6)


@settings(max_examples=300, deadline=None)
@given(
    version=st.sampled_from(["1.0", "1.1", "1.2"]),
    message_id=st.sampled_from(["ID-1-0.1-7", "m:1", "m\\2"]),
    destination=st.sampled_from(["/queue/q", "/queue/a:b", "/topic/x\\y"]),
    headers=st.dictionaries(
        _HEADER_TEXT | st.sampled_from(["message-id", "destination", "content-length", ""]),
        _HEADER_TEXT,
        max_size=4,
    ),
    redelivered=st.booleans(),
)
def test_message_frames_written_directly_are_those_encode_frame_writes(
    version: str, message_id: str, destination: str, headers: dict[str, str], redelivered: bool
) -> None:
    # The common MESSAGE is written without a Frame or encode_frame; whatever its headers,
    # the bytes are what the careful way through encode_frame writes.
    message = make_message(message_id, destination, headers=headers, redelivered=redelivered)
    careful = _message_tail_escaped(message, message.body, version)
    assert _message_tail(message, version) == careful


def test_a_colon_in_a_header_name_reaches_a_1_0_consumer_blanked() -> None:
    # A 1.2 producer may send the name "a\\cb" (a:b); 1.0 cannot escape it, and used to make
    # delivering the message raise ValueError out of the session, into the gateway.
    session = connected("1.0")
    sub = subscribed(session)
    assert session.deliver(sub.sub, make_message(headers={"a:b": "1", "x-next": "kept"}))
    [msg] = frames(session)
    assert msg.headers["a b"] == "1"
    assert msg.headers["x-next"] == "kept"


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_line_breaks_a_version_cannot_escape_are_blanked(version: str) -> None:
    session = connected(version)
    sub = subscribed(session)
    session.deliver(sub.sub, make_message(headers={"note": "one\r\ntwo", "x-next": "kept"}))
    [msg] = frames(session)
    assert msg.headers["note"] == "one  two"
    assert msg.headers["x-next"] == "kept"


def test_deliver_to_an_unknown_subscription_or_a_closing_session_writes_nothing() -> None:
    session = connected()
    sub = subscribed(session)
    assert not session.deliver(99, make_message())
    session.broker_stopping()
    error_of(session)
    assert not session.deliver(sub.sub, make_message())
    assert frames(session) == []


# -- ACK / NACK ------------------------------------------------------------------------------


@pytest.mark.parametrize(("command", "kind"), [("ACK", Ack), ("NACK", Nack)])
def test_1_2_ack_id_from_the_message_routes_to_the_subscriptions_pipeline(
    command: str, kind: type[Ack] | type[Nack]
) -> None:
    session = connected("1.2")
    sub = subscribed(session, "s1", "/topic/t", ack="client-individual")
    session.deliver(sub.sub, make_message("ID-x/y", "/topic/t"))
    ack_id = frames(session)[0].headers["ack"]
    session.frame_received(frame(command, id=ack_id, receipt="r"), NOW)
    assert routes(session) == [(TOPOLOGY.owner("/topic/t"), kind(CONN, sub.sub, "ID-x/y", "r"))]


@pytest.mark.parametrize("ack_id", ["nope", "99/m1", "1/", "/m1", "-1/m1", "x1/m1"])
def test_1_2_ack_with_an_id_matching_no_subscription_is_an_error(ack_id: str) -> None:
    session = connected("1.2")
    subscribed(session)
    session.frame_received(frame("ACK", id=ack_id, receipt="r"), NOW)
    error = error_of(session)
    assert repr(ack_id) in error.headers["message"]
    assert error.headers["receipt-id"] == "r"
    assert routes(session) == []


def test_1_2_ack_without_id_is_an_error() -> None:
    session = connected("1.2")
    subscribed(session)
    session.frame_received(frame("ACK", message_id="m1", subscription="s1"), NOW)
    message = error_of(session).headers["message"]
    assert message.startswith("ACK needs a") and message.endswith(" id header")


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_older_versions_ack_by_message_id_and_subscription(version: str) -> None:
    session = connected(version)
    first = subscribed(session, "a")
    second = subscribed(session, "b", "/topic/t")
    session.frame_received(frame("ACK", message_id="m1", subscription="b"), NOW)
    session.frame_received(frame("NACK", message_id="m2", subscription="a"), NOW)
    assert routes(session) == [
        (TOPOLOGY.owner("/topic/t"), Ack(CONN, second.sub, "m1", "")),
        (TOPOLOGY.owner("/queue/q"), Nack(CONN, first.sub, "m2", "")),
    ]


def test_older_versions_may_omit_the_subscription_when_there_is_only_one() -> None:
    session = connected("1.1")
    sub = subscribed(session)
    session.frame_received(frame("ACK", message_id="m1"), NOW)
    [(_, record)] = routes(session)
    assert record == Ack(CONN, sub.sub, "m1", "")


def test_older_versions_need_the_subscription_when_there_are_several() -> None:
    session = connected("1.1")
    subscribed(session, "a")
    subscribed(session, "b")
    session.frame_received(frame("ACK", message_id="m1"), NOW)
    assert "needs a subscription header" in error_of(session).headers["message"]


def test_older_versions_ack_for_an_unknown_subscription_is_an_error() -> None:
    session = connected("1.1")
    subscribed(session, "a")
    session.frame_received(frame("ACK", message_id="m1", subscription="zz"), NOW)
    assert error_of(session).headers["message"] == "no subscription with id 'zz'"


def test_older_versions_ack_without_message_id_is_an_error() -> None:
    session = connected("1.0")
    subscribed(session, "a")
    session.frame_received(frame("ACK", subscription="a"), NOW)
    assert error_of(session).headers["message"] == "ACK needs a message-id header"


# -- auto-ack credits ------------------------------------------------------------------------


def test_auto_deliveries_are_credited_once_handed_to_the_socket_per_pipeline() -> None:
    session = connected()
    q = subscribed(session, "q", "/queue/q", ack="auto")
    t = subscribed(session, "t", "/topic/t", ack="auto")
    c = subscribed(session, "c", "/queue/q", ack="client")
    for handle, n in ((q.sub, 3), (t.sub, 1), (c.sub, 2)):
        for i in range(n):
            session.deliver(handle, make_message(f"m{handle}-{i}"))
    output = session.take_output()
    assert len(output.data) == 3 * 2 + 1 * 2 + 2 * 3  # prefix (+ ack line) + the rest each
    # Taken, not yet written: still in their windows (the window bounds what the gateway
    # holds for a slow client).
    assert output.records == []
    session.data_sent()
    assert dict(session.take_output().records) == {
        TOPOLOGY.owner("/queue/q"): Credit(CONN, [(q.sub, 3)]),
        TOPOLOGY.owner("/topic/t"): Credit(CONN, [(t.sub, 1)]),
    }
    session.data_sent()
    assert not session.take_output()


def test_deliveries_made_after_the_bytes_were_taken_wait_for_their_own_write() -> None:
    session = connected()
    sub = subscribed(session, "q", ack="auto")
    session.deliver(sub.sub, make_message("m1"))
    session.take_output()
    session.deliver(sub.sub, make_message("m2"))  # not taken yet: not being written
    session.data_sent()
    assert session.take_output().records == [
        (TOPOLOGY.owner("/queue/q"), Credit(CONN, [(sub.sub, 1)]))
    ]
    session.data_sent()
    assert session.take_output().records == [
        (TOPOLOGY.owner("/queue/q"), Credit(CONN, [(sub.sub, 1)]))
    ]


def test_unsubscribe_credits_deliveries_taken_but_not_yet_written_first() -> None:
    session = connected()
    sub = subscribed(session, "q", ack="auto")
    session.deliver(sub.sub, make_message("m1"))
    assert session.take_output().data  # on its way to the socket
    session.deliver(sub.sub, make_message("m2"))
    session.frame_received(frame("UNSUBSCRIBE", id="q"), NOW)
    pipeline = TOPOLOGY.owner("/queue/q")
    assert routes(session) == [
        (pipeline, Credit(CONN, [(sub.sub, 2)])),
        (pipeline, Unsubscribe(CONN, sub.sub)),
    ]
    session.data_sent()  # nothing more to credit: they were
    assert routes(session) == []


def test_a_closed_session_registers_nothing_again_when_a_pipeline_restarts() -> None:
    session = connected()
    sub = subscribed(session, "q", "/queue/q", ack="client")
    pipeline = TOPOLOGY.owner("/queue/q")
    session.closed()
    assert routes(session) == [(pipeline, ConnClosed(CONN))]
    session.pipeline_restarted(pipeline)
    assert routes(session) == []
    assert not session.deliver(sub.sub, make_message())


# -- transactions ----------------------------------------------------------------------------


def test_transacted_sends_are_held_until_commit_then_routed_in_order() -> None:
    session = connected()
    session.frame_received(frame("BEGIN", transaction="tx", receipt="b"), NOW)
    session.frame_received(frame("SEND", b"1", destination="/queue/a", transaction="tx"), NOW)
    session.frame_received(frame("SEND", b"2", destination="/topic/b", transaction="tx"), NOW)
    assert [f.headers["receipt-id"] for f in frames(session)] == ["b"]
    assert routes(session) == []

    session.frame_received(frame("COMMIT", transaction="tx"), NOW)

    sent = routes(session)
    assert [(p, r.message.body) for p, r in sent if isinstance(r, Send)] == [
        (TOPOLOGY.owner("/queue/a"), b"1"),
        (TOPOLOGY.owner("/topic/b"), b"2"),
    ]
    assert all("transaction" not in r.message.headers for _, r in sent if isinstance(r, Send))
    session.frame_received(frame("COMMIT", transaction="tx"), NOW)  # it is gone
    assert error_of(session).headers["message"] == "no open transaction 'tx'"


def test_abort_discards_the_transaction_and_frees_its_budget() -> None:
    budget = TransactionBudget(100)
    session = new_session(budget=budget)
    session.frame_received(frame("CONNECT", accept_version="1.2"), NOW)
    session.frame_received(frame("BEGIN", transaction="tx"), NOW)
    session.frame_received(frame("SEND", b"x" * 40, destination="/queue/a", transaction="tx"), NOW)
    assert budget.used == 40
    session.frame_received(frame("ABORT", transaction="tx", receipt="r"), NOW)
    assert budget.used == 0
    assert routes(session) == []
    assert frames(session)[-1].headers["receipt-id"] == "r"


def test_commit_frees_the_budget() -> None:
    budget = TransactionBudget(100)
    session = new_session(budget=budget)
    session.frame_received(frame("CONNECT", accept_version="1.2"), NOW)
    session.frame_received(frame("BEGIN", transaction="tx"), NOW)
    session.frame_received(frame("SEND", b"x" * 40, destination="/queue/a", transaction="tx"), NOW)
    session.frame_received(frame("COMMIT", transaction="tx"), NOW)
    assert budget.used == 0


def test_with_reduce_strategy_none_the_send_that_does_not_fit_is_refused() -> None:
    budget = TransactionBudget(100, strategy=ReduceStrategy.NONE)
    one, two = begun(budget, 1), begun(budget, 2)
    one.frame_received(frame("SEND", b"x" * 60, destination="/queue/a", transaction="tx"), NOW)
    two.frame_received(
        frame("SEND", b"x" * 41, destination="/queue/a", transaction="tx", receipt="r"), 0
    )

    error = error_of(two)
    assert error.headers["message"] == (
        "ResourceAllocation: transactions max_uncommitted_bytes 100 reached"
    )
    assert b"'tx' would take this gateway's open transactions to 101 bytes" in error.body
    assert b"reduce_strategy none" in error.body
    assert error.headers["receipt-id"] == "r"
    assert budget.used == 60
    assert one.check_transactions(NOW) == "" and frames(one) == []  # untouched
    two.closed()
    assert budget.used == 60
    one.closed()
    assert budget.used == 0


def begun(budget: TransactionBudget, conn: int, *names: str) -> GatewaySession:
    """A connected session of `budget`'s gateway with open transactions `names` ("tx")."""
    session = new_session(budget=budget, conn=conn)
    session.frame_received(frame("CONNECT", accept_version="1.2"), NOW)
    for name in names or ("tx",):
        session.frame_received(frame("BEGIN", transaction=name), NOW)
    frames(session)
    return session


def test_another_connections_send_discards_the_largest_transaction_by_default() -> None:
    # The measurement: A holds a big transaction, B's small one used to be refused.
    budget = TransactionBudget(100)
    a, b = begun(budget, 1, "big"), begun(budget, 2, "small")
    a.frame_received(frame("SEND", b"x" * 90, destination="/queue/q", transaction="big"), NOW)
    b.frame_received(
        frame("SEND", b"y" * 20, destination="/queue/q", transaction="small", receipt="s"), NOW
    )

    assert [f.headers["receipt-id"] for f in frames(b)] == ["s"]  # B's SEND went in
    assert budget.used == 20 and budget.held_by(1) == 0
    assert budget.take_to_tell() == [1]
    # A hears of it the shell's next turn (its idle connection included).
    reason = a.check_transactions(NOW)
    error = error_of(a)
    assert (
        error.headers["message"]
        == reason
        == (
            "ResourceAllocation: transactions max_uncommitted_bytes 100 reached: "
            "transaction 'big' discarded by reduce_strategy max_bytes"
        )
    )
    assert b"held 90 bytes in 1 messages" in error.body
    assert "receipt-id" not in error.headers
    assert a.check_transactions(NOW) == ""  # reported once
    a.closed()
    # Nothing of A's transaction ever reaches a pipeline.
    assert not any(isinstance(r, Send) for _, r in routes(a))
    b.frame_received(frame("COMMIT", transaction="small"), NOW)
    assert [r.message.body for _, r in routes(b) if isinstance(r, Send)] == [b"y" * 20]
    assert budget.used == 0


def test_a_discarded_transaction_is_never_committed_even_before_the_shell_says_so() -> None:
    budget = TransactionBudget(100)
    a, b = begun(budget, 1, "big", "other"), begun(budget, 2)
    a.frame_received(frame("SEND", b"x" * 60, destination="/queue/q", transaction="big"), NOW)
    a.frame_received(frame("SEND", b"x" * 30, destination="/topic/t", transaction="other"), NOW)
    b.frame_received(frame("SEND", b"y" * 20, destination="/queue/q", transaction="tx"), NOW)
    # A's COMMIT comes before the shell had A check: the discard is said instead.
    a.frame_received(frame("COMMIT", transaction="big", receipt="c"), NOW)

    error = error_of(a)
    assert "transaction 'big' discarded by reduce_strategy max_bytes" in error.headers["message"]
    assert error.headers["receipt-id"] == "c"
    # Its connection closes, so its other transaction went with it (and is said to).
    assert b"other open transactions ('other') were rolled back" in error.body
    assert a.check_transactions(NOW) == error.headers["message"]  # for the shell's log
    a.closed()
    assert not any(isinstance(r, Send) for _, r in routes(a))
    assert budget.used == 20


def test_the_per_connection_limit_refuses_the_sender_and_discards_nothing() -> None:
    budget = TransactionBudget(100, per_connection=50)
    a, b = begun(budget, 1), begun(budget, 2)
    a.frame_received(frame("SEND", b"x" * 50, destination="/queue/q", transaction="tx"), NOW)
    b.frame_received(frame("SEND", b"y" * 30, destination="/queue/q", transaction="tx"), NOW)
    b.frame_received(frame("SEND", b"y" * 21, destination="/queue/q", transaction="tx"), NOW)

    error = error_of(b)
    assert error.headers["message"] == (
        "ResourceAllocation: transactions max_uncommitted_bytes_per_connection 50 reached"
    )
    assert b"to 51 bytes" in error.body
    assert a.check_transactions(NOW) == "" and frames(a) == []
    assert budget.take_to_tell() == []


def test_a_transaction_open_longer_than_the_timeout_is_rolled_back() -> None:
    budget = TransactionBudget(1000, timeout_ms=5000)
    session = new_session(budget=budget)
    session.frame_received(frame("CONNECT", accept_version="1.2"), NOW)
    session.frame_received(frame("BEGIN", transaction="slow"), NOW)
    session.frame_received(frame("SEND", b"x", destination="/queue/q", transaction="slow"), NOW)
    frames(session)

    assert session.check_transactions(NOW + 5000) == ""  # not longer yet
    assert frames(session) == []
    reason = session.check_transactions(NOW + 5001)  # the shell's loop, the client idle
    assert reason == (
        "ResourceAllocation: transactions timeout_ms 5000 reached: "
        "transaction 'slow' rolled back after 5001 ms open"
    )
    assert error_of(session).headers["message"] == reason
    session.closed()
    assert not any(isinstance(r, Send) for _, r in routes(session))
    assert budget.used == 0


def test_a_frame_after_the_timeout_gets_the_timeout_error_not_a_commit() -> None:
    budget = TransactionBudget(1000, timeout_ms=5000)
    session = new_session(budget=budget)
    session.frame_received(frame("CONNECT", accept_version="1.2"), NOW)
    session.frame_received(frame("BEGIN", transaction="slow"), NOW)
    session.frame_received(frame("SEND", b"x", destination="/queue/q", transaction="slow"), NOW)
    frames(session)
    session.frame_received(frame("COMMIT", transaction="slow", receipt="c"), NOW + 6000)
    error = error_of(session)
    assert "timeout_ms 5000 reached: transaction 'slow'" in error.headers["message"]
    assert routes(session) == []


def test_max_open_transactions_per_connection_is_enforced() -> None:
    config = replace_settings(Config(), "transactions", max_open_per_connection=2)
    session = connected(config=config)
    session.frame_received(frame("BEGIN", transaction="a"), NOW)
    session.frame_received(frame("BEGIN", transaction="b"), NOW)
    session.frame_received(frame("BEGIN", transaction="c"), NOW)
    assert "max_open_per_connection 2" in error_of(session).headers["message"]


def test_begin_of_an_open_transaction_is_an_error() -> None:
    session = connected()
    session.frame_received(frame("BEGIN", transaction="a"), NOW)
    session.frame_received(frame("BEGIN", transaction="a"), NOW)
    assert error_of(session).headers["message"] == "transaction 'a' is already open"


@pytest.mark.parametrize("command", ["COMMIT", "ABORT"])
def test_commit_or_abort_of_an_unknown_transaction_is_an_error(command: str) -> None:
    session = connected()
    session.frame_received(frame(command, transaction="nope", receipt="r"), NOW)
    error = error_of(session)
    assert error.headers["message"] == "no open transaction 'nope'"
    assert error.headers["receipt-id"] == "r"


@pytest.mark.parametrize("command", ["BEGIN", "COMMIT", "ABORT"])
def test_transaction_frames_need_a_transaction_header(command: str) -> None:
    session = connected()
    session.frame_received(frame(command), NOW)
    assert error_of(session).headers["message"] == f"{command} needs a transaction header"


def test_send_in_an_unknown_transaction_is_an_error() -> None:
    session = connected()
    session.frame_received(frame("SEND", destination="/queue/q", transaction="nope"), NOW)
    assert error_of(session).headers["message"] == "no open transaction 'nope'"
    assert routes(session) == []


def test_transacted_acks_are_held_until_commit() -> None:
    session = connected()
    sub = subscribed(session)
    session.frame_received(frame("BEGIN", transaction="tx"), NOW)
    session.frame_received(frame("ACK", id=f"{sub.sub}/m1", transaction="tx"), NOW)
    assert routes(session) == []
    session.frame_received(frame("COMMIT", transaction="tx"), NOW)
    assert routes(session) == [(TOPOLOGY.owner("/queue/q"), Ack(CONN, sub.sub, "m1", ""))]


def test_commit_receipt_waits_for_every_pipeline_the_transaction_touched() -> None:
    session = connected()
    session.frame_received(frame("BEGIN", transaction="tx"), NOW)
    for destination in ("/queue/a", "/topic/b"):
        session.frame_received(frame("SEND", destination=destination, transaction="tx"), NOW)
    session.frame_received(frame("COMMIT", transaction="tx", receipt="done"), NOW)
    barriers = [(p, r) for p, r in routes(session) if isinstance(r, Barrier)]
    pipelines = sorted({TOPOLOGY.owner("/queue/a"), TOPOLOGY.owner("/topic/b")})
    assert [p for p, _ in barriers] == pipelines
    token = barriers[0][1].token
    assert all(r == Barrier(CONN, token) for _, r in barriers)

    session.barrier_done(token, pipelines[0])
    assert frames(session) == []
    session.barrier_done(token, pipelines[1])
    [receipt] = frames(session)
    assert (receipt.command, receipt.headers) == ("RECEIPT", {"receipt-id": "done"})
    assert session.state is SessionState.CONNECTED


def test_commit_of_an_empty_transaction_answers_the_receipt_at_once() -> None:
    session = connected()
    session.frame_received(frame("BEGIN", transaction="tx"), NOW)
    session.frame_received(frame("COMMIT", transaction="tx", receipt="r"), NOW)
    assert [f.headers.get("receipt-id") for f in frames(session)] == ["r"]
    assert routes(session) == []


# -- DISCONNECT ------------------------------------------------------------------------------


def test_disconnect_without_receipt_closes_at_once() -> None:
    session = connected()
    session.frame_received(frame("DISCONNECT"), NOW)
    assert session.state is SessionState.CLOSING
    assert frames(session) == []


def test_disconnect_receipt_before_any_traffic_is_immediate() -> None:
    session = connected()
    session.frame_received(frame("DISCONNECT", receipt="bye"), NOW)
    [receipt] = frames(session)
    assert receipt.headers == {"receipt-id": "bye"}
    assert session.state is SessionState.CLOSING


def test_disconnect_receipt_waits_for_every_touched_pipeline() -> None:
    session = connected()
    subscribed(session, "s", "/topic/t")
    session.frame_received(frame("SEND", destination="/queue/a"), NOW)
    session.frame_received(frame("SEND", destination="/queue/b"), NOW)
    routes(session)
    touched = sorted({TOPOLOGY.owner(d) for d in ("/topic/t", "/queue/a", "/queue/b")})

    session.frame_received(frame("DISCONNECT", receipt="bye"), NOW)

    barriers = routes(session)
    assert [p for p, _ in barriers] == touched
    [token] = {r.token for _, r in barriers if isinstance(r, Barrier)}
    assert session.state is SessionState.DISCONNECTING
    assert not session.accepts_frames()
    assert not session.is_ending()
    for pipeline in touched[:-1]:
        session.barrier_done(token, pipeline)
        session.barrier_done(token, pipeline)  # a repeat answer counts once
    assert frames(session) == []
    assert session.state is SessionState.DISCONNECTING
    session.barrier_done(token + 1, touched[-1])  # another token
    assert frames(session) == []
    session.barrier_done(token, touched[-1])
    assert frames(session)[0].headers == {"receipt-id": "bye"}
    assert session.state is SessionState.CLOSING


# -- a pipeline that restarts owes what it took with it -----------------------------------


def restart_probe(session: GatewaySession, pipeline: int) -> Barrier:
    """`pipeline` restarts: the probe the session sends it (the only record)."""
    assert session.pipeline_restarted(pipeline) == ""
    [(to, probe)] = routes(session)
    assert to == pipeline and isinstance(probe, Barrier)
    return probe


def test_a_receipt_a_dead_pipeline_owed_is_answered_by_an_error_in_doubt() -> None:
    """What the new incarnation found in its ring is answered before the probe is: what is
    still owed then was taken by the dead one."""
    session = connected()
    session.frame_received(frame("SEND", b"1", destination="/queue/a", receipt="r1"), NOW)
    [(pipeline, send)] = routes(session)
    assert isinstance(send, Send) and send.receipt == "r1"
    probe = restart_probe(session, pipeline)
    assert session.state is SessionState.CONNECTED
    assert session.barrier_done(probe.token, pipeline) == (
        "receipt 'r1' in doubt: a broker worker restarted before answering it"
    )
    error = error_of(session)
    assert error.headers["receipt-id"] == "r1"
    assert "may or may not have been handled" in error.body.decode()


def test_a_receipt_answered_before_the_probe_was_the_new_incarnations() -> None:
    """A frame sent after the worker died waits in its ring for the successor: answered
    before the probe, it was handled, not lost."""
    session = connected()
    session.frame_received(frame("SEND", destination="/queue/a", receipt="r1"), NOW)
    [(pipeline, _)] = routes(session)
    probe = restart_probe(session, pipeline)
    session.receipt("r1", pipeline)
    assert session.barrier_done(probe.token, pipeline) == ""
    assert [f.headers["receipt-id"] for f in frames(session)] == ["r1"]
    assert session.state is SessionState.CONNECTED


def test_a_receipt_already_answered_is_not_in_doubt() -> None:
    session = connected()
    session.frame_received(frame("SEND", destination="/queue/a", receipt="r1"), NOW)
    session.frame_received(frame("SEND", destination="/queue/a", receipt="r2"), NOW)
    [(pipeline, _), _] = routes(session)
    session.receipt("r1", pipeline)
    assert [f.headers["receipt-id"] for f in frames(session)] == ["r1"]
    session.receipt("r2", pipeline)
    frames(session)
    assert session.pipeline_restarted(pipeline) == ""
    assert session.state is SessionState.CONNECTED


def test_one_receipt_id_on_two_frames_stays_owed_until_both_are_answered() -> None:
    session = connected()
    for _ in range(2):
        session.frame_received(frame("SEND", destination="/queue/a", receipt="r"), NOW)
    [(pipeline, _), _] = routes(session)
    session.receipt("r", pipeline)
    frames(session)
    probe = restart_probe(session, pipeline)
    assert session.barrier_done(probe.token, pipeline).startswith("receipt 'r' in doubt")


def test_one_receipt_id_sent_to_two_pipelines_is_owed_by_each() -> None:
    session = connected()
    session.frame_received(frame("SEND", destination="/queue/a", receipt="r"), NOW)
    session.frame_received(frame("SEND", destination="/topic/b", receipt="r"), NOW)
    [(queue, _), (topic, _)] = routes(session)
    assert queue != topic
    session.receipt("r", topic)  # the topic's answer does not pay the queue's
    frames(session)
    probe = restart_probe(session, queue)
    assert session.barrier_done(probe.token, queue).startswith("receipt 'r' in doubt")


def test_a_commit_receipt_waiting_on_a_restarted_pipeline_is_in_doubt() -> None:
    """Its SENDs reached the dead pipeline with the Barrier after them: any of them may
    have died in its commit buffer, so the new one's answer would promise too much."""
    session = connected()
    session.frame_received(frame("BEGIN", transaction="tx"), NOW)
    session.frame_received(frame("SEND", destination="/queue/a", transaction="tx"), NOW)
    session.frame_received(frame("COMMIT", transaction="tx", receipt="done"), NOW)
    pipeline = next(p for p, r in routes(session) if isinstance(r, Barrier))
    session.pipeline_restarted(pipeline)
    error = error_of(session)
    assert error.headers["receipt-id"] == "done"
    assert "in doubt" in error.headers["message"]


def test_a_pipeline_that_starts_for_the_first_time_puts_nothing_in_doubt() -> None:
    session = connected()
    session.frame_received(frame("SEND", destination="/queue/a", receipt="r"), NOW)
    [(pipeline, _)] = routes(session)
    assert session.pipeline_restarted(pipeline, replaced=False) == ""
    assert session.state is SessionState.CONNECTED
    session.frame_received(frame("DISCONNECT", receipt="bye"), NOW)
    assert any(isinstance(r, Barrier) for _, r in routes(session))


def test_a_restart_of_another_pipeline_changes_nothing() -> None:
    session = connected()
    sub = subscribed(session, "s", "/queue/a")
    session.frame_received(frame("SEND", destination="/queue/a", receipt="r"), NOW)
    routes(session)
    other = next(p for p in range(5) if p != TOPOLOGY.owner("/queue/a"))
    assert session.pipeline_restarted(other) == ""
    assert routes(session) == []
    assert session.state is SessionState.CONNECTED
    own = TOPOLOGY.owner("/queue/a")
    session.pipeline_restarted(own)
    [probe] = [r for _, r in routes(session) if isinstance(r, Barrier)]
    session.barrier_done(probe.token, own)
    assert error_of(session).headers["receipt-id"] == "r"
    assert not session.deliver(sub.sub, make_message())


def test_a_disconnect_receipt_after_a_pipeline_restarted_is_in_doubt() -> None:
    """Frames sent without a receipt may have died with the pipeline: a DISCONNECT receipt
    promises they were all handled, which nobody can promise any more."""
    session = connected()
    sub = subscribed(session, "s", "/queue/a")
    session.frame_received(frame("SEND", destination="/queue/a"), NOW)
    routes(session)
    assert session.pipeline_restarted(sub_pipeline := TOPOLOGY.owner("/queue/a")) == ""
    assert routes(session) == [(sub_pipeline, sub)]  # registered again
    session.frame_received(frame("DISCONNECT", receipt="bye"), NOW)
    error = error_of(session)
    assert error.headers["receipt-id"] == "bye"
    assert "in doubt" in error.headers["message"]


def test_no_frame_is_read_after_disconnect() -> None:
    session = connected()
    session.frame_received(frame("SEND", destination="/queue/a"), NOW)
    routes(session)
    session.frame_received(frame("DISCONNECT", receipt="bye"), NOW)
    routes(session)
    assert not session.accepts_frames()
    with pytest.raises(SessionStateError, match="in state disconnecting"):
        session.frame_received(frame("SEND", destination="/queue/a"), NOW)
    assert routes(session) == []


def test_disconnect_aborts_open_transactions() -> None:
    budget = TransactionBudget(100)
    session = new_session(budget=budget)
    session.frame_received(frame("CONNECT", accept_version="1.2"), NOW)
    session.frame_received(frame("BEGIN", transaction="tx"), NOW)
    session.frame_received(frame("SEND", b"x" * 10, destination="/queue/a", transaction="tx"), NOW)
    session.frame_received(frame("DISCONNECT"), NOW)
    assert budget.used == 0
    assert routes(session) == []
    session.closed()
    assert routes(session) == []  # nothing was ever routed: no pipeline to tell


# -- pipeline side ---------------------------------------------------------------------------


def test_a_restarted_pipeline_gets_again_the_subscriptions_what_a_restarted_pipeline_owned() -> (
    None
):
    session = connected()
    queue_sub = subscribed(session, "q", "/queue/q", ack="client")
    subscribed(session, "t", "/topic/t")
    pipeline = TOPOLOGY.owner("/queue/q")
    session.pipeline_restarted(pipeline)
    assert routes(session) == [
        (pipeline, Subscribe(CONN, queue_sub.sub, "q", "/queue/q", ACK_CLIENT, 1000)),
    ]


def test_a_disconnect_receipt_waiting_on_a_restarted_pipeline_is_in_doubt() -> None:
    session = connected()
    session.frame_received(frame("SEND", destination="/queue/q"), NOW)
    session.frame_received(frame("DISCONNECT", receipt="bye"), NOW)
    [(pipeline, _)] = [(p, r) for p, r in routes(session) if isinstance(r, Barrier)]
    assert session.state is SessionState.DISCONNECTING
    assert session.pipeline_restarted(pipeline + 1) == ""
    assert routes(session) == []
    session.pipeline_restarted(pipeline)
    assert error_of(session).headers["receipt-id"] == "bye"


def test_closing_tells_every_touched_pipeline_last_and_once() -> None:
    session = connected()
    for destination in ("/topic/t", "/queue/a", "/queue/b"):
        session.frame_received(frame("SEND", destination=destination), NOW)
    routes(session)
    expected = sorted(TOPOLOGY.owner(d) for d in ("/topic/t", "/queue/a", "/queue/b"))
    session.closed()
    assert routes(session) == [(p, ConnClosed(CONN)) for p in sorted(set(expected))]
    assert session.state is SessionState.CLOSED
    session.closed()
    assert routes(session) == []


def test_a_refused_record_becomes_an_error_with_its_receipt() -> None:
    session = connected()
    session.refused(Refuse(CONN, "ResourceAllocation: /queue/q full", "drain it", "r5"), 0)
    error = error_of(session)
    assert error.headers == {
        "message": "ResourceAllocation: /queue/q full",
        "receipt-id": "r5",
        "content-type": "text/plain",
        "content-length": "9",
    }
    assert error.body == b"drain it\n"


def test_receipts_from_pipelines_become_receipt_frames_until_closing() -> None:
    session = connected()
    session.receipt("r1", 0)
    assert frames(session)[0].headers == {"receipt-id": "r1"}
    session.broker_stopping()
    frames(session)
    session.receipt("r2", 0)
    assert frames(session) == []


def test_only_the_first_error_is_written() -> None:
    session = connected()
    session.broker_stopping()
    session.timed_out(2.0)
    [error] = frames(session)
    assert error.headers == {"message": "broker is shutting down"}
    assert error.body == b""
    assert session.state is SessionState.CLOSING


# -- regressions -----------------------------------------------------------------------------


def test_a_transacted_send_is_receipted_once() -> None:
    session = connected()
    session.frame_received(frame("BEGIN", transaction="tx"), NOW)
    session.frame_received(
        frame("SEND", destination="/queue/a", transaction="tx", receipt="r"), NOW
    )
    assert [f.headers["receipt-id"] for f in frames(session)] == ["r"]
    session.frame_received(frame("COMMIT", transaction="tx"), NOW)
    [(_, record)] = routes(session)
    assert isinstance(record, Send) and record.receipt == ""


def test_ack_id_with_a_non_ascii_digit_handle_is_an_error_frame() -> None:
    session = connected("1.2")
    subscribed(session)
    session.frame_received(frame("ACK", id="\u00b2/m1", receipt="r"), NOW)
    assert "matches no message" in error_of(session).headers["message"]


def test_transaction_budget_counts_header_bytes_too() -> None:
    budget = TransactionBudget(100)
    session = new_session(budget=budget)
    session.frame_received(frame("CONNECT", accept_version="1.2"), NOW)
    session.frame_received(frame("BEGIN", transaction="tx"), NOW)
    frames(session)
    while session.accepts_frames():
        session.frame_received(
            frame("SEND", destination="/queue/a", transaction="tx", big="x" * 500), NOW
        )
    assert "max_uncommitted_bytes 100" in error_of(session).headers["message"]


def test_unsubscribe_credits_auto_deliveries_still_to_be_written_first() -> None:
    session = connected()
    sub = subscribed(session, "s", "/queue/q", ack="auto")
    assert session.deliver(sub.sub, make_message("m1"))
    session.frame_received(frame("UNSUBSCRIBE", id="s"), NOW)
    pipeline = TOPOLOGY.owner("/queue/q")
    # Credited before the Unsubscribe (the pipeline would put it back otherwise), and once.
    assert routes(session) == [
        (pipeline, Credit(CONN, [(sub.sub, 1)])),
        (pipeline, Unsubscribe(CONN, sub.sub)),
    ]


def test_deliveries_not_taken_when_the_client_goes_are_not_credited() -> None:
    session = connected()
    sub = subscribed(session, "s", "/queue/q", ack="auto")
    assert session.deliver(sub.sub, make_message("m1"))
    session.closed()
    output = session.take_output()
    assert output.data == []
    assert output.records == [(TOPOLOGY.owner("/queue/q"), ConnClosed(CONN))]


def test_version_error_lists_the_supported_versions_in_a_version_header() -> None:
    session = new_session()
    session.frame_received(frame("CONNECT", accept_version="2.0"), NOW)
    assert error_of(session).headers.get("version") == "1.0,1.1,1.2"


@pytest.mark.parametrize(
    "forged",
    [
        "ack",
        "redelivered",
        "message-id",
        "subscription",
        "JMSXDeliveryCount",
        "original-destination",
        "dead-letter-reason",
        "expired-from",
    ],
)
def test_a_producer_cannot_forge_broker_headers(forged: str) -> None:
    session = connected()
    session.frame_received(
        frame("SEND", destination="/queue/a", kept="yes", **{forged: "forged"}), NOW
    )
    [(_, record)] = routes(session)
    assert isinstance(record, Send) and forged not in record.message.headers
    assert record.message.headers["kept"] == "yes"


# -- compression -----------------------------------------------------------------------------

BIG_TEXT = b"".join(
    b'{"order": %d, "status": "shipped", "city": "lisbon"},\n' % i for i in range(60)
)


def compressing(threshold: int = 1024, codec: str = "zstd", version: str = "1.2") -> GatewaySession:
    config = replace_settings(Config(), "compression", threshold_bytes=threshold, codec=codec)
    return connected(version, config=config)


def sent_message(session: GatewaySession, body: bytes, **headers: str) -> Message:
    session.frame_received(frame("SEND", body, destination="/queue/q", **headers), NOW)
    [(_, record)] = routes(session)
    assert isinstance(record, Send)
    return record.message


@pytest.mark.parametrize("codec", ["zstd", "zlib"])
def test_a_body_over_the_threshold_is_compressed_with_the_configured_codec(codec: str) -> None:
    session = compressing(1024, codec)
    body = BIG_TEXT[:1025]
    message = sent_message(session, body, persistent="true")
    assert message.encoding == codec
    assert len(message.body) < len(body) / 2
    assert decompress(message.body, codec) == body
    assert message.persistent and message.headers == {"persistent": "true"}


def test_a_body_at_or_under_the_threshold_is_not_compressed() -> None:
    session = compressing(1024)
    for body in (BIG_TEXT[:1024], BIG_TEXT[:100], b""):
        message = sent_message(session, body)
        assert (message.body, message.encoding) == (body, "")


def test_compression_is_off_by_default() -> None:
    assert Config().compression.threshold_bytes == -1
    message = sent_message(connected(), BIG_TEXT)
    assert (message.body, message.encoding) == (BIG_TEXT, "")


def test_threshold_zero_compresses_every_body_that_shrinks() -> None:
    session = compressing(0)
    assert sent_message(session, BIG_TEXT).encoding == "zstd"
    assert sent_message(session, b"").encoding == ""


def test_a_body_compression_does_not_shrink_is_sent_as_it_came() -> None:
    session = compressing(1024)
    noise = random.Random(7).randbytes(8192)
    message = sent_message(session, noise)
    assert (message.body, message.encoding) == (noise, "")


def test_the_message_size_counts_the_compressed_bytes() -> None:
    session = compressing(1024)
    message = sent_message(session, BIG_TEXT, color="blue")
    assert message_size(message) == len(message.body) + len("color") + len("blue")
    assert message_size(message) < len(BIG_TEXT) / 2


def test_a_transaction_holds_and_charges_the_compressed_message() -> None:
    config = replace_settings(Config(), "compression", threshold_bytes=1024)
    budget = TransactionBudget(1000)
    session = new_session(config, budget)
    session.frame_received(frame("CONNECT", accept_version="1.2"), NOW)
    session.frame_received(frame("BEGIN", transaction="tx"), NOW)
    # Larger than the whole budget as sent; it fits compressed.
    assert len(BIG_TEXT) > budget.limit
    session.frame_received(frame("SEND", BIG_TEXT, destination="/queue/a", transaction="tx"), NOW)
    assert session.state is SessionState.CONNECTED
    assert 0 < budget.used < len(BIG_TEXT) / 2
    session.frame_received(frame("COMMIT", transaction="tx"), NOW)
    [(_, record)] = routes(session)
    assert isinstance(record, Send)
    assert record.message.encoding == "zstd" and budget.used == 0
    assert message_size(record.message) < len(BIG_TEXT) / 2


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_the_message_frame_carries_the_original_body_and_length(version: str) -> None:
    sender = compressing(1024)
    message = sent_message(sender, BIG_TEXT, content_type="application/json")
    assert message.encoding == "zstd"
    session = connected(version)
    sub = subscribed(session, ack="client")
    assert session.deliver(sub.sub, message)
    [msg] = frames(session)
    assert msg.body == BIG_TEXT
    assert msg.headers["content-length"] == str(len(BIG_TEXT))
    assert msg.headers["content-type"] == "application/json"


def test_a_fan_out_decompresses_once_per_protocol_version() -> None:
    message = sent_message(compressing(1024), BIG_TEXT)
    shared: dict[str, bytes] = {}
    sessions = [connected(v) for v in ("1.2", "1.1", "1.2")]
    for session in sessions:
        sub = subscribed(session, "s", "/topic/t", ack="auto")
        assert session.deliver(sub.sub, message, shared)
        [msg] = frames(session)
        assert msg.body == BIG_TEXT
    assert sorted(shared) == ["1.1", "1.2"]


def test_a_body_that_does_not_decompress_is_an_error_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = sent_message(compressing(1024), BIG_TEXT)
    damaged = msgspec.structs.replace(good, body=good.body[:-8], message_id="ID-broken")
    shared: dict[str, bytes] = {}
    sessions = [connected(), connected()]
    handles = [subscribed(s, "s", "/queue/q", ack="auto").sub for s in sessions]
    with caplog.at_level(logging.ERROR, logger="mpbroker.gateway"):
        for session, handle in zip(sessions, handles, strict=True):
            # True: the session has an ERROR to write.
            assert session.deliver(handle, damaged, shared)
    [record] = caplog.records
    assert "ID-broken" in record.getMessage() and "/queue/q" in record.getMessage()
    assert "zstd body does not decompress" in record.getMessage()
    for session in sessions:
        error = error_of(session)
        assert error.headers["message"] == (
            "message ID-broken cannot be delivered: its stored body is damaged"
        )
        assert b"zstd body of message ID-broken from /queue/q" in error.body
        # Not written, so not credited: the pipeline takes it back like any unsent delivery.
        assert routes(session) == []
        assert not session.deliver(handles[0], good)


def test_a_body_above_max_message_bytes_is_refused_with_its_receipt() -> None:
    config = replace_settings(Config(), "memory", max_message_bytes=100)
    session = connected(config=config)
    session.frame_received(frame("SEND", b"x" * 100, destination="/queue/q", receipt="ok"), 0)
    assert session.state is SessionState.CONNECTED
    session.frame_received(frame("SEND", b"x" * 101, destination="/queue/q", receipt="big"), 0)
    error = error_of(session)
    assert error.headers["message"] == "message body of 101 bytes exceeds max_message_bytes 100"
    assert error.headers["receipt-id"] == "big"


# -- access control ------------------------------------------------------------------------

ACL = AccessControl(
    [
        AclEntry("/queue/orders.*", write=("alice",), read=("bob",)),
        AclEntry("/topic/news", read=("bob",), admin=("group:admin",)),
    ]
)


def as_user(user: str, *groups: str, client_id: str = "") -> GatewaySession:
    session = new_session()
    session.access = ACL
    session.user, session.groups = user, groups
    headers = {"client_id": client_id} if client_id else {}
    session.frame_received(frame("CONNECT", accept_version="1.2", host="h", **headers), NOW)
    assert frames(session)[0].command == "CONNECTED"
    return session


def test_a_send_the_user_may_not_write_is_refused_naming_user_and_destination() -> None:
    session = as_user("alice")
    session.frame_received(frame("SEND", destination="/queue/orders.eu", receipt="ok"), NOW)
    assert [r.message.destination for _, r in routes(session) if isinstance(r, Send)] == [
        "/queue/orders.eu"
    ]
    assert session.denial == ""
    session.frame_received(frame("SEND", destination="/queue/payments", receipt="r"), NOW)
    error = error_of(session)
    message = "access denied: user alice may not write /queue/payments"
    assert (error.headers["message"], error.headers["receipt-id"]) == (message, "r")
    assert session.denial == message  # for the shell's log
    assert routes(session) == []


def test_the_shell_asks_before_flow_control_whether_a_send_may_be_written() -> None:
    session = as_user("alice")
    assert not session.refuses_send(frame("SEND", destination="/queue/orders.eu"))
    assert not session.refuses_send(frame("ACK", id="1"))
    assert frames(session) == []
    assert session.refuses_send(frame("SEND", destination="/queue/payments", receipt="r"))
    error = error_of(session)
    assert error.headers["receipt-id"] == "r"
    assert session.denial == "access denied: user alice may not write /queue/payments"


def test_a_send_in_a_transaction_is_checked_when_it_is_sent() -> None:
    session = as_user("alice")
    session.frame_received(frame("BEGIN", transaction="tx"), NOW)
    session.frame_received(frame("SEND", destination="/queue/payments", transaction="tx"), NOW)
    assert "may not write /queue/payments" in error_of(session).headers["message"]


def test_subscribe_needs_read_and_a_durable_one_admin_too() -> None:
    bob = as_user("bob", client_id="app")
    bob.frame_received(frame("SUBSCRIBE", id="q", destination="/queue/orders.eu"), NOW)
    bob.frame_received(frame("SUBSCRIBE", id="t", destination="/topic/news"), NOW)
    assert len(routes(bob)) == 2
    bob.frame_received(frame("SUBSCRIBE", id="d", destination="/topic/news", durable="true"), NOW)
    assert error_of(bob).headers["message"] == "access denied: user bob may not admin /topic/news"
    alice = as_user("alice")
    alice.frame_received(frame("SUBSCRIBE", id="q", destination="/queue/orders.eu"), NOW)
    assert "user alice may not read /queue/orders.eu" in error_of(alice).headers["message"]


def test_a_durable_subscription_registered_again_carries_its_user() -> None:
    """A restarted pubsub worker checks the owner again: without the user it would refuse
    the owner's own subscription."""
    session = as_user("bob", "admin", client_id="app")
    session.frame_received(
        frame("SUBSCRIBE", id="d", destination="/topic/news", durable="true"), NOW
    )
    session.frame_received(frame("SUBSCRIBE", id="t", destination="/topic/news"), NOW)
    routes(session)
    session.pipeline_restarted(TOPOLOGY.owner("/topic/news"))
    again = {r.sub_id: r.user for _, r in routes(session) if isinstance(r, Subscribe)}
    assert again == {"d": "bob", "t": ""}


def test_a_durable_subscription_carries_its_user() -> None:
    admin = as_user("bob", "admin", client_id="app")
    admin.frame_received(frame("SUBSCRIBE", id="d", destination="/topic/news", durable="true"), NOW)
    [(_, record)] = routes(admin)
    assert isinstance(record, Subscribe)
    assert (record.durable, record.user) == ("app/d", "bob")
    admin.frame_received(frame("SUBSCRIBE", id="t", destination="/topic/news"), NOW)
    [(_, plain)] = routes(admin)
    assert isinstance(plain, Subscribe) and plain.user == ""


def test_removing_a_durable_subscription_needs_admin() -> None:
    for remove in (False, True):
        session = as_user("bob", "admin", client_id="app")
        session.frame_received(
            frame("SUBSCRIBE", id="d", destination="/topic/news", durable="true"), NOW
        )
        routes(session)
        session.access = AccessControl([AclEntry("/topic/news", read=("bob",))])  # reloaded
        headers = {"durable": "true"} if remove else {}
        session.frame_received(Frame("UNSUBSCRIBE", {"id": "d", **headers}), NOW)
        if remove:
            assert "may not admin /topic/news" in error_of(session).headers["message"]
            assert routes(session) == []
        else:  # leaving it for later is not removing it
            [(_, record)] = routes(session)
            assert isinstance(record, Unsubscribe) and not record.remove_durable


def test_the_reloaded_permissions_apply_from_the_next_frame() -> None:
    session = as_user("alice")
    session.frame_received(frame("SEND", destination="/queue/orders.eu"), NOW)
    assert len(routes(session)) == 1
    session.access = AccessControl([AclEntry("/queue/orders.*", read=("alice",))])
    session.frame_received(frame("SEND", destination="/queue/orders.eu"), NOW)
    assert "may not write /queue/orders.eu" in error_of(session).headers["message"]


def test_a_connection_without_a_user_is_anonymous_to_the_acl() -> None:
    session = as_user("")
    session.frame_received(frame("SEND", destination="/queue/orders.eu"), NOW)
    assert error_of(session).headers["message"] == (
        "access denied: user anonymous may not write /queue/orders.eu"
    )


@pytest.mark.parametrize(
    "headers",
    [{"durable": "true"}, {"activemq.subscriptionName": "n"}, {"durable-subscription-name": "n"}],
)
def test_a_durable_subscription_without_a_client_id_is_refused(headers: dict[str, str]) -> None:
    session = connected()
    session.frame_received(
        Frame("SUBSCRIBE", {"id": "s", "destination": "/topic/t", **headers}), NOW
    )
    error = error_of(session)
    assert "needs a client-id header in CONNECT" in error.headers["message"]
    assert routes(session) == []
