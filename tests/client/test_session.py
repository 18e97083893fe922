"""The sans-IO client session, fed bytes directly, with a fake clock."""

from __future__ import annotations

import pytest

from mpbroker.client import ConnectionClosed, Message, ReceiptTimeout, StompError
from mpbroker.client._session import (
    PREFETCH_HEADER,
    ClientSession,
    Connected,
    Delivery,
    ReceiptReceived,
    SessionClosed,
    State,
)
from mpbroker.stomp import CLIENT_COMMANDS, HEARTBEAT_BYTES, Frame, FrameParser, encode_frame


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def server_frame(
    command: str, headers: dict[str, str], body: bytes = b"", version: str = "1.2"
) -> bytes:
    return encode_frame(Frame(command, headers, body), version=version)


def parse_client(data: bytes, version: str = "1.2") -> Frame:
    """Decode one frame the session produced, with the broker's parser."""
    frames = FrameParser(commands=CLIENT_COMMANDS, version=version).feed(data)
    assert len(frames) == 1
    return frames[0]


def connected_session(
    version: str = "1.2",
    heartbeat: tuple[int, int] = (0, 0),
    server_heartbeat: str = "0,0",
    clock: FakeClock | None = None,
) -> ClientSession:
    session = ClientSession("example", heartbeat=heartbeat, clock=clock or FakeClock())
    session.connect()
    events = session.receive_data(
        server_frame("CONNECTED", {"version": version, "heart-beat": server_heartbeat})
    )
    assert isinstance(events[0], Connected)
    return session


def message_bytes(sub: str, n: int = 1, ack: bool = True, version: str = "1.2") -> bytes:
    headers = {"destination": "/queue/a", "message-id": f"m{n}", "subscription": sub}
    if ack:
        headers["ack"] = f"a{n}"
    return server_frame("MESSAGE", headers, b"body", version)


# --- CONNECT / CONNECTED --------------------------------------------------------------------


def test_connect_frame_carries_every_requested_header() -> None:
    session = ClientSession(
        "vhost-1", login="alice", passcode="s:cret", client_id="c1", heartbeat=(1000, 2000)
    )
    frame = parse_client(session.connect())
    assert frame.command == "CONNECT"
    assert frame.headers == {
        "accept-version": "1.0,1.1,1.2",
        "host": "vhost-1",
        "heart-beat": "1000,2000",
        "login": "alice",
        "passcode": "s:cret",
        "client-id": "c1",
    }


def test_connect_frame_omits_absent_credentials() -> None:
    frame = parse_client(ClientSession("h").connect())
    assert set(frame.headers) == {"accept-version", "host", "heart-beat"}


def test_negative_heartbeat_is_refused() -> None:
    with pytest.raises(ValueError, match="heartbeat"):
        ClientSession("h", heartbeat=(-1, 0))


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_connected_sets_version(version: str) -> None:
    session = connected_session(version)
    assert session.state is State.CONNECTED
    assert session.version == version
    assert session.server_headers["version"] == version


def test_connected_without_version_header_means_1_0() -> None:
    session = ClientSession("h")
    session.connect()
    (event,) = session.receive_data(server_frame("CONNECTED", {}))
    assert event == Connected("1.0", {})
    assert session.version == "1.0"


def test_unsupported_version_closes() -> None:
    session = ClientSession("h")
    session.connect()
    (event,) = session.receive_data(server_frame("CONNECTED", {"version": "2.0"}))
    assert isinstance(event, SessionClosed)
    assert "2.0" in event.reason.reason
    assert session.closed


def test_negotiated_version_sets_parser_escaping() -> None:
    # In 1.2 "\c" in a header is an escaped colon; in 1.0 it is two literal characters.
    for version, expected in (("1.2", "a:b"), ("1.0", "a\\cb")):
        session = connected_session(version)
        session.subscribe("/queue/a", id="s", receipt=False)
        raw = b"MESSAGE\ndestination:/queue/a\nmessage-id:a\\cb\nsubscription:s\n\n\0"
        (event,) = session.receive_data(raw)
        assert isinstance(event, Delivery)
        assert event.message.message_id == expected


def test_frames_split_at_every_byte_boundary() -> None:
    connected = server_frame("CONNECTED", {"version": "1.2"})
    for cut in range(len(connected) + 1):
        session = ClientSession("h")
        session.connect()
        events = session.receive_data(connected[:cut]) + session.receive_data(connected[cut:])
        assert events == [Connected("1.2", {"version": "1.2"})]
    message = message_bytes("s")
    for cut in range(len(message) + 1):
        session = connected_session()
        session.subscribe("/queue/a", id="s", receipt=False)
        events = session.receive_data(message[:cut]) + session.receive_data(message[cut:])
        assert [type(e) for e in events] == [Delivery]


def test_error_instead_of_connected() -> None:
    session = ClientSession("h")
    session.connect()
    (event,) = session.receive_data(
        server_frame("ERROR", {"message": "bad login"}, b"who are you?")
    )
    assert isinstance(event, SessionClosed)
    assert session.error is not None
    assert session.error.message == "bad login"
    assert session.error.body == b"who are you?"
    assert event.reason.error is session.error


def test_message_before_connected_is_a_protocol_violation() -> None:
    session = ClientSession("h")
    session.connect()
    (event,) = session.receive_data(message_bytes("s"))
    assert isinstance(event, SessionClosed)
    assert "expected CONNECTED" in str(event.reason)


def test_garbage_from_server_closes_without_raising() -> None:
    session = connected_session()
    (event,) = session.receive_data(b"SEND\n\n\0")  # a client command, not a server one
    assert isinstance(event, SessionClosed)
    assert "protocol error" in event.reason.reason
    assert session.receive_data(b"anything") == []


# --- heart-beat negotiation and timers ------------------------------------------------------


@pytest.mark.parametrize(
    ("ours", "theirs", "send_s", "expect_s"),
    [
        ((0, 0), "1000,1000", 0.0, 0.0),
        ((100, 0), "0,300", 0.3, 0.0),  # we send at the slower of our offer and their wish
        ((0, 200), "500,0", 0.0, 0.5),
        ((100, 200), "50,0", 0.0, 0.2),  # they do not want ours: we send none
        ((100, 200), "0,0", 0.0, 0.0),
    ],
)
def test_heartbeat_negotiation(
    ours: tuple[int, int], theirs: str, send_s: float, expect_s: float
) -> None:
    session = connected_session(heartbeat=ours, server_heartbeat=theirs)
    assert session.send_interval_s == send_s
    assert session.expect_interval_s == expect_s


def test_bad_heartbeat_header_closes() -> None:
    session = ClientSession("h")
    session.connect()
    (event,) = session.receive_data(
        server_frame("CONNECTED", {"version": "1.2", "heart-beat": "x"})
    )
    assert isinstance(event, SessionClosed)
    assert "heart-beat" in event.reason.reason


def test_heartbeat_sent_only_when_idle() -> None:
    # Times are binary fractions so the float arithmetic is exact.
    clock = FakeClock()
    session = connected_session(heartbeat=(125, 0), server_heartbeat="0,125", clock=clock)
    assert session.poll_heartbeat() == (b"", 0.125)
    clock.now += 0.0625
    session.send("/queue/a", b"x")  # a frame counts as a sign of life
    clock.now += 0.0625
    assert session.poll_heartbeat() == (b"", 0.0625)
    clock.now += 0.0625
    assert session.poll_heartbeat() == (HEARTBEAT_BYTES, 0.125)
    assert session.poll_heartbeat() == (b"", 0.125)


def test_silent_server_closes_after_twice_the_interval() -> None:
    clock = FakeClock()
    session = connected_session(heartbeat=(0, 125), server_heartbeat="125,0", clock=clock)
    clock.now += 0.125
    assert session.poll_heartbeat() == (b"", 0.125)  # a wait > 0 means still open
    session.receive_data(HEARTBEAT_BYTES)  # any byte resets the deadline
    clock.now += 0.1875
    assert session.poll_heartbeat() == (b"", 0.0625)
    clock.now += 0.0625
    assert session.poll_heartbeat() == (b"", None)
    assert session.state is State.CLOSED
    with pytest.raises(ConnectionClosed, match="no data from the server"):
        session.send("/queue/a")


def test_no_heartbeat_timer_without_heartbeats() -> None:
    assert connected_session().poll_heartbeat() == (b"", None)


# --- outgoing frames ------------------------------------------------------------------------


def test_send_text_body_gets_content_type() -> None:
    session = connected_session()
    out = session.send("/queue/a", "héllo", {"x": "1", "destination": "ignored"})
    frame = parse_client(out.data)
    assert frame.command == "SEND"
    assert frame.body == "héllo".encode()
    assert frame.headers["destination"] == "/queue/a"
    assert frame.headers["content-type"] == "text/plain;charset=utf-8"
    assert frame.headers["x"] == "1"
    assert out.receipt is None and "receipt" not in frame.headers


def test_send_bytes_keeps_caller_content_type() -> None:
    session = connected_session()
    frame = parse_client(session.send("/q", b"\0\1", {"content-type": "application/x"}).data)
    assert frame.body == b"\0\1"
    assert frame.headers["content-type"] == "application/x"


def test_subscribe_headers() -> None:
    session = connected_session()
    info, out = session.subscribe(
        "/topic/t", ack="client-individual", prefetch=5, headers={"selector": "a = 1"}
    )
    frame = parse_client(out.data)
    assert frame.command == "SUBSCRIBE"
    assert frame.headers["destination"] == "/topic/t"
    assert frame.headers["id"] == info.id
    assert frame.headers["ack"] == "client-individual"
    assert frame.headers[PREFETCH_HEADER] == "5"
    assert frame.headers["selector"] == "a = 1"
    assert frame.headers["receipt"] == out.receipt


def test_subscribe_refuses_bad_ack_mode_and_duplicate_id() -> None:
    session = connected_session()
    with pytest.raises(ValueError, match="ack mode"):
        session.subscribe("/q", ack="sometimes")
    session.subscribe("/q", id="s1")
    with pytest.raises(ValueError, match="already in use"):
        session.subscribe("/q", id="s1")


def test_subscription_ids_are_unique() -> None:
    session = connected_session()
    ids = {session.subscribe("/q")[0].id for _ in range(10)}
    assert len(ids) == 10


def _received(session: ClientSession, data: bytes) -> Message:
    (event,) = session.receive_data(data)
    assert isinstance(event, Delivery)
    return event.message


@pytest.mark.parametrize(
    ("version", "command", "expected"),
    [
        ("1.2", "ACK", {"id": "a1"}),
        ("1.2", "NACK", {"id": "a1"}),
        ("1.1", "ACK", {"message-id": "m1", "subscription": "s"}),
        ("1.1", "NACK", {"message-id": "m1", "subscription": "s"}),
        ("1.0", "ACK", {"message-id": "m1"}),
    ],
)
def test_ack_frame_per_version(version: str, command: str, expected: dict[str, str]) -> None:
    session = connected_session(version)
    session.subscribe("/queue/a", id="s", ack="client", receipt=False)
    message = _received(session, message_bytes("s", version=version))
    out = session.ack(message) if command == "ACK" else session.nack(message)
    frame = parse_client(out.data, version)
    assert frame.command == command
    assert frame.headers == expected


def test_nack_needs_1_1() -> None:
    session = connected_session("1.0")
    session.subscribe("/queue/a", id="s", ack="client", receipt=False)
    with pytest.raises(ValueError, match="NACK needs"):
        session.nack(_received(session, message_bytes("s", version="1.0")))


def test_ack_of_auto_message_is_refused() -> None:
    session = connected_session()
    session.subscribe("/queue/a", id="s", receipt=False)
    message = _received(session, message_bytes("s", ack=False))
    with pytest.raises(ValueError, match="no ack header"):
        session.ack(message)


def test_encoding_failure_leaves_no_pending_receipt() -> None:
    session = connected_session("1.0")
    with pytest.raises(ValueError):
        session.send("/q", b"", {"bad": "line\nbreak"}, receipt=True)
    assert session._pending_receipts == {}


# --- incoming frames ------------------------------------------------------------------------


def test_message_fields() -> None:
    session = connected_session()
    session.subscribe("/queue/a", id="s", ack="client", receipt=False)
    raw = server_frame(
        "MESSAGE",
        {
            "destination": "/queue/a",
            "message-id": "m7",
            "subscription": "s",
            "ack": "a7",
            "redelivered": "true",
            "content-type": "text/plain; charset=latin-1",
        },
        "é".encode("latin-1"),
    )
    message = _received(session, raw)
    assert (message.destination, message.message_id, message.subscription, message.ack_id) == (
        "/queue/a",
        "m7",
        "s",
        "a7",
    )
    assert message.redelivered
    assert message.text == "é"
    assert message.headers["redelivered"] == "true"


def test_message_for_unknown_subscription_is_dropped() -> None:
    session = connected_session()
    info, _ = session.subscribe("/queue/a", id="s", receipt=False)
    session.unsubscribe(info.id, receipt=False)
    assert session.receive_data(message_bytes("s")) == []
    assert not session.closed


def test_message_without_subscription_header_routes_by_destination() -> None:
    session = connected_session("1.0")
    session.subscribe("/queue/a", id="s", receipt=False)
    message = _received(
        session,
        server_frame("MESSAGE", {"destination": "/queue/a", "message-id": "m"}, version="1.0"),
    )
    assert message.subscription == "s"


def test_unsubscribe_unknown_is_refused() -> None:
    with pytest.raises(ValueError, match="not active"):
        connected_session().unsubscribe("nope")


# --- receipts -------------------------------------------------------------------------------


def test_receipt_round_trip() -> None:
    session = connected_session()
    out = session.send("/q", b"x", receipt=True)
    assert out.receipt is not None
    assert not session.receipt_settled(out.receipt)
    (event,) = session.receive_data(server_frame("RECEIPT", {"receipt-id": out.receipt}))
    assert event == ReceiptReceived(out.receipt)
    assert session.receipt_settled(out.receipt)
    session.finish_receipt(out.receipt, 1.0)  # returns: it arrived


def test_receipt_timeout_then_late_receipt_is_ignored() -> None:
    session = connected_session()
    out = session.send("/q", b"x", receipt=True)
    assert out.receipt is not None
    with pytest.raises(ReceiptTimeout, match=r"no RECEIPT for SEND .* within 0.5 s"):
        session.finish_receipt(out.receipt, 0.5)
    assert session.receive_data(server_frame("RECEIPT", {"receipt-id": out.receipt})) == []


def test_error_settles_receipts_with_the_servers_message() -> None:
    session = connected_session()
    out = session.send("/q", b"x", receipt=True)
    assert out.receipt is not None
    (event,) = session.receive_data(
        server_frame("ERROR", {"message": "quota exceeded"}, b"details")
    )
    assert isinstance(event, SessionClosed)
    assert session.receipt_settled(out.receipt)
    with pytest.raises(StompError, match="quota exceeded") as info:
        session.finish_receipt(out.receipt, 1.0)
    assert not isinstance(info.value, ConnectionClosed)
    assert info.value is not session.error  # a copy per waiter


def test_local_close_settles_receipts_with_connection_closed() -> None:
    session = connected_session()
    out = session.send("/q", b"x", receipt=True)
    assert out.receipt is not None
    session.close("socket gone")
    with pytest.raises(ConnectionClosed, match="socket gone"):
        session.finish_receipt(out.receipt, 1.0)


def test_operations_after_error_raise_connection_closed_wrapping_it() -> None:
    session = connected_session()
    session.receive_data(server_frame("ERROR", {"message": "boom"}))
    session.close("later reason does not replace the first")
    with pytest.raises(ConnectionClosed) as info:
        session.send("/q")
    assert info.value.error is session.error
    assert info.value.message == "boom"
    assert str(info.value) == "cannot send(): the server sent an ERROR frame: boom"


def test_disconnect_then_only_the_receipt() -> None:
    session = connected_session()
    out = session.disconnect()
    assert parse_client(out.data).command == "DISCONNECT"
    assert session.state is State.DISCONNECTING
    with pytest.raises(ConnectionClosed, match="disconnecting"):
        session.send("/q")
    assert out.receipt is not None
    assert session.receive_data(server_frame("RECEIPT", {"receipt-id": out.receipt})) == [
        ReceiptReceived(out.receipt)
    ]
    assert session.closed
    session.finish_receipt(out.receipt, 1.0)  # the receipt counts, though the session closed
    assert session.close_reason is not None
    assert session.close_reason.reason == "the client disconnected"


# --- errors ---------------------------------------------------------------------------------


def test_error_strings_are_readable() -> None:
    error = StompError("bad destination", {"message": "bad destination"}, b"x" * 1000)
    text = str(error)
    assert text.startswith("bad destination\nxxx")
    assert len(text) < 600
    assert str(StompError("")) == "STOMP ERROR frame without a message header"
    closed = ConnectionClosed("the server closed the connection")
    assert str(closed) == "the server closed the connection"
    assert closed.message == "the server closed the connection"


def test_default_frame_limit_admits_a_full_size_broker_message() -> None:
    # The broker accepts SEND bodies up to the codec's default frame size; the MESSAGE that
    # carries such a body back is larger, and the client must still take it.
    session = connected_session()
    session.subscribe("/queue/a", id="s", receipt=False)
    body = b"x" * (1 << 20)
    headers = {"destination": "/queue/a", "message-id": "m", "subscription": "s"}
    (event,) = session.receive_data(server_frame("MESSAGE", headers, body))
    assert isinstance(event, Delivery)
    assert event.message.body == body


def test_max_frame_bytes_is_enforced() -> None:
    session = ClientSession("h", max_frame_bytes=100)
    session.connect()
    session.receive_data(server_frame("CONNECTED", {"version": "1.2"}))
    session.subscribe("/queue/a", id="s", receipt=False)
    headers = {"destination": "/queue/a", "message-id": "m", "subscription": "s"}
    (event,) = session.receive_data(server_frame("MESSAGE", headers, b"x" * 200))
    assert isinstance(event, SessionClosed)
    assert "max_frame_bytes 100" in event.reason.reason
