"""The server side of one STOMP connection, as a sans-IO state machine.

The gateway shell feeds it events -- frames from the client (`frame_received`), what went
wrong with the connection (`frame_error`, `timed_out`, `closed`, `broker_stopping`), what
its pipelines answered (`deliver`, `receipt`, `refused`, `barrier_done`,
`pipeline_restarted`) -- and takes what the session wants done with `take_output()`: bytes
for the socket and records for the pipelines. It never writes the session's fields; the
session's state (`_state`) says whether to read more (`accepts_frames()`) and whether the
connection ends once the output is written (`is_ending()`).

The session owns everything a gateway knows about a connection: version and heart-beat
negotiation, the subscription table (STOMP ids <-> gateway handles), open transactions, and
receipts that need several pipelines to answer (DISCONNECT, COMMIT).

No sockets, no clocks: times come in as arguments.

Compression (`[compression]`): a SEND body over `threshold_bytes` becomes a compressed
Message (`encoding` names the codec) here, before anything else sees it, so rings, stores,
transactions and limits all handle the compressed bytes; `deliver` decompresses once per
delivered message, so the consumer receives the original body.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from mpbroker.compression import CorruptBody, compress, decompress
from mpbroker.config import Config
from mpbroker.errors import (
    AccessDenied,
    LimitReached,
    MessageTooLarge,
    ReceiptInDoubt,
    Refusal,
    UnsupportedHeader,
)
from mpbroker.records import (
    ACK_AUTO,
    ACK_MODES,
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
from mpbroker.routing import (
    TEMPORARY_PREFIXES,
    TOPIC_PREFIX,
    Topology,
    UnknownDestination,
    check_client_destination,
    parse_destination,
)
from mpbroker.security import ANONYMOUS, AccessControl
from mpbroker.selector import SelectorError, compile_selector
from mpbroker.stomp import (
    SUPPORTED_VERSIONS,
    Frame,
    ProtocolError,
    encode_frame,
    escape_header_value,
    frame_bytes,
    negotiate_heartbeat,
    negotiate_version,
    parse_heartbeat,
    plain_header_text,
)

from ._headers import (
    DROPPED_FROM_SEND,
    FAMILIES,
    HONOURED,
    SEND_ATTENTION,
    HeaderRule,
    boolean,
    rule_for,
)
from ._state import READING, WRITING, Event, SessionState, SessionStateError, transition
from ._transactions import TransactionBudget

__all__ = ["GatewaySession", "SessionError", "SessionOutput"]

BROKER_NAME = "mpbroker"

log = logging.getLogger("mpbroker.gateway")

_LINE_BREAKS = re.compile(r"[\r\n]")
_LINE_BREAKS_AND_COLONS = re.compile(r"[\r\n:]")

# Headers the broker consumes from a SEND, and headers only the broker may set on a
# MESSAGE (a producer must not forge an ack id or a redelivered flag, nor make a message
# look dead-lettered or expired from another queue, which consumers trust: the table's
# "dropped" ones); everything else travels with the message.
_SEND_CONTROL_HEADERS: Final = (
    frozenset({"destination", "receipt", "content-length", "transaction"}) | DROPPED_FROM_SEND
)
_ARTICLE = {"id": "an"}
# Access answers a connection remembers (a client sending to ever new destinations
# starts again from nothing past this many).
_PERMITS_REMEMBERED = 1024
# Destinations whose pipeline a session remembers (every SEND asks; the topology never
# changes while the broker runs), forgotten all at once beyond this.
_OWNERS_REMEMBERED = 1024
# The header table (docs/headers.md), as the SEND path reads it for every header: the names
# it looks up, and the vendor families it looks up too; any other header is carried.
_SEND_ATTENTION: Final = SEND_ATTENTION
_FAMILIES: Final = FAMILIES
# Per SEND header name, whether it needs that look: asked once per name (clients reuse
# their names), the answers forgotten all at once beyond _ATTENTION_AT_MOST names.
_ATTENTION: Final[dict[str, bool]] = {}
_ATTENTION_AT_MOST: Final = 4096
# Per other frame, the names it honours whatever their value: no look-up for those (an ACK
# is as frequent as a SEND).
_HONOURED: Final = HONOURED
# Header names a connection logs as ignored, at most (a client inventing new names for
# every frame must not grow the session).
_NOTED_AT_MOST = 64
# The headers that name a durable subscription, the first present winning: ActiveMQ's,
# Artemis' and its older one, and ActiveMQ 4's misspelling (NMS.Stomp still sends it).
_DURABLE_NAMES = (
    "activemq.subscriptionName",
    "durable-subscription-name",
    "durable-subscriber-name",
    "activemq.subcriptionName",
)
# Artemis' routing types, and the kind of destination each one means.
_ROUTING_TYPES = {"ANYCAST": "queue", "MULTICAST": "topic"}


class SessionError(Refusal):
    """Something the client did wrong: becomes an ERROR frame (answering the frame's
    receipt, if it asked for one), then the connection closes."""


@dataclass(eq=False, slots=True)
class _Subscription:
    handle: int
    sub_id: str
    destination: str
    pipeline: int
    ack_mode: int
    prefetch: int
    # b"MESSAGE\nsubscription:<id>\n", escaped for the connection's version.
    message_prefix: bytes
    durable: str = ""
    selector: str = ""


_MESSAGE_LINE = b"MESSAGE\n"


def _needs_attention(key: str) -> bool:
    """Whether the SEND path looks header `key` up in the table (`_ATTENTION`'s answer)."""
    attention = key in _SEND_ATTENTION or key.startswith(_FAMILIES)
    if len(_ATTENTION) >= _ATTENTION_AT_MOST:
        _ATTENTION.clear()
    _ATTENTION[key] = attention
    return attention


def _boolean_value(name: str, text: str) -> bool:
    """Boolean header `name`'s value (`boolean`: true or false in any case); SessionError
    for any other, which is never taken for false."""
    value = boolean(text)
    if value is None:
        raise SessionError(f"header {name}:{text!r} must be true or false")
    return value


def _flag(headers: dict[str, str], name: str, default: bool = False) -> bool:
    """Boolean header `name` (`_boolean_value`), `default` when it is absent."""
    text = headers.get(name)
    return default if text is None else _boolean_value(name, text)


def _durable_flag(headers: dict[str, str]) -> bool:
    """RabbitMQ's `durable:true`, or its older `persistent:true`, on SUBSCRIBE/UNSUBSCRIBE."""
    durable = _flag(headers, "durable")
    persistent = _flag(headers, "persistent")  # (checked either way)
    return durable or persistent


def _message_tail(message: Message, version: str) -> bytes:
    """A MESSAGE frame for `message` without its command line: the broker's headers, the
    sender's headers, the original body (decompressed: content-length is the original's).
    Prefixed per subscriber (see GatewaySession.deliver). CorruptBody when the body does
    not decompress."""
    body = decompress(message.body, message.encoding)
    headers = message.headers
    lines = [f"message-id:{message.message_id}", f"destination:{message.destination}"]
    if message.redelivered:
        lines.append("redelivered:true")
        # The JMS name for how often the message has been delivered, this time included.
        lines.append(f"JMSXDeliveryCount:{message.deliveries + 1}")
    plain: str | None = None
    if not headers:
        plain = plain_header_text(lines)
    elif headers.keys().isdisjoint(_TAIL_SPECIAL):
        for key, value in headers.items():
            lines.append(f"{key}:{value}")
        plain = plain_header_text(lines)
    if plain is not None:
        # The common case, written directly: nothing to escape, no header of the sender's
        # that the broker's own lines must shadow.
        return frame_bytes(f"{plain}\ncontent-length:{len(body)}\n\n", body)
    return _message_tail_escaped(message, body, version)


# Keys of a message's own headers that send its MESSAGE frame the careful way: the broker's
# header names (a stored message from before they were stripped at SEND must not shadow
# them), content-length (checked against the body) and an empty name (refused).
_TAIL_SPECIAL = frozenset(
    {"message-id", "destination", "redelivered", "JMSXDeliveryCount", "content-length", ""}
)


def _message_tail_escaped(message: Message, body: bytes, version: str) -> bytes:
    """`_message_tail` for headers that need escaping or checking: through encode_frame."""
    headers = {"message-id": message.message_id, "destination": message.destination}
    if message.redelivered:
        headers["redelivered"] = "true"
        headers["JMSXDeliveryCount"] = str(message.deliveries + 1)
    for key, value in message.headers.items():
        # (content-length is the broker's to write, and SEND strips it, as it refuses an
        # empty name: a message stored by an older broker could still hold either.)
        if key not in headers and key and key != "content-length":
            headers[key] = value
    frame = Frame("MESSAGE", headers, body)
    try:
        data = encode_frame(frame, version)
    except ValueError:
        # A 1.2 producer's header holds what a 1.0/1.1 consumer's frame cannot carry (those
        # versions cannot escape a CR, 1.0 nothing at all): blank it rather than let the
        # header spill into others or end its name early.
        names = _LINE_BREAKS_AND_COLONS if version == "1.0" else _LINE_BREAKS
        frame.headers = {names.sub(" ", k): _LINE_BREAKS.sub(" ", v) for k, v in headers.items()}
        data = encode_frame(frame, version)
    return data[len(_MESSAGE_LINE) :]


@dataclass(eq=False, slots=True)
class _Transaction:
    """An open transaction's frames, held until COMMIT (its bytes are counted in the
    gateway's `TransactionBudget`)."""

    name: str
    routes: list[tuple[int, Record]] = field(default_factory=list)


@dataclass(slots=True)
class SessionOutput:
    """What a session wants done, taken with `GatewaySession.take_output()`.

    `data` goes to the socket, in order; `records` go to the pipelines (`(pipeline index,
    record)`), in order. Any task may take it: the bytes wait in the shell for the socket.
    When the shell hands bytes to the socket it feeds `data_sent()`: only then do the
    auto-acknowledged deliveries among them leave their windows (their credits come with the
    next output), so a consumer's window still bounds what the gateway holds for it."""

    data: list[bytes | memoryview] = field(default_factory=list)
    records: list[tuple[int, Record]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.data or self.records)


@dataclass(eq=False, slots=True)
class _PendingReceipt:
    """A receipt sent once every pipeline in `waiting` answered its Barrier; or, with
    `suspects`, the probe of a restarted pipeline: the receipts it still owes once it has
    handled everything before the probe died with its predecessor (`pipeline_restarted`)."""

    receipt: str
    waiting: set[int]
    then_close: bool
    suspects: frozenset[tuple[str, int]] | None = None


class GatewaySession:
    """One client connection: STOMP frames in, bytes and pipeline records out."""

    def __init__(
        self,
        conn: int,
        config: Config,
        topology: Topology,
        message_ids: Iterator[str],
        tx_budget: TransactionBudget,
        access: AccessControl | None = None,
    ) -> None:
        self.conn = conn
        #: Fixed for the session's life (a reload applies to connections made after it).
        self.config = config
        # Read by every SEND: kept here rather than looked up through the config each time.
        self._max_message_bytes = config.memory.max_message_bytes
        self._compress_over = config.compression.threshold_bytes
        self.topology = topology
        self.message_ids = message_ids
        self.tx_budget = tx_budget
        self._state = SessionState.AWAITING_CONNECT
        self._version = "1.2"
        # (send_every_ms, expect_every_ms), 0 = off; set by CONNECT.
        self._heartbeat = (0, 0)
        self._client_id = ""
        # The CONNECT's login, checked or not ("" if none).
        self._login = ""
        #: Who the connection is: set by the shell from the CONNECT's login before the
        #: CONNECT is handed over ("" until then, or with no authentication), with the
        #: user's groups.
        self.user = ""
        self.groups: tuple[str, ...] = ()
        #: Who may read and write what ([[security.acl]]); the shell puts the reloaded one
        #: here on SIGHUP.
        self.access = access if access is not None else AccessControl()
        #: An access refusal's message since the shell last looked ("": none), to log.
        self.denial = ""
        # What `access` answered, per (permission, destination), while it is that one.
        self._permits: dict[tuple[str, str], bool] = {}
        self._permits_of = self.access
        self._owners: dict[str, int] = {}
        self._data: list[bytes | memoryview] = []
        #: Frames written to `_data` so far (the gateway's frames-out counter).
        self.frames_out = 0
        #: Each element of `SessionOutput.data` one whole frame (or a heart-beat), for a
        #: WebSocket connection (a frame a message); else a MESSAGE comes in pieces (its
        #: shared tail is not copied), which a byte stream joins anyway.
        self.whole_frames = False
        self._records: list[tuple[int, Record]] = []
        self._subs_by_id: dict[str, _Subscription] = {}
        self._subs: dict[int, _Subscription] = {}
        self._handles = itertools.count(1)
        self._tokens = itertools.count(1)
        # The pipelines this connection sent anything to: they hear of its end.
        self._touched: set[int] = set()
        self._transactions: dict[str, _Transaction] = {}
        # The ERROR message of a discard of our transactions not yet reported to the shell.
        self._discard_reason = ""
        self._pending_receipts: dict[int, _PendingReceipt] = {}
        # Receipts a pipeline owes for a record that carries one (SEND, ACK, NACK,
        # SUBSCRIBE, UNSUBSCRIBE): (receipt, pipeline) -> how many records carry it.
        self._owed: dict[tuple[str, int], int] = {}
        # Pipelines that restarted after this connection sent to them: what they took
        # from their rings before dying may not have been handled, so a DISCONNECT receipt
        # cannot promise it was (see `pipeline_restarted`).
        self._in_doubt: set[int] = set()
        # Auto-ack deliveries per subscription handle: in `_data` (not taken yet), and taken
        # but not yet handed to the socket; credited at `data_sent()`.
        self._auto_delivered: dict[int, int] = {}
        self._auto_taken: dict[int, int] = {}
        #: Lines for the shell to log (a header ignored on purpose, once per connection
        #: and name); the shell empties it.
        self.notices: list[str] = []
        self._noted: set[str] = set()
        # The SEND `refuses_send` checked last (its headers, destination and permission),
        # so `_send` need not check them again.
        self._checked: Frame | None = None

    # -- what the shell may read ---------------------------------------------------------

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def version(self) -> str:
        """The negotiated STOMP version ("1.2" until CONNECT says otherwise)."""
        return self._version

    @property
    def client_id(self) -> str:
        """The `client-id` CONNECT gave ("" if none): durable subscriptions are named by it."""
        return self._client_id

    @property
    def heartbeat(self) -> tuple[int, int]:
        """(send every ms, expect every ms) as negotiated; 0 = off."""
        return self._heartbeat

    # Methods, not properties: every event may change them (and a type checker would
    # take a property read twice for the same value).
    def accepts_frames(self) -> bool:
        """Whether client frames are still read and handled."""
        return self._state in READING

    def is_ending(self) -> bool:
        """Whether the connection ends once the output is written (or has ended)."""
        return self._state in (SessionState.CLOSING, SessionState.CLOSED)

    def take_output(self) -> SessionOutput:
        """Everything the session wants done since the last call; see `SessionOutput`."""
        output = SessionOutput(self._data, self._records)
        self._data, self._records = [], []
        if self._auto_delivered:
            taken = self._auto_taken
            for handle, count in self._auto_delivered.items():
                taken[handle] = taken.get(handle, 0) + count
            self._auto_delivered = {}
        return output

    def data_sent(self) -> None:
        """Every byte taken so far is being handed to the socket: its auto-ack deliveries
        leave their windows (Credit records, in the next output). Once handed over they may
        reach the client, so they must never come back (at most once)."""
        if not self._auto_taken:
            return
        by_pipeline: dict[int, list[tuple[int, int]]] = {}
        for handle, count in self._auto_taken.items():
            sub = self._subs.get(handle)
            if sub is not None:
                by_pipeline.setdefault(sub.pipeline, []).append((handle, count))
        self._auto_taken = {}
        self._records += [(p, Credit(self.conn, subs)) for p, subs in by_pipeline.items()]

    # -- events from the client side -----------------------------------------------------

    def frame_received(self, frame: Frame, now_ms: int) -> None:
        """Handle one client frame; a client mistake becomes an ERROR and CLOSING."""
        if self._state not in READING:
            raise SessionStateError(self._state, f"frame {frame.command}")
        # A transaction of ours discarded (for another connection's SEND, or timed out)
        # is said before anything else is handled: a COMMIT must not deliver it.
        if self._transactions and self._apply_discard(now_ms, frame.headers.get("receipt", "")):
            return
        try:
            self._dispatch(frame, now_ms)
        except AccessDenied as exc:
            self._deny(frame, exc)
        except Refusal as exc:
            # The ERROR answers the frame's receipt, so a client waiting on it wakes up.
            self._fail(exc.message, exc.detail, frame.headers.get("receipt", ""))

    def refuses_send(self, frame: Frame) -> bool:
        """Whether `frame` is a SEND to be refused whatever flow control says: one whose
        user may not write its destination, or that names a header or a destination the
        broker does not support (docs/headers.md). Then its ERROR is said now. The shell
        asks before flow control may hold the SEND, so that waiting (and the refusal after
        it) never tells a user about a destination it may not write, and a refused header
        is named at once rather than after a wait."""
        if frame.command != "SEND" or self._state is not SessionState.CONNECTED:
            return False
        try:
            self._check_send(frame)
        except AccessDenied as exc:
            self._deny(frame, exc)
            return True
        except Refusal as exc:
            self._fail(exc.message, exc.detail, frame.headers.get("receipt", ""))
            return True
        self._checked = frame
        return False

    def _check_send(self, frame: Frame) -> None:
        """What refuses a SEND before anything else: a header or destination the broker does
        not support, or a destination its user may not write."""
        destination = self._required(frame, "destination")
        for key in frame.headers:
            attention = _ATTENTION.get(key)
            if attention is None:
                attention = _needs_attention(key)
            if attention:
                self._send_header(frame, key)
        self._permit("write", destination)
        self._owner(destination)

    def _send_header(self, frame: Frame, key: str) -> None:
        """One SEND header the table names (or of a vendor family): checked for the values
        the broker honours, refused, or noted as dropped."""
        value = frame.headers[key]
        if key == "persistent":
            _boolean_value(key, value)  # (the table's boolean rule, first: the common one)
        elif key == "reply-to":
            # A reply-to naming a temporary destination could never be answered.
            if value.startswith(TEMPORARY_PREFIXES):
                raise UnsupportedHeader("SEND", key, "temporary destinations are not supported yet")
        elif key == "user-id":
            # (Without a users file `user` stays empty: the CONNECT's login is who it is.)
            if value != (self.user or self._login):
                raise SessionError(
                    "header user-id must be the connection's login",
                    "The message was not sent: leave user-id out, or set it to the login "
                    "the connection was made with.",
                )
        elif key == "destination-type":
            self._routing_type(frame, key)
        else:
            rule = rule_for("SEND", key)
            if rule is None:
                return
            if rule.boolean:
                _boolean_value(key, value)
            if rule.treatment not in ("carried", "honoured"):
                self._judge("SEND", key, value, rule)

    def _judge(self, command: str, key: str, value: str, rule: HeaderRule) -> None:
        """A header the table refuses, drops or ignores: UnsupportedHeader, or a notice."""
        if rule.treatment == "refused":
            if rule.boolean and rule.default is not None:
                # A value that is no boolean at all is refused as such.
                accepted = str(_boolean_value(key, value)).lower() == rule.default
            else:
                accepted = value.strip().lower() == rule.default
            if not accepted:
                raise UnsupportedHeader(command, key, rule.note)
            return
        if rule.treatment == "dropped":
            self._note(key, f"header {key} dropped from a SEND: {rule.note}")
        elif rule.treatment == "ignored":
            self._note(key, f"header {key} on {command} ignored: {rule.note}")

    def _check_headers(self, frame: Frame) -> None:
        """The headers of a frame other than SEND, against the table: a refused one raises
        UnsupportedHeader; an ignored one, or one no rule names, is noted once."""
        command = frame.command
        honoured = _HONOURED.get(command)
        for key, value in frame.headers.items():
            if honoured is not None and key in honoured:
                continue
            rule = rule_for(command, key)
            if rule is None:
                self._note(key, f"header {key} on {command} ignored: mpbroker does not read it")
            elif rule.treatment != "honoured":
                self._judge(command, key, value, rule)

    def _note(self, key: str, line: str) -> None:
        """Have the shell log `line`, the first time this connection sends `key`."""
        if key in self._noted or len(self._noted) >= _NOTED_AT_MOST:
            return
        self._noted.add(key)
        self.notices.append(line)

    def _routing_type(self, frame: Frame, key: str) -> None:
        """Artemis' `destination-type` (SEND) or `subscription-type` (SUBSCRIBE): honoured
        when it names the kind the destination already is."""
        value = frame.headers[key]
        destination = frame.headers.get("destination", "")
        kind = "topic" if destination.startswith(TOPIC_PREFIX) else "queue"
        if _ROUTING_TYPES.get(value.strip().upper()) != kind:
            expected = "MULTICAST" if kind == "topic" else "ANYCAST"
            raise UnsupportedHeader(
                frame.command,
                key,
                f"a {kind} is {expected} (the /queue/ or /topic/ prefix says which); "
                f"{value[:40]!r} is not supported",
            )

    def _deny(self, frame: Frame, refusal: AccessDenied) -> None:
        """The ERROR of a frame its user may not send, kept in `denial` for the shell's log."""
        self.denial = refusal.message
        self._fail(refusal.message, refusal.detail, frame.headers.get("receipt", ""))

    def frame_error(self, error: ProtocolError) -> None:
        """The client's bytes are not a valid frame (the parser said why)."""
        self._fail(str(error))

    def refuse(self, frame: Frame, refusal: Refusal) -> None:
        """The shell will not take `frame` (flow control held a SEND past its send timeout):
        an ERROR answering its receipt."""
        self._fail(refusal.message, refusal.detail, frame.headers.get("receipt", ""))

    def timed_out(self, grace: float, *, frame_started: bool = False) -> str:
        """Nothing came in time: no CONNECT within `stomp.connect_timeout_ms`, a frame that
        started and did not complete within `stomp.frame_timeout_ms` (`frame_started`), or no
        frame or heart-beat for `grace` x the negotiated interval. An ERROR; returns why."""
        if frame_started:
            reason = (
                f"frame not complete within frame_timeout_ms {self.config.stomp.frame_timeout_ms}"
            )
        elif self._state is SessionState.AWAITING_CONNECT:
            reason = f"no CONNECT within connect_timeout_ms {self.config.stomp.connect_timeout_ms}"
        else:
            expected = self._heartbeat[1]
            reason = (
                f"no heart-beat or frame for {expected * grace:.0f} ms "
                f"(negotiated heart-beat {expected} ms)"
            )
        self._fail(reason)
        return reason

    def check_transactions(self, now_ms: int) -> str:
        """The shell's turn for transaction limits (`TransactionBudget.take_to_tell` named
        this connection, or the clock moved): transactions open past
        `transactions.timeout_ms` at `now_ms` are discarded, and if any of this connection's
        were discarded (maybe for another connection's SEND), an ERROR naming the
        transaction, the limit and the strategy goes out and the connection closes.
        Returns that ERROR's message the first time it is asked after the discard ("" else),
        for the shell's log."""
        if self._transactions:
            self._apply_discard(now_ms)
        reason, self._discard_reason = self._discard_reason, ""
        return reason

    def broker_stopping(self) -> None:
        """The broker shuts down: the client is told with an ERROR."""
        self._fail("broker is shutting down")

    def closing(self, refusal: Refusal) -> None:
        """The shell closes the connection for a reason of its own, no frame's (closed to
        make room before its CONNECT): an ERROR saying why."""
        self._fail(refusal.message, refusal.detail)

    def closed(self) -> None:
        """The socket is closed (the client went away, or we closed it after CLOSING).

        Nothing not yet taken is written (and its auto-ack deliveries are not credited, so
        their pipelines put them back); open transactions are dropped; the pipelines the
        connection talked to hear of its end (`ConnClosed`), last. Idempotent.
        """
        if self._state is SessionState.CLOSED:
            return
        self._state = transition(self._state, Event.CLOSED)
        self._data.clear()
        self._auto_delivered.clear()
        self._auto_taken.clear()
        self._pending_receipts.clear()
        # Nothing of the connection is registered again (a pipeline restarting later).
        self._subs.clear()
        self._subs_by_id.clear()
        self._abort_all()
        self._records += [(p, ConnClosed(self.conn)) for p in sorted(self._touched)]

    def _dispatch(self, frame: Frame, now_ms: int) -> None:
        command = frame.command
        if self._state is SessionState.AWAITING_CONNECT:
            if command not in ("CONNECT", "STOMP"):
                raise SessionError(f"expected CONNECT, got {command}")
            self._check_headers(frame)
            self._connect(frame)
            return
        if command != "SEND":
            self._check_headers(frame)
        # A chain of tests, not a table of methods: mypyc compiles this module, and calls
        # methods of its compiled classes directly (docs/benchmarks.md).
        if command == "SEND":
            self._send(frame, now_ms)
        elif command == "ACK":
            self._ack(frame, now_ms)
        elif command == "SUBSCRIBE":
            self._subscribe(frame, now_ms)
        elif command == "UNSUBSCRIBE":
            self._unsubscribe(frame, now_ms)
        elif command == "NACK":
            self._nack(frame, now_ms)
        elif command == "BEGIN":
            self._begin(frame, now_ms)
        elif command == "COMMIT":
            self._commit(frame, now_ms)
        elif command == "ABORT":
            self._abort(frame, now_ms)
        elif command == "DISCONNECT":
            self._disconnect(frame, now_ms)
        else:
            raise SessionError(f"{command} is not valid after CONNECT")

    def _connect(self, frame: Frame) -> None:
        version = negotiate_version(frame.headers.get("accept-version"))
        if version is None:
            # The spec asks for the versions we do speak in a `version` header.
            self._fail(
                "unsupported protocol version",
                f"accept-version {frame.headers.get('accept-version')!r}; "
                "this broker speaks 1.0, 1.1 and 1.2",
                headers={"version": ",".join(SUPPORTED_VERSIONS)},
            )
            return
        self._version = version
        try:
            client_hb = parse_heartbeat(frame.headers.get("heart-beat"))
        except ProtocolError as exc:
            raise SessionError(str(exc)) from None
        settings = self.config.stomp
        server_hb = (settings.heartbeat_send_ms, settings.heartbeat_receive_ms)
        # STOMP 1.0 has no heart-beating: whatever such a client sends is not negotiated.
        self._heartbeat = negotiate_heartbeat(client_hb, server_hb) if version != "1.0" else (0, 0)
        self._client_id = frame.headers.get("client-id", "")
        self._login = frame.headers.get("login", "")
        headers = {"version": version, "server": BROKER_NAME, "session": f"session-{self.conn}"}
        request_id = frame.headers.get("request-id")
        if request_id is not None:
            headers["response-id"] = request_id  # as ActiveMQ answers it
        # Always there, "0,0" for a 1.0 client (which cannot heart-beat): some 1.0 clients
        # (RabbitMQ's tests among them) read it from every CONNECTED.
        headers["heart-beat"] = f"{server_hb[0]},{server_hb[1]}" if version != "1.0" else "0,0"
        self._data.append(encode_frame(Frame("CONNECTED", headers), version))
        self.frames_out += 1
        self._state = transition(self._state, Event.CONNECT)

    def _send(self, frame: Frame, now_ms: int) -> None:
        headers = frame.headers
        if frame is not self._checked:
            self._check_send(frame)  # (a SEND in a transaction, which flow control skips)
        self._checked = None
        destination = headers["destination"]
        # Again: a reload may have changed the permissions while flow control held it.
        self._permit("write", destination)
        limit = self._max_message_bytes
        if 0 <= limit < len(frame.body):
            raise MessageTooLarge(len(frame.body), limit)
        pipeline = self._owner(destination)
        user_headers = {k: v for k, v in headers.items() if k not in _SEND_CONTROL_HEADERS}
        # JMS priority 0-9 (default 4); `expires` is absolute epoch ms as in ActiveMQ's
        # STOMP, `ttl` a time to live in ms from now; 0 means never.
        priority = self._int_header(frame, "priority", 4, minimum=0, maximum=9)
        expires = self._int_header(frame, "expires", 0, minimum=0)
        if not expires:
            ttl = self._int_header(frame, "ttl", 0, minimum=0)
            if not ttl:
                # RabbitMQ's per-message TTL, in ms.
                ttl = self._int_header(frame, "expiration", 0, minimum=0)
            expires = now_ms + ttl if ttl else 0
        body = frame.body
        encoding = ""
        if 0 <= self._compress_over < len(body):
            # From here on the message is its compressed self (original kept when that
            # is not smaller): transactions, rings, stores and limits count stored bytes.
            body, encoding = compress(body, self.config.compression.codec)
        message = Message(
            next(self.message_ids),
            destination,
            user_headers,
            body,
            now_ms,
            persistent=boolean(headers.get("persistent", "")) is True,
            priority=priority,
            expires_ms=expires,
            encoding=encoding,
        )
        tx = self._transaction_of(frame)
        if tx is None:
            receipt = headers.get("receipt", "")
            self._route(pipeline, Send(self.conn, message, receipt), receipt)
            return
        # Refused (LimitReached) or counted, maybe after discarding other connections'
        # transactions to make room (they hear of it through the budget).
        self.tx_budget.hold(self.conn, tx.name, message_size(message))
        # Answered now (the frame is accepted into the transaction), so the record that
        # goes to the pipeline at COMMIT carries no receipt of its own.
        tx.routes.append((pipeline, Send(self.conn, message)))
        self._immediate_receipt(frame)

    def _subscribe(self, frame: Frame, now_ms: int) -> None:
        headers = frame.headers
        destination = self._required(frame, "destination")
        receipt = headers.get("receipt", "")
        sub_id = headers.get("id")
        if sub_id is None:
            if self._version == "1.2":
                raise SessionError("SUBSCRIBE needs an id header")
            sub_id = destination  # 1.0/1.1 allowed omitting it; the destination stands in.
        if sub_id in self._subs_by_id:
            raise SessionError(f"subscription id {sub_id!r} is already in use")
        pipeline = self._owner(destination)
        kind, path = parse_destination(destination)
        if kind == "topic" and "#" in path.split("."):
            # RabbitMQ's wildcard for any number of words: taken literally, it would
            # subscribe to a topic nobody publishes to.
            raise UnsupportedHeader(
                "SUBSCRIBE", "destination", "wildcard destinations (#) are not supported yet"
            )
        if "subscription-type" in headers:
            self._routing_type(frame, "subscription-type")
        self._permit("read", destination)
        ack_name = headers.get("ack", "auto")
        if ack_name not in ACK_MODES:
            raise SessionError(
                f"unknown ack mode {ack_name!r}",
                "allowed: auto, client, client-individual",
            )
        default = self.config.queues.prefetch if kind == "queue" else self.config.topics.prefetch
        # RabbitMQ's name for ActiveMQ's header; ActiveMQ's wins when both are there.
        name = (
            "prefetch-count" if "activemq.prefetchSize" not in headers else "activemq.prefetchSize"
        )
        prefetch = self._int_header(frame, name, default, minimum=1)
        prefix = (
            _MESSAGE_LINE
            + b"subscription:%s\n" % escape_header_value(sub_id, self._version).encode()
        )
        durable = self._durable_name(frame, kind, sub_id)
        for flag in ("auto-delete", "exclusive"):
            # RabbitMQ's flags of a subscription's queue: a plain topic subscription is
            # both, a durable one or a queue's neither; asking otherwise is refused.
            asked = _flag(headers, flag, kind == "topic" and not durable)
            if asked != (kind == "topic" and not durable):
                raise UnsupportedHeader(
                    "SUBSCRIBE",
                    flag,
                    f"{flag}:{str(asked).lower()} asks for a subscription queue mpbroker does "
                    "not make (a topic subscription is auto-delete and exclusive unless durable)",
                )
        if durable:
            # Creating, taking over or replacing a durable subscription: RabbitMQ's
            # `configure` on the queue that holds it.
            self._permit("admin", destination)
        selector = self._selector(frame)
        sub = _Subscription(
            next(self._handles),
            sub_id,
            destination,
            pipeline,
            ACK_MODES[ack_name],
            prefetch,
            prefix,
            durable,
            selector,
        )
        self._subs_by_id[sub_id] = sub
        self._subs[sub.handle] = sub
        self._route(
            pipeline,
            Subscribe(
                self.conn,
                sub.handle,
                sub_id,
                destination,
                sub.ack_mode,
                prefetch,
                receipt,
                durable,
                selector,
                self.user if durable else "",
            ),
            receipt,
        )

    def _selector(self, frame: Frame) -> str:
        """The SUBSCRIBE's JMS message selector, checked here so a bad one is refused
        before anything is subscribed ("" when absent or blank: everything is selected,
        as in ActiveMQ). The pipeline compiles it again for itself."""
        text = frame.headers.get("selector", "")
        if not text.strip():
            return ""
        limit = self.config.selectors.max_length
        if len(text) > limit:
            raise SessionError(
                f"selector too long: {len(text)} characters, selectors.max_length is {limit}",
                "Nothing was subscribed.",
            )
        try:
            compile_selector(text)
        except SelectorError as exc:
            raise SessionError(str(exc), "Nothing was subscribed.") from None
        return text

    def _durable_name(self, frame: Frame, kind: str, sub_id: str) -> str:
        """The durable subscription a SUBSCRIBE asks for, as "<client-id>/<name>", or "".

        ActiveMQ's `activemq.subscriptionName` and Artemis' `durable-subscription-name` (or
        its older `durable-subscriber-name`) need the connection's `client-id`; RabbitMQ's
        `durable:true` (or `persistent:true`) names it by the `id`.
        """
        headers = frame.headers
        flagged = _durable_flag(headers)  # (a value that is no boolean is refused either way)
        name = None
        for header in _DURABLE_NAMES:  # (as an `or` chain: the first one set, else the last)
            name = headers.get(header)
            if name:
                break
        if name is None and flagged:
            name = sub_id
        if name is None:
            return ""
        if not self._client_id:
            # Without one it could never be named again (nor told from another client's).
            raise SessionError(
                f"durable subscription {name!r} needs a client-id header in CONNECT",
                "Nothing was subscribed.",
            )
        if kind != "topic":
            raise SessionError("only topic subscriptions can be durable")
        return f"{self._client_id}/{name}"

    def _unsubscribe(self, frame: Frame, now_ms: int) -> None:
        receipt = frame.headers.get("receipt", "")
        sub_id = frame.headers.get("id") or frame.headers.get("destination")
        if sub_id is None:
            raise SessionError("UNSUBSCRIBE needs an id header")
        sub = self._subs_by_id.get(sub_id)
        if sub is None:
            raise SessionError(f"no subscription with id {sub_id!r}")
        headers = frame.headers
        client_id = headers.get("client-id")
        if client_id is not None and client_id != self._client_id:
            # Artemis names the durable subscription to remove by it: another one's cannot be.
            raise UnsupportedHeader(
                "UNSUBSCRIBE", "client-id", "it must be this connection's client-id"
            )
        flagged = _durable_flag(headers)  # (a value that is no boolean is refused either way)
        remove = bool(sub.durable) and (flagged or any(h in headers for h in _DURABLE_NAMES))
        if remove:
            self._permit("admin", sub.destination)
        del self._subs_by_id[sub_id]
        del self._subs[sub.handle]
        # MESSAGE frames of this subscription already made will be written: credit them
        # first, or the pipeline would requeue them on Unsubscribe and deliver them twice.
        written = self._auto_delivered.pop(sub.handle, 0) + self._auto_taken.pop(sub.handle, 0)
        if written:
            self._route(sub.pipeline, Credit(self.conn, [(sub.handle, written)]))
        self._route(sub.pipeline, Unsubscribe(self.conn, sub.handle, receipt, remove), receipt)

    def _ack(self, frame: Frame, now_ms: int) -> None:
        self._settle(frame, nack=False)

    def _nack(self, frame: Frame, now_ms: int) -> None:
        self._settle(frame, nack=True)

    def _settle(self, frame: Frame, *, nack: bool) -> None:
        headers = frame.headers
        receipt = headers.get("receipt", "")
        if self._version == "1.2":
            ack_id = self._required(frame, "id")
            handle_text, _, message_id = ack_id.partition("/")
            valid = handle_text.isascii() and handle_text.isdigit() and len(handle_text) < 19
            sub = self._subs.get(int(handle_text)) if valid else None
            if sub is None or not message_id:
                raise SessionError(
                    f"{frame.command} id {ack_id!r} matches no message delivered to this "
                    "connection's subscriptions",
                )
        else:
            message_id = self._required(frame, "message-id")
            sub_id = headers.get("subscription")
            if sub_id is not None:
                found = self._subs_by_id.get(sub_id)
            elif len(self._subs) == 1:
                found = next(iter(self._subs.values()))
            else:
                raise SessionError(
                    f"{frame.command} needs a subscription header "
                    f"(this connection has {len(self._subs)} subscriptions)",
                )
            if found is None:
                raise SessionError(f"no subscription with id {sub_id!r}")
            sub = found
        tx = self._transaction_of(frame)
        record: Ack | Nack
        if nack:
            requeue = self._requeue_header(frame)
            record = Nack(self.conn, sub.handle, message_id, "" if tx else receipt, requeue)
        else:
            record = Ack(self.conn, sub.handle, message_id, "" if tx else receipt)
        if tx is None:
            self._route(sub.pipeline, record, receipt)
        else:
            tx.routes.append((sub.pipeline, record))
            self._immediate_receipt(frame)

    def _permit(self, permission: str, destination: str) -> None:
        """`AccessDenied` unless the user may `permission` the `destination`; answers are
        remembered while the access control is the same one."""
        access = self.access
        if access.open:
            return
        if self._permits_of is not access or len(self._permits) >= _PERMITS_REMEMBERED:
            self._permits = {}
            self._permits_of = access
        key = (permission, destination)
        allowed = self._permits.get(key)
        if allowed is None:
            user = self.user or ANONYMOUS
            allowed = self._permits[key] = access.allows(user, self.groups, permission, destination)
        if not allowed:
            raise AccessDenied(self.user or ANONYMOUS, permission, destination)

    def _requeue_header(self, frame: Frame) -> bool:
        """A NACK's `requeue` header (RabbitMQ's): `false` dead-letters the message at once
        instead of putting it back; absent or `true` puts it back (in any case: stomp.py
        writes a Python `False` as `False`)."""
        return _flag(frame.headers, "requeue", True)

    def _begin(self, frame: Frame, now_ms: int) -> None:
        name = self._required(frame, "transaction")
        if name in self._transactions:
            raise SessionError(f"transaction {name!r} is already open")
        limit = self.config.transactions.max_open_per_connection
        if len(self._transactions) >= limit:
            raise LimitReached("transactions", "max_open_per_connection", limit)
        self._transactions[name] = _Transaction(name)
        self.tx_budget.begin(self.conn, name, now_ms)
        self._immediate_receipt(frame)

    def _commit(self, frame: Frame, now_ms: int) -> None:
        tx = self._pop_transaction(frame)
        pipelines: set[int] = set()
        for pipeline, record in tx.routes:
            self._route(pipeline, record)
            pipelines.add(pipeline)
        receipt = frame.headers.get("receipt", "")
        if receipt:
            self._receipt_after(pipelines, receipt, then_close=False)

    def _abort(self, frame: Frame, now_ms: int) -> None:
        self._pop_transaction(frame)
        self._immediate_receipt(frame)

    def _disconnect(self, frame: Frame, now_ms: int) -> None:
        receipt = frame.headers.get("receipt", "")
        self._abort_all()
        if receipt and self._in_doubt:
            # A pipeline this connection sent to restarted since: it cannot be promised.
            self._in_doubt_error(receipt, "after this connection sent to it")
        elif receipt:
            # The receipt promises every earlier frame was handled: ask each pipeline
            # this connection talked to, and close once all have answered.
            self._state = transition(self._state, Event.DISCONNECT_RECEIPTED)
            self._receipt_after(set(self._touched), receipt, then_close=True)
        else:
            self._state = transition(self._state, Event.DISCONNECT)

    # -- records from pipelines ----------------------------------------------------------

    def deliver(
        self, sub_handle: int, message: Message, shared: dict[str, bytes] | None = None
    ) -> bool:
        """Append a MESSAGE frame for one delivery; False if the subscription is gone.

        Everything but the `subscription` and `ack` lines is the same for every subscriber
        of a topic: it is encoded once per protocol version into `shared` (one dict per
        delivered message) and reused, so a fan-out does not re-encode (or decompress) the
        body each time.

        A compressed body that does not decompress (a damaged store) is logged once per
        protocol version in `shared` (once per fan-out unless its subscribers speak several
        versions) and answered with an ERROR that closes this connection (True is returned:
        the ERROR is to be written). The delivery is not counted as written, so the message
        goes back like any unacknowledged one (a queue's or durable subscription's comes
        back redelivered; a queue dead-letters it after `queues.max_redeliveries`).
        """
        sub = self._subs.get(sub_handle)
        if sub is None or self._state not in WRITING:
            return False
        if shared is None:
            shared = {}
        version = self._version
        tail = shared.get(version)
        if tail is None:
            try:
                tail = _message_tail(message, version)
            except CorruptBody as exc:
                log.error(
                    "message %s to %s cannot be delivered: %s",
                    message.message_id,
                    message.destination,
                    exc,
                )
                # An empty tail marks the failure for the rest of the fan-out (a real
                # one always holds headers).
                tail = b""
            shared[version] = tail
        if not tail:
            self._fail(
                f"message {message.message_id} cannot be delivered: its stored body is damaged",
                f"The {message.encoding} body of message {message.message_id} from "
                f"{message.destination} does not decompress; it was not delivered.",
            )
            return True
        out = self._data
        self.frames_out += 1
        if self.whole_frames:
            out.append(self._whole_message(sub, sub_handle, message, tail))
            return True
        out.append(sub.message_prefix)
        if sub.ack_mode == ACK_AUTO:
            self._auto_delivered[sub_handle] = self._auto_delivered.get(sub_handle, 0) + 1
        else:
            # "<handle>/<message-id>": the handle routes the ACK to the right pipeline
            # without keeping per-message state in the gateway. Our ids need no escaping.
            out.append(f"ack:{sub_handle}/{message.message_id}\n".encode())
        out.append(tail)
        return True

    def _whole_message(
        self, sub: _Subscription, sub_handle: int, message: Message, tail: bytes
    ) -> bytes:
        """`deliver`'s MESSAGE frame in one piece (`whole_frames`)."""
        if sub.ack_mode == ACK_AUTO:
            self._auto_delivered[sub_handle] = self._auto_delivered.get(sub_handle, 0) + 1
            return sub.message_prefix + tail
        ack = f"ack:{sub_handle}/{message.message_id}\n".encode()
        return b"".join((sub.message_prefix, ack, tail))

    def receipt(self, receipt: str, pipeline: int) -> None:
        """`pipeline` answered a frame's receipt."""
        self._paid(receipt, pipeline)
        self._write_receipt(receipt)

    def _write_receipt(self, receipt: str) -> None:
        if self._state in WRITING:
            self._data.append(
                encode_frame(Frame("RECEIPT", {"receipt-id": receipt}), self._version)
            )
            self.frames_out += 1

    def refused(self, record: Refuse, pipeline: int) -> None:
        """`pipeline` refused a frame: an ERROR answering its receipt."""
        if record.receipt:
            self._paid(record.receipt, pipeline)
        self._fail(record.message, record.detail, record.receipt)

    def barrier_done(self, token: int, pipeline: int) -> str:
        """A pipeline handled every frame before a Barrier: a receipt that waits for
        several, or a restarted pipeline's probe. Returns the ERROR's message when the probe
        finds receipts in doubt ("" else), for the shell's log."""
        pending = self._pending_receipts.get(token)
        if pending is None:
            return ""
        pending.waiting.discard(pipeline)
        if pending.waiting:
            return ""
        del self._pending_receipts[token]
        if pending.suspects is None:
            self._receipt_done(pending)
            return ""
        # Everything the new incarnation found in its ring came before the probe and is
        # answered: what is still owed was taken by the one that died.
        lost = sorted(r for r, p in pending.suspects if (r, p) in self._owed)
        if not lost or self._state not in WRITING:
            return ""
        return self._in_doubt_error(lost[0])

    def pipeline_restarted(self, pipeline: int, *, replaced: bool = True) -> str:
        """A pipeline (re)started: register again every subscription it owns.

        If it `replaced` a dead incarnation, what that one had taken from its ring and
        not finished (persistent SENDs waiting for their group commit, say) is gone. The
        frames still in the ring are the new incarnation's, so a receipt of a frame's own
        (a SEND's, an ACK's) is judged by a probe: a Barrier after them, and what is still
        owed when it is answered was lost (`barrier_done`). A COMMIT's or DISCONNECT's
        receipt waiting on the pipeline cannot be judged so (the frames it covers may have
        been taken by the dead one even when its Barrier was not): it is in doubt at once.
        In doubt, the connection gets an ERROR answering the receipt and closes, as
        ActiveMQ's and Artemis' clients report a commit "in doubt" after a failover, never a
        RECEIPT for frames that may have been lost. A later DISCONNECT receipt cannot
        promise that every earlier frame was handled either (`_disconnect`). Returns the
        ERROR's message ("" if none), for the shell's log.
        """
        if self._state not in WRITING:
            return ""
        if replaced:
            waiting = [
                w.receipt
                for w in self._pending_receipts.values()
                if pipeline in w.waiting and w.suspects is None
            ]
            if waiting:
                return self._in_doubt_error(waiting[0])
            suspects = frozenset(key for key in self._owed if key[1] == pipeline)
            if suspects:
                token = next(self._tokens)
                self._pending_receipts[token] = _PendingReceipt("", {pipeline}, False, suspects)
                self._records.append((pipeline, Barrier(self.conn, token)))
            if pipeline in self._touched:
                self._in_doubt.add(pipeline)
        for sub in self._subs.values():
            if sub.pipeline == pipeline:
                record = Subscribe(
                    self.conn,
                    sub.handle,
                    sub.sub_id,
                    sub.destination,
                    sub.ack_mode,
                    sub.prefetch,
                    durable=sub.durable,
                    selector=sub.selector,
                    # Its owner is asked again: the new incarnation checks it anew.
                    user=self.user if sub.durable else "",
                )
                self._records.append((pipeline, record))
        return ""

    # -- helpers -------------------------------------------------------------------------

    def _fail(
        self,
        message: str,
        detail: str = "",
        receipt: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        """Send an ERROR frame and close after it is written (the first ERROR stands: once
        the connection is ending, nothing more is said)."""
        if self.is_ending():
            return
        headers = {"message": message, **(headers or {})}
        if receipt:
            headers["receipt-id"] = receipt
        body = (detail + "\n").encode() if detail else b""
        if body:
            headers["content-type"] = "text/plain"
        self._data.append(encode_frame(Frame("ERROR", headers, body), self._version))
        self.frames_out += 1
        self._state = transition(self._state, Event.ERROR)

    def _in_doubt_error(self, receipt: str, when: str = "before answering it") -> str:
        """The ERROR answering a receipt in doubt (`ReceiptInDoubt`); returns its message."""
        error = ReceiptInDoubt(receipt, when)
        self._fail(error.message, error.detail, receipt)
        return error.message

    def _route(self, pipeline: int, record: Record, receipt: str = "") -> None:
        """Send `record` to `pipeline`; `receipt` is the one it carries, which that
        pipeline then owes."""
        self._touched.add(pipeline)
        self._records.append((pipeline, record))
        if receipt:
            key = (receipt, pipeline)
            self._owed[key] = self._owed.get(key, 0) + 1

    def _paid(self, receipt: str, pipeline: int) -> None:
        """`pipeline` answered a receipt it owed (with a RECEIPT or an ERROR)."""
        key = (receipt, pipeline)
        count = self._owed.get(key)
        if count is None:
            return
        if count > 1:
            self._owed[key] = count - 1
        else:
            del self._owed[key]

    def _receipt_after(self, pipelines: set[int], receipt: str, *, then_close: bool) -> None:
        pending = _PendingReceipt(receipt, set(pipelines), then_close)
        if not pipelines:
            self._receipt_done(pending)
            return
        token = next(self._tokens)
        self._pending_receipts[token] = pending
        for pipeline in sorted(pipelines):
            self._records.append((pipeline, Barrier(self.conn, token)))

    def _receipt_done(self, pending: _PendingReceipt) -> None:
        self._write_receipt(pending.receipt)
        if pending.then_close and self._state is SessionState.DISCONNECTING:
            self._state = transition(self._state, Event.RECEIPTS_ANSWERED)

    def _immediate_receipt(self, frame: Frame) -> None:
        receipt = frame.headers.get("receipt")
        if receipt:
            self._write_receipt(receipt)

    def _required(self, frame: Frame, name: str) -> str:
        value = frame.headers.get(name)
        if not value:
            article = _ARTICLE.get(name, "a")
            raise SessionError(f"{frame.command} needs {article} {name} header")
        return value

    def _owner(self, destination: str) -> int:
        owner = self._owners.get(destination)
        if owner is not None:
            return owner
        try:
            # Checked once per destination, as the answer is then remembered.
            check_client_destination(destination)
            owner = self.topology.owner(destination)
        except UnknownDestination as exc:
            raise SessionError(str(exc)) from None
        if len(self._owners) >= _OWNERS_REMEMBERED:
            self._owners.clear()
        self._owners[destination] = owner
        return owner

    def _int_header(
        self, frame: Frame, name: str, default: int, *, minimum: int, maximum: int | None = None
    ) -> int:
        text = frame.headers.get(name)
        if text is None:
            return default
        # Plain ASCII digits only: int() would also take " 5", "1_0" and other digits.
        value = int(text) if text.isascii() and text.isdigit() and len(text) < 19 else -1
        if value < minimum or (maximum is not None and value > maximum):
            allowed = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
            raise SessionError(f"header {name}:{text!r} must be an integer {allowed}")
        return value

    def _transaction_of(self, frame: Frame) -> _Transaction | None:
        name = frame.headers.get("transaction")
        if name is None:
            return None
        tx = self._transactions.get(name)
        if tx is None:
            raise SessionError(f"no open transaction {name!r}")
        return tx

    def _pop_transaction(self, frame: Frame) -> _Transaction:
        name = self._required(frame, "transaction")
        tx = self._transactions.pop(name, None)
        if tx is None:
            raise SessionError(f"no open transaction {name!r}")
        self.tx_budget.end(self.conn, name)
        return tx

    def _abort_all(self) -> None:
        self._transactions.clear()
        self.tx_budget.end_connection(self.conn)

    def _apply_discard(self, now_ms: int, receipt: str = "") -> bool:
        """Say (ERROR, closing) that the budget discarded our open transactions, if it did
        (timeouts judged at `now_ms` first); True if so. Nothing of them is ever routed."""
        budget = self.tx_budget
        budget.expire(now_ms)
        discarded = budget.take_discarded(self.conn)
        if discarded is None:
            return False
        # The budget dropped every one of them (the ERROR closes the connection).
        self._transactions.clear()
        error = discarded.error
        self._discard_reason = error.message
        self._fail(error.message, error.detail, receipt)
        return True
