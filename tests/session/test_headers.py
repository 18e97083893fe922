"""The header table (docs/headers.md) as the session applies it: every header it refuses is
refused by name with nothing of the frame taking effect, the harmless ones are noted once,
the broker's own are dropped from a SEND, and the ones it honours on conditions keep them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpbroker.records import Send, Subscribe, Unsubscribe
from mpbroker.session import GatewaySession, SessionState
from mpbroker.session._headers import FAMILIES, FRAMES, RULES, HeaderRule, markdown_table, rule_for
from mpbroker.stomp import CLIENT_COMMANDS, Frame
from tests.session.test_session import (
    NOW,
    _forget_taken,  # noqa: F401  (the autouse fixture the helpers below rely on)
    connected,
    error_of,
    frames,
    new_session,
    routes,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "headers.md"

# A frame of each command that the session would take, given its own headers (a durable
# subscription needs a client-id, which `session_for` gives every connection).
_BASE: dict[str, dict[str, str]] = {
    "CONNECT": {"accept-version": "1.2", "host": "h"},
    "SEND": {"destination": "/queue/q"},
    "SUBSCRIBE": {"destination": "/queue/q", "id": "s9"},
    "UNSUBSCRIBE": {"id": "s1"},
    "ACK": {"id": "1/ID-1"},
    "NACK": {"id": "1/ID-1"},
    "BEGIN": {"transaction": "t9"},
    "COMMIT": {"transaction": "t1"},
    "ABORT": {"transaction": "t1"},
    "DISCONNECT": {},
}


def session_for(command: str) -> GatewaySession:
    """A session where a `command` frame with `_BASE`'s headers is accepted: connected
    (unless the frame is the CONNECT), with subscription s1 (handle 1) and transaction t1."""
    session = new_session()
    if command == "CONNECT":
        return session
    session.frame_received(Frame("CONNECT", {**_BASE["CONNECT"], "client-id": "c"}), NOW)
    session.frame_received(Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "s1"}), NOW)
    session.frame_received(Frame("BEGIN", {"transaction": "t1"}), NOW)
    frames(session)
    routes(session)
    return session


def refused_pairs() -> list[tuple[str, str, str]]:
    """(frame, header, value) for every header the table refuses by name, with a value
    that is not its accepted default."""
    pairs = []
    for rule in RULES:
        if rule.treatment != "refused" or rule.family:
            continue
        value = "1" if rule.default == "0" else "true"
        pairs += [(command, rule.header, value) for command in rule.frames]
    return pairs


def test_the_table_covers_every_client_frame() -> None:
    assert {*FRAMES, "STOMP"} == CLIENT_COMMANDS


def test_the_control_frames_are_accepted_as_the_walk_sends_them() -> None:
    """The base frames the walk below adds a header to are accepted without it (else the
    walk would count a refusal that has another reason)."""
    for command in FRAMES:
        session = session_for(command)
        session.frame_received(Frame(command, dict(_BASE[command])), NOW)
        assert not any(f.command == "ERROR" for f in frames(session)), command
        assert session.notices == [], command


@pytest.mark.parametrize(("command", "header", "value"), refused_pairs())
def test_every_header_the_table_refuses_is_refused_by_name_and_nothing_happens(
    command: str, header: str, value: str
) -> None:
    session = session_for(command)
    headers = {**_BASE[command], header: value, "receipt": "r"}
    if command == "CONNECT":
        del headers["receipt"]
    session.frame_received(Frame(command, headers), NOW)
    error = error_of(session)
    assert error.headers["message"].startswith(f"unsupported header {header} on {command}: ")
    assert "Nothing of the" in error.body.decode()
    if command != "CONNECT":
        assert error.headers["receipt-id"] == "r"
    # Nothing went to a pipeline but the end of the connection.
    assert [type(r).__name__ for _, r in routes(session)] in ([], ["ConnClosed"])


@pytest.mark.parametrize(
    "rule", [r for r in RULES if r.default is not None], ids=lambda r: r.header
)
def test_a_refused_header_asking_for_its_default_is_accepted(rule: HeaderRule) -> None:
    command = rule.frames[0]
    session = session_for(command)
    value = rule.default.upper() if rule.default else ""
    session.frame_received(Frame(command, {**_BASE[command], rule.header: f" {value}"}), NOW)
    assert not any(f.command == "ERROR" for f in frames(session))
    assert routes(session)


names = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=":"),
    min_size=1,
    max_size=12,
)


@given(family=st.sampled_from(FAMILIES), rest=names, command=st.sampled_from(FRAMES))
def test_any_family_header_no_rule_names_is_refused_but_x_headers_on_send(
    family: str, rest: str, command: str
) -> None:
    header = family + rest
    rule = rule_for(command, header)
    assert rule is not None
    if not rule.family:
        return  # a named one: the walk above covers it
    session = session_for(command)
    session.frame_received(Frame(command, {**_BASE[command], header: "yes"}), NOW)
    out = frames(session)
    records = routes(session)
    if command == "SEND" and family == "x-":
        [(_, record)] = records
        assert isinstance(record, Send) and record.message.headers[header] == "yes"
        return
    [error] = out
    assert error.command == "ERROR"
    assert error.headers["message"].startswith(f"unsupported header {header} on {command}")


def test_every_family_header_is_refused_unless_honoured_or_harmless() -> None:
    """The rule itself: no header of a family is left to be silently ignored. One the table
    ignores says why it is harmless; the broker's own ones are dropped only from a SEND;
    only RabbitMQ's unread x- names are carried, and only on SEND."""
    for rule in RULES:
        if not rule.header.startswith(FAMILIES):
            continue
        if rule.treatment == "ignored":
            assert rule.note.startswith("harmless"), rule
        elif rule.treatment in ("carried", "dropped"):
            assert rule.frames == ("SEND",), rule
            assert rule.treatment == "dropped" or rule.header == "x-*", rule
        else:
            assert rule.treatment in ("honoured", "refused"), rule
    for command in FRAMES:
        for family in FAMILIES:
            fallback = rule_for(command, family + "unheard-of")
            assert fallback is not None
            expected = "carried" if (command, family) == ("SEND", "x-") else "refused"
            assert fallback.treatment == expected, (command, family)


def test_a_harmless_header_is_noted_once_per_connection() -> None:
    session = connected()
    for n in range(3):
        session.frame_received(
            Frame(
                "SUBSCRIBE",
                {"destination": "/queue/q", "id": f"s{n}", "activemq.dispatchAsync": "true"},
            ),
            NOW,
        )
    assert len([r for _, r in routes(session) if isinstance(r, Subscribe)]) == 3
    assert session.notices == [
        "header activemq.dispatchAsync on SUBSCRIBE ignored: harmless: pipeline workers "
        "always dispatch on their own, never in the producer's turn"
    ]


def test_a_header_no_rule_names_is_noted_once_elsewhere_and_carried_on_send() -> None:
    session = connected()
    for n in range(2):
        session.frame_received(
            Frame("SUBSCRIBE", {"destination": "/queue/q", "id": f"s{n}", "colour": "red"}), NOW
        )
        session.frame_received(Frame("SEND", {"destination": "/queue/q", "colour": "red"}), NOW)
    assert session.notices == ["header colour on SUBSCRIBE ignored: mpbroker does not read it"]
    sends = [r for _, r in routes(session) if isinstance(r, Send)]
    assert [s.message.headers for s in sends] == [{"colour": "red"}] * 2


def test_notes_are_bounded_per_connection() -> None:
    session = connected()
    for n in range(200):
        session.frame_received(Frame("BEGIN", {"transaction": f"t{n % 5}", f"h{n}": "x"}), NOW)
        session.frame_received(Frame("ABORT", {"transaction": f"t{n % 5}"}), NOW)
    assert len(session.notices) == 64


def test_the_brokers_own_headers_are_dropped_from_a_send_and_noted_once() -> None:
    session = connected()
    forwarded = {
        "destination": "/queue/q",
        "message-id": "ID-forged",
        "redelivered": "true",
        "JMSXDeliveryCount": "3",
        "original-destination": "/queue/other",
        "JMSXUserID": "admin",
        "kept": "yes",
    }
    session.frame_received(Frame("SEND", dict(forwarded)), NOW)
    session.frame_received(Frame("SEND", dict(forwarded)), NOW)
    sends = [r for _, r in routes(session) if isinstance(r, Send)]
    assert [s.message.headers for s in sends] == [{"kept": "yes"}] * 2
    assert sends[0].message.message_id == "ID-1"
    assert len(session.notices) == 5
    assert all(" dropped from a SEND: " in n for n in session.notices)


# -- the headers honoured on conditions --------------------------------------------------


@pytest.mark.parametrize(
    ("destination", "value", "accepted"),
    [
        ("/queue/q", "ANYCAST", True),
        ("/topic/t", "MULTICAST", True),
        ("/queue/q", "anycast", True),
        ("/queue/q", "MULTICAST", False),
        ("/topic/t", "ANYCAST", False),
        ("/queue/q", "BROADCAST", False),
    ],
)
def test_artemis_routing_types_are_honoured_when_they_name_the_destinations_kind(
    destination: str, value: str, accepted: bool
) -> None:
    for command, header in (("SEND", "destination-type"), ("SUBSCRIBE", "subscription-type")):
        session = connected()
        headers = {"destination": destination, "id": "s", header: value}
        session.frame_received(Frame(command, headers), NOW)
        if accepted:
            assert routes(session), (command, value)
        else:
            message = error_of(session).headers["message"]
            assert message.startswith(f"unsupported header {header} on {command}: a ")
            assert routes(session) == []


def test_user_id_is_the_connect_login_without_a_users_file() -> None:
    session = new_session()
    session.frame_received(
        Frame("CONNECT", {"accept-version": "1.2", "host": "h", "login": "guest"}), NOW
    )
    frames(session)
    session.frame_received(Frame("SEND", {"destination": "/queue/q", "user-id": "guest"}), NOW)
    assert len(routes(session)) == 1
    session.frame_received(Frame("SEND", {"destination": "/queue/q", "user-id": "root"}), NOW)
    assert error_of(session).headers["message"] == "header user-id must be the connection's login"


def test_user_id_must_be_the_connections_login() -> None:
    session = connected()
    session.user = "alice"
    session.frame_received(Frame("SEND", {"destination": "/queue/q", "user-id": "alice"}), NOW)
    [(_, record)] = routes(session)
    assert isinstance(record, Send) and record.message.headers["user-id"] == "alice"
    session.frame_received(Frame("SEND", {"destination": "/queue/q", "user-id": "bob"}), NOW)
    assert error_of(session).headers["message"] == "header user-id must be the connection's login"
    assert routes(session) == []


@pytest.mark.parametrize("reply_to", ["/temp-queue/r", "/temp-topic/r", "/reply-queue/r"])
def test_a_reply_to_a_temporary_destination_is_refused(reply_to: str) -> None:
    session = connected()
    session.frame_received(Frame("SEND", {"destination": "/queue/q", "reply-to": reply_to}), NOW)
    message = error_of(session).headers["message"]
    assert message == (
        "unsupported header reply-to on SEND: temporary destinations are not supported yet"
    )
    assert routes(session) == []


def test_a_reply_to_a_queue_is_carried() -> None:
    session = connected()
    session.frame_received(Frame("SEND", {"destination": "/queue/q", "reply-to": "/queue/r"}), NOW)
    [(_, record)] = routes(session)
    assert isinstance(record, Send) and record.message.headers["reply-to"] == "/queue/r"


def test_rabbitmqs_expiration_is_a_time_to_live() -> None:
    session = connected()
    session.frame_received(Frame("SEND", {"destination": "/queue/q", "expiration": "5000"}), NOW)
    [(_, record)] = routes(session)
    assert isinstance(record, Send) and record.message.expires_ms == NOW + 5000
    session.frame_received(Frame("SEND", {"destination": "/queue/q", "expiration": "soon"}), NOW)
    assert "expiration" in error_of(session).headers["message"]


def test_activemqs_request_id_is_answered_with_a_response_id() -> None:
    session = new_session()
    session.frame_received(
        Frame("CONNECT", {"accept-version": "1.2", "host": "h", "request-id": "42"}), NOW
    )
    [connected_frame] = frames(session)
    assert connected_frame.headers["response-id"] == "42"


@pytest.mark.parametrize(
    "durable_header",
    [
        {"durable-subscriber-name": "n"},
        {"durable-subscription-name": "n"},
        {"activemq.subscriptionName": "n"},
        {"durable": "true"},
        {"persistent": "true"},
        {"activemq.subcriptionName": "n"},
    ],
)
def test_every_durable_subscription_header_makes_and_removes_one(
    durable_header: dict[str, str],
) -> None:
    session = new_session()
    session.frame_received(Frame("CONNECT", {"accept-version": "1.2", "client-id": "c"}), NOW)
    frames(session)
    session.frame_received(
        Frame("SUBSCRIBE", {"destination": "/topic/t", "id": "n", **durable_header}), NOW
    )
    [(_, record)] = routes(session)
    assert isinstance(record, Subscribe) and record.durable == "c/n"
    session.frame_received(Frame("UNSUBSCRIBE", {"id": "n", **durable_header}), NOW)
    [(_, unsubscribe)] = routes(session)
    assert isinstance(unsubscribe, Unsubscribe) and unsubscribe.remove_durable


@pytest.mark.parametrize(
    ("destination", "durable", "value", "accepted"),
    [
        ("/topic/t", False, "true", True),
        ("/topic/t", False, "false", False),
        ("/topic/t", True, "false", True),
        ("/topic/t", True, "true", False),
        ("/queue/q", False, "false", True),
        ("/queue/q", False, "TRUE", False),
    ],
)
def test_rabbitmqs_queue_flags_are_accepted_as_mpbroker_makes_the_subscription(
    destination: str, durable: bool, value: str, accepted: bool
) -> None:
    for flag in ("auto-delete", "exclusive"):
        session = new_session()
        session.frame_received(Frame("CONNECT", {"accept-version": "1.2", "client-id": "c"}), NOW)
        frames(session)
        headers = {"destination": destination, "id": "s", flag: value}
        if durable:
            headers["durable"] = "true"
        session.frame_received(Frame("SUBSCRIBE", headers), NOW)
        if accepted:
            assert len(routes(session)) == 1, (flag, value)
        else:
            message = error_of(session).headers["message"]
            assert message.startswith(f"unsupported header {flag} on SUBSCRIBE: ")
            assert routes(session) == []


def boolean_pairs() -> list[tuple[str, str]]:
    """(frame, header) for every header the table reads as a boolean."""
    return [(command, rule.header) for rule in RULES if rule.boolean for command in rule.frames]


def reading(command: str, header: str, value: str) -> tuple[object, ...]:
    """What a `command` frame with `header:value` comes to: the records routed (what of
    them the header decides) and the ERROR's message, if any."""
    session = session_for(command)
    session.frame_received(Frame(command, {**_BASE[command], header: value}), NOW)
    records = tuple(
        (type(r).__name__, getattr(r, "requeue", None), getattr(r, "durable", None))
        if not isinstance(r, Send)
        else ("Send", r.message.persistent)
        for _, r in routes(session)
    )
    errors = tuple(f.headers.get("message") for f in frames(session) if f.command == "ERROR")
    return records, errors


def test_the_boolean_headers_are_the_ones_the_docs_name() -> None:
    assert {header for _, header in boolean_pairs()} == {
        "persistent",
        "durable",
        "auto-delete",
        "exclusive",
        "requeue",
        "browser",
        "activemq.exclusive",
        "activemq.retroactive",
        "activemq.noLocal",
        "no-local",
    }


@pytest.mark.parametrize(("command", "header"), boolean_pairs())
def test_a_boolean_header_reads_true_and_false_in_any_case_and_refuses_the_rest(
    command: str, header: str
) -> None:
    """One rule for every boolean (docs/headers.md): stomp.py writes Python's `False` as
    `False`, which must read as `false`, and `yes` must not."""
    for word in ("true", "false"):
        expected = reading(command, header, word)
        for value in (word.upper(), word.capitalize(), f" {word} "):
            assert reading(command, header, value) == expected, (value, expected)
    for value in ("yes", "1", "", "truthy"):
        assert reading(command, header, value) == (
            (),
            (f"header {header}:{value!r} must be true or false",),
        ), value


def test_unsubscribe_refuses_another_connections_client_id() -> None:
    session = new_session()
    session.frame_received(Frame("CONNECT", {"accept-version": "1.2", "client-id": "c"}), NOW)
    session.frame_received(
        Frame("SUBSCRIBE", {"destination": "/topic/t", "id": "n", "durable": "true"}), NOW
    )
    frames(session)
    routes(session)
    session.frame_received(Frame("UNSUBSCRIBE", {"id": "n", "client-id": "c"}), NOW)
    assert routes(session)
    session.frame_received(
        Frame("SUBSCRIBE", {"destination": "/topic/t", "id": "m", "durable": "true"}), NOW
    )
    routes(session)
    session.frame_received(Frame("UNSUBSCRIBE", {"id": "m", "client-id": "other"}), NOW)
    assert error_of(session).headers["message"].startswith("unsupported header client-id")
    assert routes(session) == []


# -- destinations ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("destination", "what"),
    [
        ("/topic/prices.*", "wildcard destinations (* and >) are not supported yet"),
        ("/topic/prices.>", "wildcard destinations (* and >) are not supported yet"),
        ("/queue/orders.*.eu", "wildcard destinations (* and >) are not supported yet"),
        ("/queue/a,/topic/b", "composite destinations (a,b) are not supported yet"),
        ("/queue/a?consumer.exclusive=true", "destination options (?name=value) are not"),
        ("/temp-queue/replies", "temporary destinations are not supported yet"),
        ("/temp-topic/replies", "temporary destinations are not supported yet"),
        ("/exchange/amq.topic/x", "RabbitMQ exchanges are not supported"),
    ],
)
def test_destinations_other_brokers_read_as_more_than_a_name_are_refused(
    destination: str, what: str
) -> None:
    for command in ("SEND", "SUBSCRIBE"):
        session = connected()
        session.frame_received(Frame(command, {"destination": destination, "id": "s"}), NOW)
        message = error_of(session).headers["message"]
        assert message.startswith(what), message
        assert repr(destination) in message
        assert routes(session) == []


@pytest.mark.parametrize(
    "destination", ["/queue/a*b", "/queue/dash.<b>bold</b>", "/topic/x.>y", "/topic/c#"]
)
def test_wildcard_characters_inside_a_name_element_are_plain_characters(destination: str) -> None:
    """ActiveMQ's filters (and RabbitMQ's) take only a whole element for a wildcard."""
    session = connected()
    session.frame_received(Frame("SUBSCRIBE", {"destination": destination, "id": "s"}), NOW)
    session.frame_received(Frame("SEND", {"destination": destination}), NOW)
    assert len(routes(session)) == 2
    assert frames(session) == []


def test_rabbitmqs_hash_wildcard_is_refused_on_a_topic_subscription() -> None:
    session = connected()
    session.frame_received(Frame("SUBSCRIBE", {"destination": "/topic/a.#", "id": "s"}), NOW)
    assert "wildcard destinations (#)" in error_of(session).headers["message"]
    # A queue may have # in its name, and a topic may be sent to under it (RabbitMQ's
    # routing key is then literal).
    session = connected()
    session.frame_received(Frame("SUBSCRIBE", {"destination": "/queue/a.#", "id": "s"}), NOW)
    session.frame_received(Frame("SEND", {"destination": "/topic/a.#"}), NOW)
    assert len(routes(session)) == 2


def test_a_send_with_a_refused_header_is_refused_before_flow_control_may_hold_it() -> None:
    session = connected()
    send = Frame("SEND", {"destination": "/queue/q", "JMSXGroupID": "g", "receipt": "r"})
    assert session.refuses_send(send)
    error = error_of(session)
    assert error.headers["message"].startswith("unsupported header JMSXGroupID on SEND")
    assert error.headers["receipt-id"] == "r"
    assert session.denial == ""  # no access denial, for the shell's log
    ok = connected()
    plain = Frame("SEND", {"destination": "/queue/q"})
    assert not ok.refuses_send(plain)
    ok.frame_received(plain, NOW)
    assert len(routes(ok)) == 1
    assert ok.state is SessionState.CONNECTED


def test_a_transactional_send_is_checked_too() -> None:
    session = connected()
    session.frame_received(Frame("BEGIN", {"transaction": "t"}), NOW)
    session.frame_received(
        Frame("SEND", {"destination": "/queue/q", "transaction": "t", "AMQ_SCHEDULED_DELAY": "9"}),
        NOW,
    )
    assert "AMQ_SCHEDULED_DELAY" in error_of(session).headers["message"]


# -- the docs ----------------------------------------------------------------------------


def test_docs_headers_md_shows_the_table_the_session_applies() -> None:
    text = DOCS.read_text()
    match = re.search(
        r"<!-- the header table -->\n(.*?)<!-- end of the header table -->", text, re.DOTALL
    )
    assert match, "docs/headers.md lost its table markers"
    assert match.group(1).strip() == markdown_table().strip(), (
        "docs/headers.md differs from mpbroker/session/_headers.py: paste "
        "`python -c 'from mpbroker.session._headers import markdown_table as t; print(t())'`"
    )
