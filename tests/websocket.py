"""A small blocking WebSocket client for tests (wsproto over a plain or TLS socket): what a
browser does at the handshake, then messages both ways, so that tests can send what
browsers and stomp.js would not (a foreign Origin, odd subprotocols, a frame split over
messages, a huge message).

`open_websocket` returns a `WebSocketClient`, or raises `Rejected` with the HTTP status
and body the server answered.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Sequence

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Message,
    Ping,
    Pong,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from mpbroker.stomp import SERVER_COMMANDS, Frame, FrameLimits, FrameParser, encode_frame

__all__ = ["STOMP_SUBPROTOCOLS", "Rejected", "WebSocketClient", "open_websocket", "stomp_bytes"]

#: What stomp.js offers by default.
STOMP_SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp")


class Rejected(Exception):
    """The server answered the handshake with an HTTP status other than 101."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body
        super().__init__(f"{status}: {body.decode('utf-8', 'replace').strip()}")


def stomp_bytes(command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    """A client frame's bytes (STOMP 1.2 encoding)."""
    return encode_frame(Frame(command, dict(headers or {}), body))


class WebSocketClient:
    """One open WebSocket: `send` a text (str) or binary (bytes) message, `receive` the
    next message, `frames` the STOMP frames of the next messages."""

    def __init__(self, sock: socket.socket, ws: WSConnection, subprotocol: str | None) -> None:
        self.sock = sock
        self.ws = ws
        self.subprotocol = subprotocol
        #: The server's close code, once it closed (None: not yet).
        self.close_code: int | None = None
        self.pongs: list[bytes] = []
        self._messages: list[str | bytes] = []
        self._partial: list[str | bytes] = []
        self._parser = FrameParser(
            FrameLimits(max_frame_bytes=64 * 1024 * 1024), commands=SERVER_COMMANDS
        )

    def send(self, data: str | bytes) -> None:
        """One message: text for a str, binary for bytes."""
        message: Message[str] | Message[bytes] = (
            TextMessage(data=data) if isinstance(data, str) else BytesMessage(data=data)
        )
        self.sock.sendall(self.ws.send(message))

    def send_frame(
        self, command: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> None:
        """A STOMP frame as one text message (binary if it is not UTF-8)."""
        data = stomp_bytes(command, headers, body)
        try:
            self.send(data.decode())
        except UnicodeDecodeError:
            self.send(data)

    def ping(self, payload: bytes) -> None:
        self.sock.sendall(self.ws.send(Ping(payload=payload)))

    def receive(self, timeout: float = 10) -> str | bytes | None:
        """The next whole message (None once the server closed; TimeoutError if none
        comes within `timeout`)."""
        deadline = time.monotonic() + timeout
        while not self._messages:
            if self.close_code is not None:
                return None
            self._read(deadline)
        return self._messages.pop(0)

    def frames(self, count: int = 1, timeout: float = 10) -> list[Frame]:
        """The next `count` STOMP frames (heart-beat messages skipped); fewer if the
        server closes first."""
        got: list[Frame] = []
        deadline = time.monotonic() + timeout
        while len(got) < count:
            message = self.receive(max(0.0, deadline - time.monotonic()))
            if message is None:
                break
            data = message.encode() if isinstance(message, str) else message
            got += self._parser.feed(data)
        return got

    def until_closed(self, timeout: float = 10) -> list[str | bytes]:
        """Every message until the server closes (its code in `close_code`)."""
        messages: list[str | bytes] = []
        deadline = time.monotonic() + timeout
        while (message := self.receive(max(0.0, deadline - time.monotonic()))) is not None:
            messages.append(message)
        return messages

    def _read(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no message from the server in time")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise TimeoutError("no message from the server in time") from None
        except ConnectionResetError:
            data = b""
        if not data:
            if self.close_code is None:
                self.close_code = 1006  # closed without a close frame
            return
        self.ws.receive_data(data)
        for event in self.ws.events():
            self._handle(event)

    def _handle(self, event: Event) -> None:
        if isinstance(event, TextMessage | BytesMessage):
            self._partial.append(event.data)
            if event.message_finished:
                parts = self._partial
                self._partial = []
                joined: str | bytes = (
                    "".join(p for p in parts if isinstance(p, str))
                    if isinstance(event, TextMessage)
                    else b"".join(p for p in parts if isinstance(p, bytes))
                )
                self._messages.append(joined)
        elif isinstance(event, CloseConnection):
            self.close_code = event.code
            # (The answer may meet a socket the server closed already.)
            with contextlib.suppress(OSError):
                self.sock.sendall(self.ws.send(event.response()))
        elif isinstance(event, Pong):
            self.pongs.append(bytes(event.payload))

    def close(self, code: int = 1000) -> None:
        """Send a close frame (if open) and close the socket."""
        if self.close_code is None:
            with contextlib.suppress(Exception):
                self.sock.sendall(self.ws.send(CloseConnection(code=code)))
        self.sock.close()

    def __enter__(self) -> WebSocketClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_websocket(
    host: str,
    port: int,
    path: str = "/ws",
    *,
    subprotocols: Sequence[str] = STOMP_SUBPROTOCOLS,
    origin: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    source: str | None = None,
    timeout: float = 10,
) -> WebSocketClient:
    """Connect and complete the handshake (`Rejected` if the server refuses it). `source`:
    a loopback address to connect from (127.0.0.0/8 is all loopback)."""
    sock = socket.create_connection(
        (host, port), timeout=timeout, source_address=None if source is None else (source, 0)
    )
    try:
        return _handshake(sock, host, port, path, subprotocols, origin, ssl_context, timeout)
    except BaseException:
        sock.close()
        raise


def _handshake(
    sock: socket.socket,
    host: str,
    port: int,
    path: str,
    subprotocols: Sequence[str],
    origin: str | None,
    ssl_context: ssl.SSLContext | None,
    timeout: float,
) -> WebSocketClient:
    if ssl_context is not None:
        sock = ssl_context.wrap_socket(sock, server_hostname=host)
    ws = WSConnection(ConnectionType.CLIENT)
    headers = [] if origin is None else [(b"Origin", origin.encode())]
    sock.sendall(
        ws.send(
            Request(
                host=f"{host}:{port}",
                target=path,
                subprotocols=list(subprotocols),
                extra_headers=headers,
            )
        )
    )
    status = 0
    body = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            data = sock.recv(65536)
            if not data:
                raise Rejected(status, body)
            ws.receive_data(data)
            events = ws.events()
            for event in events:
                if isinstance(event, AcceptConnection):
                    client = WebSocketClient(sock, ws, event.subprotocol)
                    # What came in the same read as the 101 (a refused connection's ERROR
                    # and close follow at once) is the client's: it was lost here before.
                    for later in events:
                        client._handle(later)
                    return client
                if isinstance(event, RejectConnection):
                    status = event.status_code
                    if not event.has_body:
                        raise Rejected(status, b"")
                elif isinstance(event, RejectData):
                    body += event.data
                    if event.body_finished:
                        raise Rejected(status, body)
        raise TimeoutError("no answer to the handshake")
    except BaseException:
        sock.close()  # (the TLS socket: wrap_socket took the plain one over)
        raise
