"""The sans-IO core of the client: everything the sync and the trio shells share lives here.

A :class:`ClientSession` turns method calls into bytes to send and received bytes into events,
and keeps the state both shells would otherwise duplicate: the negotiated version, pending
receipts, active subscriptions, heart-beat deadlines, and why the connection closed. It never
touches a socket, a thread or a clock other than the one it is given, so it is tested by
feeding it bytes. The shells hold whatever lock they need around it; it is not thread-safe.
"""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from mpbroker.client._errors import ConnectionClosed, ReceiptTimeout, StompError
from mpbroker.client._message import Message
from mpbroker.stomp import (
    HEARTBEAT_BYTES,
    SERVER_COMMANDS,
    Frame,
    FrameLimits,
    FrameParser,
    ProtocolError,
    encode_frame,
    negotiate_heartbeat,
    parse_heartbeat,
)

SUPPORTED_VERSIONS = ("1.0", "1.1", "1.2")
ACK_MODES = frozenset({"auto", "client", "client-individual"})
# ActiveMQ's name for the per-subscription window of unacknowledged messages; Artemis and
# our broker read the same header, so the client speaks it rather than inventing one.
PREFETCH_HEADER = "activemq.prefetchSize"
# STOMP 1.2 leaves the grace period to the implementation; twice the interval tolerates one
# late heart-beat on a busy machine without keeping a dead server for long.
HEARTBEAT_TOLERANCE = 2.0
TEXT_CONTENT_TYPE = "text/plain;charset=utf-8"
# The largest frame the client accepts. A MESSAGE is the SEND's body plus the headers the
# broker adds (message-id, subscription, ack, ...), so a client must accept more than the
# broker's own max_frame_bytes or the largest message a broker takes could never be
# delivered. 8x the codec's 1 MiB default covers that and RabbitMQ's 4 MiB; a client's one
# connection can afford the memory a broker cannot give each of thousands.
DEFAULT_MAX_FRAME_BYTES = 8 * FrameLimits().max_frame_bytes


class State(enum.Enum):
    CONNECTING = "connecting"
    CONNECTED = "connected"
    # DISCONNECT was sent: only its RECEIPT (and stray frames) may still arrive.
    DISCONNECTING = "disconnecting"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Connected:
    """CONNECTED arrived; the session's version and heart-beat intervals are now set."""

    version: str
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class Delivery:
    """A MESSAGE for an active subscription."""

    message: Message


@dataclass(frozen=True, slots=True)
class ReceiptReceived:
    """The RECEIPT for a receipt id the session was waiting for."""

    receipt_id: str


@dataclass(frozen=True, slots=True)
class SessionClosed:
    """The session closed because of what the server sent (ERROR or a protocol violation)."""

    reason: ConnectionClosed


Event = Connected | Delivery | ReceiptReceived | SessionClosed


@dataclass(frozen=True, slots=True)
class Outgoing:
    """Bytes to send now; ``receipt`` is the receipt id to wait for, if one was requested."""

    data: bytes
    receipt: str | None = None


@dataclass(frozen=True, slots=True)
class SubscriptionInfo:
    id: str
    destination: str
    ack_mode: str


class SessionView:
    """The read-only state both connection shells expose, from their `_session`."""

    _session: ClientSession

    @property
    def version(self) -> str:
        """The STOMP version the server chose."""
        return self._session.version

    @property
    def server_headers(self) -> dict[str, str]:
        """The headers of the server's CONNECTED frame."""
        return self._session.server_headers

    @property
    def closed(self) -> bool:
        return self._session.closed

    @property
    def error(self) -> StompError | None:
        """The ERROR the server sent, if any (it closed the connection)."""
        return self._session.error


class ClientSession:
    """Client side of one STOMP connection, without I/O.

    Frame-building methods raise :class:`ConnectionClosed` once the session is closed, and
    ``ValueError`` for arguments the protocol cannot express. The caller must send the bytes
    they return, in the order returned: the heart-beat timer assumes they go out at once.
    """

    def __init__(
        self,
        host: str,
        *,
        login: str | None = None,
        passcode: str | None = None,
        client_id: str | None = None,
        heartbeat: tuple[int, int] = (0, 0),
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        cx, cy = heartbeat
        if cx < 0 or cy < 0:
            raise ValueError(f"heartbeat intervals must be >= 0 ms, got {heartbeat!r}")
        self._host = host
        self._login = login
        self._passcode = passcode
        self._client_id = client_id
        self._heartbeat = (int(cx), int(cy))
        self._clock = clock
        self._parser = FrameParser(
            FrameLimits(max_frame_bytes=max_frame_bytes), commands=SERVER_COMMANDS
        )
        self._ids = itertools.count(1)
        self._pending_receipts: dict[str, str] = {}  # receipt id -> command, for messages
        self._done_receipts: set[str] = set()
        self._subscriptions: dict[str, SubscriptionInfo] = {}
        self._disconnect_receipt: str | None = None
        self._last_sent = clock()
        self._last_received = self._last_sent

        self.state = State.CONNECTING
        self.version = "1.2"  # until CONNECTED says otherwise
        self.server_headers: dict[str, str] = {}
        self.send_interval_s = 0.0  # 0: we send no heart-beats
        self.expect_interval_s = 0.0  # 0: we do not watch the server
        self.error: StompError | None = None
        self.close_reason: ConnectionClosed | None = None

    # --- state -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    def close(self, reason: str) -> None:
        """Move to CLOSED. The first reason sticks: later ones describe consequences."""
        if self.state is State.CLOSED:
            return
        self.state = State.CLOSED
        self.close_reason = ConnectionClosed(reason, self.error)

    def closed_error(self, operation: str) -> ConnectionClosed:
        """The exception for an operation attempted on the closed session."""
        assert self.close_reason is not None
        return ConnectionClosed(f"cannot {operation}: {self.close_reason.reason}", self.error)

    def _ensure_open(self, operation: str) -> None:
        if self.state is State.CONNECTED:
            return
        if self.state is State.CLOSED:
            raise self.closed_error(operation)
        if self.state is State.DISCONNECTING:
            raise ConnectionClosed(f"cannot {operation}: the client is disconnecting", None)
        raise RuntimeError(f"cannot {operation} before CONNECTED")

    # --- incoming --------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes from the server; return what they mean, in order.

        Never raises: a protocol violation closes the session and ends the list with
        :class:`SessionClosed`. Bytes after the frame that closed the session are ignored.
        """
        if self.state is State.CLOSED:
            return []
        self._last_received = self._clock()
        try:
            frames = self._parser.feed(data)
        except ProtocolError as exc:
            return [self._violation(f"protocol error from the server: {exc}")]
        events: list[Event] = []
        for frame in frames:
            event = self._handle(frame)
            if event is not None:
                events.append(event)
            if self.closed:
                break
        return events

    def _handle(self, frame: Frame) -> Event | None:
        command = frame.command
        if self.state is State.CONNECTING:
            if command == "CONNECTED":
                return self._on_connected(frame)
            if command == "ERROR":
                return self._on_error(frame)
            return self._violation(f"expected CONNECTED or ERROR, got {command}")
        if command == "MESSAGE":
            return self._on_message(frame)
        if command == "RECEIPT":
            return self._on_receipt(frame)
        if command == "ERROR":
            return self._on_error(frame)
        return self._violation(f"unexpected {command} frame after CONNECTED")

    def _violation(self, reason: str) -> SessionClosed:
        self.close(reason)
        assert self.close_reason is not None
        return SessionClosed(self.close_reason)

    def _on_connected(self, frame: Frame) -> Event:
        headers = frame.headers
        # A 1.0 server does not know the version header; its absence means 1.0.
        version = headers.get("version", "1.0")
        if version not in SUPPORTED_VERSIONS:
            return self._violation(f"server chose unsupported STOMP version {version!r}")
        try:
            server_hb = parse_heartbeat(headers.get("heart-beat", "0,0"))
        except ProtocolError as exc:
            return self._violation(f"bad heart-beat header in CONNECTED: {exc}")
        # negotiate_heartbeat answers for the side that owns `server`; the rule is symmetric,
        # so passing our own header as `server` gives our (send, expect) intervals.
        send_ms, expect_ms = negotiate_heartbeat(client=server_hb, server=self._heartbeat)
        self.version = version
        self._parser.version = version
        self.server_headers = dict(headers)
        self.send_interval_s = send_ms / 1000.0
        self.expect_interval_s = expect_ms / 1000.0
        self.state = State.CONNECTED
        return Connected(version, dict(headers))

    def _on_error(self, frame: Frame) -> SessionClosed:
        headers = frame.headers
        self.error = StompError(headers.get("message", ""), headers, frame.body)
        # The server closes the socket after an ERROR (STOMP 1.2, "ERROR"), so do we.
        return self._violation("the server sent an ERROR frame")

    def _on_receipt(self, frame: Frame) -> Event | None:
        receipt_id = frame.headers.get("receipt-id", "")
        # An unknown id is a RECEIPT that came after its waiter gave up: harmless.
        if self._pending_receipts.pop(receipt_id, None) is None:
            return None
        self._done_receipts.add(receipt_id)
        if receipt_id == self._disconnect_receipt:
            # The server has processed everything we sent; the connection is over by our
            # choice, whatever the socket does next.
            self.close("the client disconnected")
        return ReceiptReceived(receipt_id)

    def _on_message(self, frame: Frame) -> Event | None:
        headers = frame.headers
        sub_id = headers.get("subscription")
        info = self._subscriptions.get(sub_id) if sub_id is not None else None
        if sub_id is None:
            # 1.0 servers may omit the header; route by destination when that is unambiguous.
            matches = [
                s
                for s in self._subscriptions.values()
                if s.destination == headers.get("destination")
            ]
            info = matches[0] if len(matches) == 1 else None
        if info is None:
            # A MESSAGE for a subscription we already unsubscribed: it was in flight.
            return None
        message = Message(
            destination=headers.get("destination", info.destination),
            message_id=headers.get("message-id", ""),
            subscription=info.id,
            ack_id=headers.get("ack"),
            headers=dict(headers),
            body=frame.body,
        )
        return Delivery(message)

    # --- outgoing --------------------------------------------------------------------------

    def connect(self) -> bytes:
        """The CONNECT frame; call once, first."""
        if self.state is not State.CONNECTING:
            raise RuntimeError(f"connect() in state {self.state.value}")
        headers = {
            "accept-version": ",".join(SUPPORTED_VERSIONS),
            "host": self._host,
            "heart-beat": f"{self._heartbeat[0]},{self._heartbeat[1]}",
        }
        if self._login is not None:
            headers["login"] = self._login
        if self._passcode is not None:
            headers["passcode"] = self._passcode
        if self._client_id is not None:
            headers["client-id"] = self._client_id
        self._last_sent = self._clock()
        return encode_frame(Frame("CONNECT", headers, b""), version="1.2")

    def _build(
        self,
        command: str,
        headers: dict[str, str],
        body: bytes = b"",
        *,
        receipt: bool,
    ) -> Outgoing:
        receipt_id = None
        if receipt:
            receipt_id = f"rcpt-{next(self._ids)}"
            headers["receipt"] = receipt_id
        data = encode_frame(Frame(command, headers, body), version=self.version)
        # Register only once encoding succeeded, or a refused frame would leave a receipt
        # pending forever.
        if receipt_id is not None:
            self._pending_receipts[receipt_id] = command
        self._last_sent = self._clock()
        return Outgoing(data, receipt_id)

    def send(
        self,
        destination: str,
        body: bytes | str = b"",
        headers: Mapping[str, str] | None = None,
        *,
        receipt: bool = False,
    ) -> Outgoing:
        """A SEND frame. A ``str`` body is UTF-8 and gets a text/plain content-type unless
        ``headers`` names one."""
        self._ensure_open("send()")
        frame_headers = dict(headers or {})
        if isinstance(body, str):
            body = body.encode("utf-8")
            frame_headers.setdefault("content-type", TEXT_CONTENT_TYPE)
        frame_headers["destination"] = destination
        return self._build("SEND", frame_headers, body, receipt=receipt)

    def subscribe(
        self,
        destination: str,
        *,
        ack: str = "auto",
        id: str | None = None,
        prefetch: int | None = None,
        selector: str | None = None,
        headers: Mapping[str, str] | None = None,
        receipt: bool = True,
    ) -> tuple[SubscriptionInfo, Outgoing]:
        """A SUBSCRIBE frame; the subscription is active (routes messages) from now on.
        `selector`: a JMS message selector (the `selector` header, docs/selectors.md)."""
        self._ensure_open("subscribe()")
        if ack not in ACK_MODES:
            raise ValueError(f"ack mode must be one of {sorted(ACK_MODES)}, got {ack!r}")
        sub_id = id if id is not None else f"sub-{next(self._ids)}"
        if sub_id in self._subscriptions:
            raise ValueError(f"subscription id {sub_id!r} is already in use on this connection")
        frame_headers = dict(headers or {})
        frame_headers.update(destination=destination, id=sub_id, ack=ack)
        if prefetch is not None:
            frame_headers[PREFETCH_HEADER] = str(prefetch)
        if selector is not None:
            frame_headers["selector"] = selector
        out = self._build("SUBSCRIBE", frame_headers, receipt=receipt)
        info = SubscriptionInfo(sub_id, destination, ack)
        self._subscriptions[sub_id] = info
        return info, out

    def unsubscribe(self, sub_id: str, *, receipt: bool = True) -> Outgoing:
        """An UNSUBSCRIBE frame; messages still in flight for it are dropped from now on."""
        self._ensure_open("unsubscribe()")
        if sub_id not in self._subscriptions:
            raise ValueError(f"subscription {sub_id!r} is not active on this connection")
        out = self._build("UNSUBSCRIBE", {"id": sub_id}, receipt=receipt)
        del self._subscriptions[sub_id]
        return out

    def ack(self, message: Message, *, receipt: bool = False) -> Outgoing:
        return self._acknowledge("ACK", message, receipt)

    def nack(self, message: Message, *, receipt: bool = False) -> Outgoing:
        return self._acknowledge("NACK", message, receipt)

    def _acknowledge(self, command: str, message: Message, receipt: bool) -> Outgoing:
        operation = f"{command.lower()}()"
        self._ensure_open(operation)
        if self.version == "1.2":
            if message.ack_id is None:
                raise ValueError(
                    f"cannot {operation} message {message.message_id!r}: it has no ack header "
                    f"(its subscription {message.subscription!r} uses ack mode 'auto')"
                )
            headers = {"id": message.ack_id}
        elif command == "NACK" and self.version == "1.0":
            raise ValueError("NACK needs STOMP 1.1 or later; the server negotiated 1.0")
        else:
            headers = {"message-id": message.message_id}
            if self.version == "1.1":
                headers["subscription"] = message.subscription
        return self._build(command, headers, receipt=receipt)

    def disconnect(self, *, receipt: bool = True) -> Outgoing:
        """The DISCONNECT frame; afterwards only its RECEIPT is expected."""
        self._ensure_open("disconnect()")
        out = self._build("DISCONNECT", {}, receipt=receipt)
        self._disconnect_receipt = out.receipt
        self.state = State.DISCONNECTING
        return out

    # --- receipts --------------------------------------------------------------------------

    def receipt_settled(self, receipt_id: str) -> bool:
        """True once waiting for ``receipt_id`` is over: it arrived, or the session closed."""
        return receipt_id in self._done_receipts or self.state is State.CLOSED

    def finish_receipt(self, receipt_id: str, timeout_s: float) -> None:
        """Stop waiting for ``receipt_id``: return if it arrived, else raise why not.

        Raises a copy of the server's :class:`StompError` if an ERROR closed the session,
        :class:`ConnectionClosed` if it closed otherwise, :class:`ReceiptTimeout` if it is
        still open (``timeout_s`` only goes into that message).
        """
        if receipt_id in self._done_receipts:
            self._done_receipts.discard(receipt_id)
            return
        command = self._pending_receipts.pop(receipt_id, "frame")
        if self.state is State.CLOSED:
            if self.error is not None:
                raise self.error.copy()
            raise self.closed_error(f"get the RECEIPT for {command}")
        raise ReceiptTimeout(command, receipt_id, timeout_s)

    # --- heart-beats -----------------------------------------------------------------------

    def poll_heartbeat(self) -> tuple[bytes, float | None]:
        """Drive the heart-beat timers: return (bytes to send now, seconds until next call).

        ``None`` means no further call is needed (no heart-beats, or closed). If the server
        has been silent for longer than ``HEARTBEAT_TOLERANCE`` intervals, the session closes
        and ``(b"", None)`` is returned; the caller checks :attr:`closed`.
        """
        if self.state not in (State.CONNECTED, State.DISCONNECTING):
            return b"", None
        now = self._clock()
        data = b""
        waits: list[float] = []
        if self.expect_interval_s:
            limit = HEARTBEAT_TOLERANCE * self.expect_interval_s
            silent = now - self._last_received
            if silent >= limit:
                self.close(
                    f"no data from the server for {silent:.3f} s "
                    f"(heart-beats were due every {self.expect_interval_s:g} s)"
                )
                return b"", None
            waits.append(limit - silent)
        if self.send_interval_s:
            due = self._last_sent + self.send_interval_s
            if now >= due:
                data = HEARTBEAT_BYTES
                self._last_sent = now
                due = now + self.send_interval_s
            waits.append(due - now)
        return data, (min(waits) if waits else None)
