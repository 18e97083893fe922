"""STOMP over WebSocket in the gateway (stomp.ws_port, stomp.wss_port): the opening
handshake, and a stream of STOMP bytes over WebSocket messages.

The connection then goes through the gateway's `accept` and `serve_connection` like a TCP
one (limits, authentication, flow control, heart-beats): `WebSocketStream.receive_some`
gives the payloads of the client's messages, text or binary, to the same stream parser
(a message may hold a frame, part of one, several, or heart-beat EOLs), and
`send_frames` sends each frame the session wrote as one message, as Web-STOMP and
stomp.js expect. The decisions (path, subprotocol, origin) are `mpbroker.stomp`'s
`accept_request`; h11 reads the request head, wsproto the frames.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TypeAlias

import h11
import trio
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage

from mpbroker.logs import client_text, log_collapsed
from mpbroker.stomp import (
    FrameTooLarge,
    HandshakeRefused,
    MalformedRequest,
    ProtocolError,
    RequestTooLarge,
    accept_request,
    parse_allowed_origins,
)

__all__ = [
    "CLOSE_GOING_AWAY",
    "CLOSE_NORMAL",
    "CLOSE_POLICY",
    "CLOSE_PROTOCOL_ERROR",
    "CLOSE_TOO_BIG",
    "MAX_REQUEST_HEAD",
    "Transport",
    "WebSocketHandshakes",
    "WebSocketStream",
]

# What a WebSocket runs over: a socket, or TLS over it (stomp.wss_port).
Transport: TypeAlias = trio.SocketStream | trio.SSLStream[trio.SocketStream]

# Close codes (RFC 6455 section 7.4.1).
CLOSE_NORMAL = 1000  # DISCONNECT, or an ERROR the session explained itself
CLOSE_GOING_AWAY = 1001  # the broker stops
CLOSE_PROTOCOL_ERROR = 1002  # a frame that is not STOMP, or broken WebSocket framing
CLOSE_POLICY = 1008  # refused: connection limits, authentication, permissions
CLOSE_TOO_BIG = 1009  # a frame or message larger than stomp.max_frame_bytes

# A request head (request line and headers) larger than this is refused (431): a browser's
# is well under 8 KiB, and nothing is buffered beyond it.
MAX_REQUEST_HEAD = 16 * 1024
# A message may carry heart-beat EOLs around its frame: that much beyond max_frame_bytes.
_MESSAGE_ALLOWANCE = 4096
# How long a close we started waits for the client's answer before the socket closes.
_CLOSE_REPLY_S = 0.5
_READ_BYTES = 4096
# What a refused client may still send after its answer that is read and dropped.
_LINGER_BYTES = 4 * MAX_REQUEST_HEAD


class WebSocketStream(trio.abc.AsyncResource):
    """A client's WebSocket after its handshake, as the gateway's connection sees it:
    `receive_some` (STOMP bytes in, b"" at the end), `send_frames` (one message per
    frame), `aclose` (a close frame with `close_code`, then the socket)."""

    def __init__(
        self,
        transport: Transport,
        connection: Connection,
        max_frame_bytes: int,
        peer: str,
        logger: logging.Logger,
    ) -> None:
        self.transport = transport
        self._ws = connection
        #: The code of the close frame `aclose` sends (the gateway sets it as it learns
        #: why the connection ends).
        self.close_code = CLOSE_NORMAL
        self._max_frame_bytes = max_frame_bytes
        self._max_message = max_frame_bytes + _MESSAGE_ALLOWANCE
        self._peer = peer
        self._log = logger
        # The reader answers pings and closes while the writer may be sending: whoever
        # holds the lock sends what is owed (`_owed`), so no two tasks send at once.
        self._send_lock = trio.Lock()
        self._owed: list[bytes] = []
        # The answer to the latest ping while the writer holds the lock: only the latest
        # is answered (RFC 6455 5.5.3), so a client that floods pings and reads nothing
        # cannot make answers pile up.
        self._pong: bytes | None = None
        self._pending: list[bytes] = []
        self._message_bytes = 0
        self._error: ProtocolError | None = None
        # No more data from the client: it closed, or broke the framing.
        self._ended = False
        self._closed = False
        # Frames that came right behind the request are read before the socket is.
        self._primed = False

    async def receive_some(self, max_bytes: int) -> bytes:
        """The payload bytes of the client's next messages (b"": it closed, or its framing
        broke and the close says why). FrameTooLarge for a message past the limit, once
        the bytes before it are taken."""
        while True:
            if self._pending:
                data = b"".join(self._pending)
                self._pending.clear()
                return data
            if self._error is not None:
                raise self._error
            if self._ended:
                return b""
            if not self._primed:
                self._primed = True
                await self._handle_events()
                continue
            chunk = await self.transport.receive_some(max_bytes)
            if not chunk:
                self._ended = True  # gone without a close frame
                return b""
            self._ws.receive_data(bytes(chunk))
            await self._handle_events()

    async def _handle_events(self) -> None:
        for event in self._ws.events():
            if isinstance(event, TextMessage | BytesMessage):
                data = event.data.encode() if isinstance(event, TextMessage) else bytes(event.data)
                self._message_bytes += len(data)
                if self._message_bytes > self._max_message:
                    # Refused as it arrives, never buffered whole: the same ERROR as a
                    # frame too large on TCP, then a close 1009.
                    self._error = FrameTooLarge(
                        self._message_bytes, self._max_frame_bytes, at_least=True
                    )
                    self._ended = True
                    return
                self._pending.append(data)
                if event.message_finished:
                    self._message_bytes = 0
            elif isinstance(event, Ping):
                pong = self._ws.send(event.response())
                if self._send_lock.locked():
                    self._pong = pong
                else:
                    await self._send_control(pong)
            elif isinstance(event, CloseConnection):
                self._ended = True
                if self._ws.state is ConnectionState.REMOTE_CLOSING:
                    # The client closes: answered with its own code.
                    await self._send_control(self._ws.send(event.response()))
                else:
                    # wsproto found the client's framing broken (the state stays OPEN):
                    # `aclose` sends the close with its code (1002, 1007 bad UTF-8).
                    self.close_code = event.code
                    log_collapsed(
                        self._log,
                        logging.WARNING,
                        "WebSocket protocol error",
                        self._peer,
                        "WebSocket protocol error from %s: %s",
                        self._peer,
                        client_text(event.reason or str(event.code)),
                    )
                return
            # (A Pong answers nothing we asked.)

    async def _send_control(self, data: bytes) -> None:
        """A pong or close from the reader: sent now, or by the writer with its frames
        if it is sending (a reader must not wait behind a client that does not read)."""
        self._owed.append(data)
        if not self._send_lock.locked():
            async with self._send_lock:
                await self._drain()

    async def _drain(self) -> None:
        while self._owed or self._pong is not None:
            if self._pong is not None:
                self._owed.append(self._pong)
                self._pong = None
            data = b"".join(self._owed)
            self._owed.clear()
            await self.transport.send_all(data)

    @property
    def is_open(self) -> bool:
        """Whether frames may still be sent (no close was sent or received)."""
        return self._ws.state is ConnectionState.OPEN

    async def send_frames(self, frames: list[bytes | memoryview]) -> None:
        """Each frame (or heart-beat EOL) as one message: text when it is UTF-8, which a
        browser hands to a page as a string, binary otherwise (stomp.js reads both)."""
        ws = self._ws
        if ws.state is not ConnectionState.OPEN:
            raise trio.ClosedResourceError("the WebSocket is closing")
        out = []
        for frame in frames:
            data = bytes(frame)
            try:
                out.append(ws.send(TextMessage(data=data.decode())))
            except UnicodeDecodeError:
                out.append(ws.send(BytesMessage(data=data)))
        async with self._send_lock:
            self._owed += out
            await self._drain()

    async def aclose(self) -> None:
        """Close frame (`close_code`) unless one was exchanged, a short wait for the
        client's answer, then the transport (TLS says close_notify)."""
        if self._closed:
            return
        self._closed = True
        ws = self._ws
        try:
            if ws.state is ConnectionState.OPEN:
                await self._send_control(ws.send(CloseConnection(code=self.close_code)))
            if ws.state is ConnectionState.LOCAL_CLOSING and not self._ended:
                with trio.move_on_after(_CLOSE_REPLY_S):
                    while ws.state is ConnectionState.LOCAL_CLOSING:
                        chunk = await self.transport.receive_some(_READ_BYTES)
                        if not chunk:
                            break
                        ws.receive_data(bytes(chunk))
                        for _ in ws.events():
                            pass  # what comes after our close is not read (RFC 6455 5.5.1)
            if isinstance(self.transport, trio.SSLStream):
                await self.transport.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            pass
        finally:
            await trio.aclose_forcefully(self.transport)


class WebSocketHandshakes:
    """The opening handshakes of one gateway's WebSocket listeners.

    Each runs in its connection's task, within `stomp.connect_timeout_ms` of the accept
    (TLS's included, for wss), as its TLS handshake does: a client that connects and says
    nothing is dropped then, and it counts as connecting meanwhile
    (`broker.max_connections_connecting`): the gateway may close it to make room for a
    newer connection, by cancelling `complete` (which then leaves its stream to the
    gateway). A refusal is an HTTP answer saying why, and a log line collapsed per address.
    """

    def __init__(
        self, allowed_origins: str, timeout_s: float, max_frame_bytes: int, logger: logging.Logger
    ) -> None:
        # (Checked when the configuration was loaded.)
        self.allowed = parse_allowed_origins(allowed_origins)
        self.timeout_s = timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.log = logger

    async def complete(
        self, stream: Transport, peer: str, deadline: float
    ) -> WebSocketStream | None:
        """Read the request, answer it: the WebSocket when it is taken, None when it is
        not (refused, the client left or was too slow: its stream is closed)."""
        parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD)
        waited_s = deadline - trio.current_time()  # (for the log: a refusal waits 1 s)
        refusal: HandshakeRefused | None = None
        accepted = None
        left = False
        with trio.move_on_at(deadline) as scope:
            try:
                request = await _read_request(stream, parser)
                if request is None:
                    left = True
                else:
                    accepted = accept_request(
                        request.method.decode("ascii", "replace"),
                        request.target.decode("ascii", "replace"),
                        [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers],
                        self.allowed,
                    )
                    await stream.send_all(accepted.response())
            except HandshakeRefused as exc:
                refusal = exc
            except h11.RemoteProtocolError as exc:
                refusal = (
                    RequestTooLarge(MAX_REQUEST_HEAD)
                    if exc.error_status_hint == 431
                    else MalformedRequest(str(exc))
                )
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                left = True
            except Exception:
                # One connection's failure must never take the gateway down; what went
                # wrong is for the log, not for the client.
                self.log.exception("WebSocket handshake from %s failed", peer)
                refusal = MalformedRequest("the broker could not read it")
        if scope.cancelled_caught:
            log_collapsed(
                self.log,
                logging.INFO,
                "WebSocket handshake not completed",
                peer,
                "WebSocket handshake not completed from %s: none within %.0f ms%s",
                peer,
                waited_s * 1000,
                " (stomp.connect_timeout_ms)" if waited_s >= self.timeout_s else "",
            )
        elif refusal is not None:
            log_collapsed(
                self.log,
                logging.WARNING,
                "WebSocket handshake refused",
                peer,
                "WebSocket handshake from %s refused (%d): %s",
                peer,
                refusal.status,
                client_text(str(refusal)),
            )
            with (
                trio.move_on_after(1),
                contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
            ):
                await stream.send_all(refusal.response())
                await _linger(stream)
        if accepted is None or scope.cancelled_caught or left:
            await trio.aclose_forcefully(stream)
            return None
        if self.log.isEnabledFor(logging.DEBUG):
            self.log.debug(
                "ws connection from %s: %s, subprotocol %s, origin %s",
                peer,
                accepted.path,
                accepted.subprotocol or "none",
                client_text(accepted.origin or "none"),
            )
        # Frames a client sent right behind its request (before our answer) are kept.
        trailing = bytes(parser.trailing_data[0])
        connection = Connection(ConnectionType.SERVER, trailing_data=trailing)
        return WebSocketStream(stream, connection, self.max_frame_bytes, peer, self.log)


async def _linger(stream: Transport) -> None:
    """After an answer, read (a bounded amount of) what the client still sends before the
    socket closes: closed with unread bytes, it resets, and the client may lose the answer."""
    if not isinstance(stream, trio.SocketStream):
        return
    await stream.send_eof()
    drained = 0
    while drained < _LINGER_BYTES:
        chunk = await stream.receive_some(_READ_BYTES)
        if not chunk:
            return
        drained += len(chunk)


async def _read_request(stream: Transport, parser: h11.Connection) -> h11.Request | None:
    """The request head (None: the client left first). h11 holds at most
    MAX_REQUEST_HEAD bytes of it (RemoteProtocolError past that)."""
    while True:
        event = parser.next_event()
        if event is h11.NEED_DATA:
            parser.receive_data(bytes(await stream.receive_some(_READ_BYTES)))
            continue
        if isinstance(event, h11.Request):
            return event
        return None  # ConnectionClosed
