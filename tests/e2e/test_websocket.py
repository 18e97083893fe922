"""STOMP over WebSocket end to end, with the wsproto client of tests/websocket.py: a broker
with `stomp.ws_port = 0` and `wss_port = 0` (certificates of tests/security/test_tls.py),
the same sessions as TCP (messages both ways between WebSocket and TCP clients, binary
bodies, frames split over messages or sharing one, heart-beats), what the handshake refuses
(path, subprotocol, Origin, plain HTTP, a huge head, silence), an oversize message, and
authentication and connection limits on a second broker with a users file."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator

import pytest

from mpbroker.client import connect
from mpbroker.harness import BrokerProcess
from mpbroker.stomp import SERVER_COMMANDS, FrameLimits, FrameParser
from tests.e2e._admin import user_add
from tests.security.test_tls import Pki, make_pki
from tests.websocket import Rejected, WebSocketClient, open_websocket, stomp_bytes

pytestmark = pytest.mark.slow

CONNECT_TIMEOUT_MS = 2000
MAX_FRAME_BYTES = 64 * 1024
CONNECT = {"accept-version": "1.2", "host": "/", "heart-beat": "0,0"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[BrokerProcess]:
    """Two gateways, ws and wss (client certificates optional), one origin listed."""
    config = f"""[stomp]
ws_port = 0
wss_port = 0
tls_cert_file = "{pki.server_cert}"
tls_key_file = "{pki.server_key}"
tls_ca_file = "{pki.ca}"
ws_allowed_origins = "https://app.example.com"
max_frame_bytes = {MAX_FRAME_BYTES}
connect_timeout_ms = {CONNECT_TIMEOUT_MS}
"""
    data = tmp_path_factory.mktemp("ws") / "data"
    with BrokerProcess("--log-level", "debug", gateways=2, config=config, data_dir=data) as proc:
        yield proc


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[BrokerProcess]:
    """A users file, two connections per address, wss with client certificates required."""
    root = tmp_path_factory.mktemp("ws-secured")
    users = root / "users"
    user_add(users, "alice", "s3cret")
    config = f"""[broker]
max_connections_per_address = 2
[security]
users_file = "{users}"
[stomp]
ws_port = 0
wss_port = 0
tls_cert_file = "{pki.server_cert}"
tls_key_file = "{pki.server_key}"
tls_ca_file = "{pki.ca}"
tls_require_client_cert = true
connect_timeout_ms = {CONNECT_TIMEOUT_MS}
"""
    with BrokerProcess(config=config, data_dir=root / "data") as proc:
        yield proc


def ws(broker: BrokerProcess, **options: object) -> WebSocketClient:
    return open_websocket(broker.host, broker.ws_port, **options)  # type: ignore[arg-type]


def connected(client: WebSocketClient, **headers: str) -> WebSocketClient:
    client.send_frame("CONNECT", {**CONNECT, **headers})
    [frame] = client.frames(1)
    assert frame.command == "CONNECTED", frame
    return client


# -- the same sessions as TCP -------------------------------------------------------------


def test_connect_subscribe_send_receive_ack_over_a_websocket(broker: BrokerProcess) -> None:
    assert broker.ws_port not in (0, broker.port) and broker.wss_port not in (0, broker.ws_port)
    with connected(ws(broker)) as client:
        assert client.subprotocol == "v12.stomp"
        client.send_frame("SUBSCRIBE", {"destination": "/queue/ws.a", "id": "s", "ack": "client"})
        client.send_frame("SEND", {"destination": "/queue/ws.a", "receipt": "sent"}, b"hello")
        frames = client.frames(2)
        assert {f.command for f in frames} == {"RECEIPT", "MESSAGE"}
        [message] = [f for f in frames if f.command == "MESSAGE"]
        assert message.body == b"hello" and message.headers["subscription"] == "s"
        client.send_frame("ACK", {"id": message.headers["ack"], "receipt": "acked"})
        assert [f.headers["receipt-id"] for f in client.frames(1)] == ["acked"]
        client.send_frame("DISCONNECT", {"receipt": "bye"})
        assert [f.headers["receipt-id"] for f in client.frames(1)] == ["bye"]
        assert client.until_closed() == []
        assert client.close_code == 1000
    broker.wait_for_log(r"ws connection from 127\.0\.0\.1:\d+: /ws, subprotocol v12\.stomp")


def test_every_frame_is_a_message_of_its_own(broker: BrokerProcess) -> None:
    with connected(ws(broker)) as client:
        client.send_frame("SUBSCRIBE", {"destination": "/queue/ws.each", "id": "s"})
        with connect(broker.host, broker.port) as tcp:
            for n in range(20):
                tcp.send("/queue/ws.each", f"m{n}")
            tcp.send("/queue/ws.each", "last", receipt=True)
        messages = [client.receive() for _ in range(21)]
        assert all(isinstance(m, str) and m.startswith("MESSAGE\n") for m in messages)
        assert all(isinstance(m, str) and m.count("\0") == 1 and m.endswith("\0") for m in messages)


def test_messages_cross_between_websocket_and_tcp_clients(broker: BrokerProcess) -> None:
    with connected(ws(broker)) as client, connect(broker.host, broker.port) as tcp:
        from_ws = tcp.subscribe("/queue/ws.to-tcp")
        client.send_frame("SUBSCRIBE", {"destination": "/topic/ws.from-tcp", "id": "t"})
        client.send_frame("SEND", {"destination": "/queue/ws.to-tcp"}, b"from the browser")
        got = from_ws.get(timeout=10)
        assert got is not None and got.text == "from the browser"
        # The topic's subscription is registered once the WebSocket's RECEIPT came.
        client.send_frame("SEND", {"destination": "/queue/ws.sync", "receipt": "r"})
        assert [f.command for f in client.frames(1)] == ["RECEIPT"]
        tcp.send("/topic/ws.from-tcp", "from a TCP client", receipt=True)
        [message] = client.frames(1)
        assert message.command == "MESSAGE" and message.body == b"from a TCP client"


def test_a_binary_body_goes_byte_exact_in_binary_messages(broker: BrokerProcess) -> None:
    body = bytes(range(256)) * 8 + b"\0\0\xff"
    frame = stomp_bytes(
        "SEND",
        {"destination": "/queue/ws.binary", "content-length": str(len(body)), "receipt": "r"},
        body,
    )
    with connected(ws(broker)) as client, connect(broker.host, broker.port) as tcp:
        client.send_frame("SUBSCRIBE", {"destination": "/queue/ws.binary.back", "id": "b"})
        tcp_sub = tcp.subscribe("/queue/ws.binary")
        client.send(frame)  # a binary message
        got = tcp_sub.get(timeout=10)
        assert got is not None and got.body == body
        tcp.send("/queue/ws.binary.back", body)
        messages = [client.receive(), client.receive()]  # the RECEIPT and the MESSAGE
        [text] = [m for m in messages if isinstance(m, str)]
        assert text.startswith("RECEIPT\n")
        # Not UTF-8: a binary message.
        [binary] = [m for m in messages if isinstance(m, bytes)]
        [message] = FrameParser(FrameLimits(), commands=SERVER_COMMANDS).feed(binary)
        assert message.command == "MESSAGE" and message.body == body


def test_a_frame_split_over_messages_and_frames_sharing_one(broker: BrokerProcess) -> None:
    with connected(ws(broker)) as client:
        client.send_frame("SUBSCRIBE", {"destination": "/queue/ws.split", "id": "s"})
        frame = stomp_bytes("SEND", {"destination": "/queue/ws.split"}, b"in two halves")
        client.send(frame[:10])
        client.send(frame[10:])
        two = stomp_bytes("SEND", {"destination": "/queue/ws.split"}, b"one") + stomp_bytes(
            "SEND", {"destination": "/queue/ws.split"}, b"two"
        )
        client.send(two.decode())
        client.send("\n\n")  # heart-beat EOLs alone
        bodies = [f.body for f in client.frames(3)]
        assert bodies == [b"in two halves", b"one", b"two"]


def test_heart_beats_both_ways_and_pings_are_answered(broker: BrokerProcess) -> None:
    with ws(broker) as client:
        connected(client, **{"heart-beat": "500,500"})
        started = time.monotonic()
        heart_beats = 0
        while time.monotonic() - started < 3:
            client.send("\n")  # ours, every 0.5 s
            try:
                message = client.receive(timeout=0.5)
            except TimeoutError:
                continue
            assert message == "\n"  # the broker's: one message each
            heart_beats += 1
        assert heart_beats >= 2  # every 1000 ms (the broker's heartbeat_send_ms)
        client.ping(b"are you there")
        client.send_frame("SEND", {"destination": "/queue/ws.hb", "receipt": "alive"})
        frames = client.frames(1)
        assert [f.headers.get("receipt-id") for f in frames] == ["alive"]
        assert client.pongs == [b"are you there"]


def test_a_stomp_error_closes_with_1002(broker: BrokerProcess) -> None:
    with connected(ws(broker)) as client:
        client.send("NOT-A-COMMAND\n\n\0")
        frames = client.frames(1)
        assert frames[0].command == "ERROR"
        assert "unknown command" in frames[0].headers["message"]
        client.until_closed()
        assert client.close_code == 1002


def test_an_oversize_message_is_an_error_and_close_1009(broker: BrokerProcess) -> None:
    with connected(ws(broker)) as client:
        body = b"x" * (MAX_FRAME_BYTES * 2)
        client.send(stomp_bytes("SEND", {"destination": "/queue/ws.big"}, body).decode())
        [error] = client.frames(1)
        assert error.command == "ERROR"
        assert f"exceeds max_frame_bytes {MAX_FRAME_BYTES}" in error.headers["message"]
        client.until_closed()
        assert client.close_code == 1009


def test_a_message_of_many_small_frames_past_the_limit_is_refused_too(
    broker: BrokerProcess,
) -> None:
    with connected(ws(broker)) as client:
        frame = stomp_bytes("SEND", {"destination": "/queue/ws.many"}, b"y" * 1000)
        client.send(frame * (MAX_FRAME_BYTES // len(frame) + 10))
        frames = client.frames(1)
        assert frames[-1].command == "ERROR"
        assert "exceeds max_frame_bytes" in frames[-1].headers["message"]
        client.until_closed()
        assert client.close_code == 1009


# -- the handshake -----------------------------------------------------------------------


def test_both_paths_and_no_subprotocol_are_taken(broker: BrokerProcess) -> None:
    with ws(broker, path="/stomp") as client:
        connected(client)
    with ws(broker, subprotocols=()) as client:
        assert client.subprotocol is None
        connected(client)
    with ws(broker, subprotocols=("v10.stomp",)) as client:
        assert client.subprotocol == "v10.stomp"


def test_a_query_string_is_a_400_not_ignored(broker: BrokerProcess) -> None:
    with pytest.raises(Rejected) as caught:
        ws(broker, path="/stomp?client=test")
    assert caught.value.status == 400
    assert b"query parameter 'client' not supported" in caught.value.body


def test_a_foreign_subprotocol_is_a_400(broker: BrokerProcess) -> None:
    with pytest.raises(Rejected) as caught:
        ws(broker, subprotocols=("mqtt",))
    assert caught.value.status == 400
    assert b"no supported subprotocol in 'mqtt'" in caught.value.body


def test_another_path_is_a_404(broker: BrokerProcess) -> None:
    with pytest.raises(Rejected) as caught:
        ws(broker, path="/admin")
    assert caught.value.status == 404
    assert caught.value.body == b"no such path '/admin': STOMP over WebSocket is at /stomp or /ws\n"


def test_origins(start_broker: type[BrokerProcess]) -> None:
    # A broker of its own: the log says the first refused handshake in 10 s, from whatever
    # address, and only counts the next ones; on `broker` the tests above refuse some.
    config = '[stomp]\nws_port = 0\nws_allowed_origins = "https://app.example.com"\n'
    broker = start_broker("--gateways", "1", config=config)
    with pytest.raises(Rejected) as caught:
        ws(broker, origin="https://evil.example", source="127.0.0.21")
    assert caught.value.status == 403
    assert b"origin 'https://evil.example' not allowed" in caught.value.body
    assert b"stomp.ws_allowed_origins" in caught.value.body
    broker.wait_for_log(
        r"WebSocket handshake from 127\.0\.0\.21:\d+ refused \(403\): origin "
        r"'https://evil\.example' not allowed"
    )
    for origin in ("http://localhost:8080", "http://127.0.0.1:3000", "https://app.example.com"):
        with ws(broker, origin=origin) as client:
            connected(client)


def plain_request(broker: BrokerProcess, request: bytes) -> bytes:
    with socket.create_connection((broker.host, broker.ws_port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def test_plain_http_is_a_426_and_a_huge_head_a_431(broker: BrokerProcess) -> None:
    answer = plain_request(broker, b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 426 Upgrade Required\r\n")
    assert b"not a WebSocket handshake (no 'Upgrade: websocket')" in answer
    huge = b"GET /ws HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 40_000 + b"\r\n\r\n"
    assert plain_request(broker, huge).startswith(b"HTTP/1.1 431 ")
    # STOMP bytes on the WebSocket port: not HTTP.
    assert plain_request(broker, stomp_bytes("CONNECT", CONNECT)).startswith(b"HTTP/1.1 400 ")


def test_a_client_that_says_nothing_is_dropped_after_connect_timeout(
    broker: BrokerProcess,
) -> None:
    started = time.monotonic()
    assert plain_request(broker, b"") == b""
    waited = time.monotonic() - started
    assert CONNECT_TIMEOUT_MS / 1000 - 0.2 < waited < CONNECT_TIMEOUT_MS / 1000 + 3


# -- wss ---------------------------------------------------------------------------------


def test_wss_carries_stomp_with_and_without_a_client_certificate(
    broker: BrokerProcess, pki: Pki
) -> None:
    for context in (pki.client_context(), pki.client_context(certificate=True)):
        client = open_websocket(broker.host, broker.wss_port, ssl_context=context)
        with connected(client):
            client.send_frame("SUBSCRIBE", {"destination": "/queue/wss", "id": "s"})
            client.send_frame("SEND", {"destination": "/queue/wss"}, b"secret")
            [message] = client.frames(1)
            assert message.body == b"secret"
            client.send_frame("DISCONNECT", {"receipt": "bye"})
            assert [f.command for f in client.frames(1)] == ["RECEIPT"]
            client.until_closed()
            assert client.close_code == 1000


def test_wss_requires_the_client_certificate_when_so_configured(
    secured: BrokerProcess, pki: Pki
) -> None:
    # (TLS 1.3: the refusal comes with the first read, the handshake's answer.)
    with pytest.raises((ssl.SSLError, ConnectionError, Rejected)):
        open_websocket(secured.host, secured.wss_port, ssl_context=pki.client_context())
    client = open_websocket(
        secured.host, secured.wss_port, ssl_context=pki.client_context(certificate=True)
    )
    with connected(client, login="alice", passcode="s3cret"):
        pass


# -- authentication and limits -----------------------------------------------------------


def test_authentication_applies_over_websocket(secured: BrokerProcess) -> None:
    with ws(secured) as client:
        client.send_frame("CONNECT", {**CONNECT, "login": "alice", "passcode": "wrong"})
        [error] = client.frames(1)
        assert error.command == "ERROR" and error.headers["message"] == "authentication failed"
        client.until_closed()
        assert client.close_code == 1008
    with ws(secured) as client:
        connected(client, login="alice", passcode="s3cret")
    secured.wait_for_log(r"authentication failed for alice from 127\.0\.0\.1:\d+")


def test_the_connection_limits_apply_to_websockets(secured: BrokerProcess) -> None:
    source = "127.0.0.31"
    with ws(secured, source=source), ws(secured, source=source):
        third = ws(secured, source=source)  # the handshake, then the ERROR and a close
        [error] = third.frames(1)
        third.until_closed()
        third.close()
        assert error.command == "ERROR"
        assert error.headers["message"] == (
            "connection refused: max_connections_per_address 2 reached"
        )
        assert third.close_code == 1008
    secured.wait_for_log(
        r"refused connection from 127\.0\.0\.31:\d+: max_connections_per_address 2 reached"
    )
