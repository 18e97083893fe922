"""Gateway worker: STOMP over TCP, TLS or WebSocket (trio) on one side, rings to the
pipelines on the other.

A thin shell: `FrameParser` turns bytes into frames, `GatewaySession` decides what they
mean, `Admission` decides whether a SEND may go now, and this module moves bytes between
sockets and rings and does the waiting. Every gateway listens on the
same ports with SO_REUSEPORT, so the kernel spreads connections over them. A WebSocket
connection (`_websocket`) is a stream of its own kind that takes frames one by one.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import errno
import fcntl
import itertools
import logging
import os
import signal
import socket
import struct
import termios
import time
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TypeAlias

import trio

from mpbroker import records
from mpbroker.admin import GatewayStats, HeldSend
from mpbroker.clock import epoch_ms
from mpbroker.config import Config, ConfigError
from mpbroker.errors import AuthenticationFailed, ConnectionRefused, Displaced
from mpbroker.flow import FlowGate, Stop
from mpbroker.logs import client_text, log_collapsed, peer_address
from mpbroker.records import Hello, Record
from mpbroker.security import (
    CHECKS_AT_ONCE,
    AccessControl,
    Authenticator,
    TlsHandshakes,
    UsersFileError,
    load_users,
    server_context,
)
from mpbroker.session import (
    Admission,
    GatewaySession,
    Pace,
    Pacer,
    SessionState,
    TransactionBudget,
    flow_controlled,
)
from mpbroker.shm import (
    STATE_STOPPING,
    AddressCounts,
    Doorbell,
    Ring,
    RingReader,
    RingWriter,
    park_async,
)
from mpbroker.stomp import (
    CLIENT_COMMANDS,
    HEARTBEAT_BYTES,
    Frame,
    FrameLimits,
    FrameParser,
    FrameTooLarge,
    ProtocolError,
    encode_frame,
)

from ._base import StopOnSignal, WorkerBase
from ._counters import GATEWAY_CONNECTED, GATEWAY_CONNECTIONS, GATEWAY_FRAMES_IN
from ._gateway_loops import (
    RUN_DENIED,
    RUN_REFUSED,
    RUN_SHELL,
    Frames,
    deliver_run,
    post_run,
    receive_run,
)
from ._layout import WorkerSpec
from ._websocket import (
    CLOSE_GOING_AWAY,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_PROTOCOL_ERROR,
    CLOSE_TOO_BIG,
    Transport,
    WebSocketHandshakes,
    WebSocketStream,
)

__all__ = ["run_gateway"]

log = logging.getLogger("mpbroker.gateway")


_LISTEN_BACKLOG = 1024
_CLOSE_TIMEOUT_S = 2.0
# How many of its oldest connections still connecting a gateway looks through for an idle
# one, when it must close one to make room (`Gateway._victim`).
_SILENT_SCAN = 64
# A connection that has sent nothing for this long since its accept is idle: a client
# sends its CONNECT, TLS ClientHello or HTTP request as soon as it is connected. Till then
# only a connection that has sent something may push it out (`Gateway._victim`), and a new
# one that has sent nothing waits this long for its first bytes before it is judged.
_FIRST_BYTES_S = 0.5
# `Gateway._admit_connection`'s kind for "wait for its first bytes, then ask again".
_SPEAK_FIRST = "speak first"
# What a connection reads and writes: its socket, TLS over it (stomp.tls_port), or a
# WebSocket over either (stomp.ws_port, stomp.wss_port).
_ClientStream: TypeAlias = Transport | WebSocketStream
_Listener: TypeAlias = trio.SocketListener | trio.SSLListener[trio.SocketStream]


class _Admitted(enum.Enum):
    """What flow control did with a SEND."""

    GO = "went at once"
    WAITED = "went after waiting (its timestamp is taken again)"
    REFUSED = "was refused (the ERROR is queued)"


_GO, _WAITED, _REFUSED = _Admitted.GO, _Admitted.WAITED, _Admitted.REFUSED


class _Port:
    """The writing end of one gateway->pipeline ring, shared by every task of the gateway.

    Records are staged at once while the ring has room. Once it is full they wait here, in
    order, and the port's own task (`run`) moves them into the ring as room appears: posting
    never waits, so no task ever holds up another while a pipeline is slow or restarting. A
    connection's reader waits for the backlog of the ports it posted to (`drained`) before
    it reads more from its socket, so a full ring still slows its producers down.
    """

    def __init__(self, writer: RingWriter) -> None:
        self.writer = writer
        self.dirty = False
        self.backlog: collections.deque[tuple[int, bytes]] = collections.deque()
        self._work = trio.Event()
        self._empty = trio.Event()
        self._empty.set()

    def post(self, kind: int, payload: bytes) -> bool:
        """Stage a record (or queue it behind others); True if it had to queue."""
        backlog = self.backlog
        if not backlog:
            if self.writer.stage(kind, payload):
                self.dirty = True
                return False
            # Full (a large payload may have staged some fragments: the same object
            # continues it). What is staged goes out now; the rest waits for the task.
            self.publish()
            self._empty = trio.Event()
            self._work.set()
        backlog.append((kind, payload))
        return True

    def publish(self) -> None:
        if self.dirty:
            self.writer.publish()
            self.dirty = False

    async def drained(self) -> None:
        """Until nothing waits in the backlog."""
        await self._empty.wait()

    async def run(self) -> None:
        """The port's task: move the backlog into the ring as room appears."""
        backlog = self.backlog
        while True:
            await self._work.wait()
            self._work = trio.Event()
            while backlog:
                kind, payload = backlog[0]
                if not self.writer.stage(kind, payload):
                    # `put` publishes what is staged first, then waits for room.
                    await self.writer.put(kind, payload)
                else:
                    self.dirty = True
                backlog.popleft()
            self.publish()
            self._empty.set()


class _Arrival:
    """A connection as its gateway counts it, from its accept on: still connecting (its TLS
    and WebSocket handshakes, then its CONNECT) while it is in `Gateway.arrivals`, which
    may close it to make room for a newer one; `connected` once its CONNECT went through."""

    __slots__ = (
        "address",
        "connected",
        "counted",
        "displaced",
        "heard",
        "peer",
        "scope",
        "since",
        "sock",
        "waited",
    )

    def __init__(self, peer: str, sock: trio.socket.SocketType) -> None:
        self.peer = peer
        self.address = peer_address(peer)
        self.sock = sock
        # In GATEWAY_CONNECTIONS and the address counts (until `Gateway._release`).
        self.counted = False
        # In GATEWAY_CONNECTED: its CONNECT went through.
        self.connected = False
        # What is cancelled to close it while it connects: its handshakes' scope, then its
        # reader's while that waits for the CONNECT.
        self.scope = trio.CancelScope()
        # Why it was closed to make room (None: it was not).
        self.displaced: Displaced | None = None
        # The gateway read something from it (a handshake counts).
        self.heard = False
        # When it was accepted (trio's clock).
        self.since = trio.current_time()
        # It had `_FIRST_BYTES_S` to send something before it was judged.
        self.waited = False

    def has_spoken(self) -> bool:
        """Whether the client has sent anything, as far as the gateway can tell: bytes it
        read, or bytes waiting in the socket (a client that went away has sent nothing)."""
        return self.heard or _waiting_bytes(self.sock) > 0


class _Connection:
    """One client's socket and session, and what the shell keeps for them: the bytes taken
    from the session and not yet written, the writer's wake-up, the producer's paces."""

    def __init__(
        self, session: GatewaySession, stream: _ClientStream, peer: str, arrival: _Arrival
    ) -> None:
        self.session = session
        self.stream = stream
        self.peer = peer
        self.wake = trio.Event()
        self.unsent: list[bytes | memoryview] = []
        self.pacer = Pacer()
        # How its gateway counts it, and may close it to make room until its CONNECT.
        self.arrival = arrival
        # A WebSocket sends each frame as a message: the session keeps them whole.
        self.websocket = stream if isinstance(stream, WebSocketStream) else None
        session.whole_frames = self.websocket is not None

    def close_with(self, code: int) -> None:
        """Why a WebSocket connection ends, for its close frame (the first reason
        other than a normal end stands)."""
        if self.websocket is not None and self.websocket.close_code == CLOSE_NORMAL:
            self.websocket.close_code = code

    def notify(self) -> None:
        self.wake.set()


class Gateway:
    """One gateway process: its listening socket's connections, its rings, its loop."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.config = spec.config
        # The supervisor read the users file at start (UsersFileError if it is broken since).
        self.authenticator = self._load_authenticator(spec.config)
        self.access = _access_control(spec.config)
        self._auth_limiter = trio.CapacityLimiter(CHECKS_AT_ONCE)
        layout = spec.layout
        self.layout = layout
        self.index = spec.index
        self.base = WorkerBase(spec, layout.gateway_bell(spec.index))
        self.control = self.base.control
        self.slot = self.base.slot
        # (The supervisor cleared this gateway's row and slot counters before starting it:
        # a predecessor's connections died with it.)
        self.addresses = AddressCounts.attach(layout.addresses)
        pipelines = layout.topology.pipelines
        self.pipeline_bells = [
            Doorbell.attach(layout.pipeline_bell(p), missing_ok=True) for p in range(pipelines)
        ]
        self.rings: list[Ring] = []
        self.ports: list[_Port] = []
        self.readers: list[RingReader] = []
        for p in range(pipelines):
            out_ring = Ring.attach(layout.to_pipeline(spec.index, p))
            in_ring = Ring.attach(layout.to_gateway(p, spec.index))
            self.rings += [out_ring, in_ring]
            self.ports.append(_Port(out_ring.writer(self.pipeline_bells[p])))
            self.readers.append(in_ring.reader())
        self.connections: dict[int, _Connection] = {}
        # This gateway's connections that have not completed CONNECT, oldest first (a dict
        # for its order): those it may close to make room for newer ones (`_admit_connection`).
        self.arrivals: dict[_Arrival, None] = {}
        # Connection ids stay unique across restarts of this gateway: incarnation in the
        # high bits, so a pipeline never confuses a new connection with a dead one's.
        self._conn_ids = itertools.count((spec.incarnation << records.CONN_INCARNATION_SHIFT) + 1)
        # No colons: STOMP 1.2 escapes them in header values, which would put every
        # MESSAGE frame on the encoder's slow path.
        prefix = f"ID-{layout.instance}-{spec.index}.{spec.incarnation}-"
        # (map over map: every id made in C, with no Python frame per message)
        self.message_ids: Iterator[str] = map(prefix.__add__, map(str, itertools.count(1)))
        self.tx_budget = TransactionBudget.from_settings(self.config.transactions)
        stomp = self.config.stomp
        self.limits = FrameLimits(
            max_frame_bytes=stomp.max_frame_bytes,
            max_headers=stomp.max_headers,
            max_header_bytes=stomp.max_header_bytes,
        )
        self.stopping = False
        # Totals since the gateway started, for the admin API and /metrics: connections
        # served, refused (by kind), and frames written by connections that have ended.
        self.accepted = 0
        self.refused: dict[str, int] = {}
        self.frames_out_closed = 0
        # Flow control: the stops our pipelines announced; waiting SENDs wake on a change.
        self.flow = FlowGate(layout.topology)
        self.flow_changed = trio.Event()
        # SENDs held by flow control now, for the admin API: conn -> (destination, stop, since).
        self.held_sends: dict[_Connection, tuple[str, Stop, float]] = {}
        self.admission = Admission(self.config, self.flow)
        # MemWatch's level as last seen: held SENDs wake when it changes.
        self.memory_level = 0

    # -- rings ---------------------------------------------------------------------------

    def route(self, routes: list[tuple[int, Record]]) -> set[_Port]:
        """Post records to their pipelines' rings, in order; the ports where some had to
        wait for room (await their `drained` to slow the sender down)."""
        ports = self.ports
        waiting: set[_Port] = set()
        # Staged in a compiled loop while the rings have room; the shell posts the rest.
        at, payload = post_run(routes, 0, ports)
        while at < len(routes):
            pipeline, record = routes[at]
            port = ports[pipeline]
            if port.post(record.kind, payload or records.encode_payload(record)):
                waiting.add(port)
            at, payload = post_run(routes, at + 1, ports)
        for port in ports:
            port.publish()
        return waiting

    def flush(self, conn: _Connection) -> set[_Port]:
        """Take what the connection's session wants done: its bytes go to the writer, its
        records to the pipelines (in the order the session made them: taking and posting
        are one step). The ports where records wait for room."""
        output = conn.session.take_output()
        if output.data:
            conn.unsent += output.data
            conn.notify()
        return self.route(output.records) if output.records else set()

    async def pump(self) -> None:
        """Take records from the pipelines and turn them into frames for connections."""
        batch_records = self.config.rings.batch_records
        park_timeout = self.config.rings.park_timeout_ms / 1000
        decode = records.decode
        while True:
            touched: set[_Connection] = set()
            restarted: list[_Connection] = []
            pending_routes: list[tuple[int, Record]] = []
            frames: Frames = {}
            got = False
            for source, reader in enumerate(self.readers):
                batch = reader.read_batch(batch_records)
                if not batch:
                    continue
                got = True
                end = len(batch)
                at = deliver_run(batch, 0, self.connections, frames, touched)
                while at < end:
                    # A record of another kind: in its place among the deliveries.
                    kind, payload = batch[at]
                    self._apply(decode(kind, payload), source, touched, restarted, pending_routes)
                    at = deliver_run(batch, at + 1, self.connections, frames, touched)
            for conn in touched:
                conn.notify()
            for conn in restarted:
                self.flush(conn)  # the subscriptions again, before Registered
            if pending_routes:
                self.route(pending_routes)
            # The heartbeat says the event loop turns, busy or idle (park times out).
            reloaded = self.base.turn()
            # So does the transaction timeout: idle connections' transactions expire too.
            self.check_transactions(epoch_ms())
            if self.control.memwatch_level != self.memory_level:
                self.memory_level = self.control.memwatch_level
                self._flow_changed()  # large SENDs held for memory may go now
            if reloaded is not None:
                # SIGHUP: send timeouts and rate-based flow as reloaded; held SENDs and
                # producers being paced go on with what they started with.
                self.config = reloaded
                self.admission.configure(reloaded)
                try:
                    # The users file is read again on SIGHUP (checked by the supervisor).
                    self.authenticator = self._load_authenticator(reloaded)
                except UsersFileError as exc:
                    log.error("SIGHUP: users not reloaded: %s", exc)
                # Every connection asks the new permissions from its next frame on.
                self.access = _access_control(reloaded)
                for conn in self.connections.values():
                    conn.session.access = self.access
                log.info("flow settings reloaded (users and [[security.acl]] entries too)")
            if got:
                await trio.lowlevel.checkpoint()
            else:
                await park_async(self.readers, self.base.doorbell, park_timeout)

    def _apply(
        self,
        record: Record,
        source: int,
        touched: set[_Connection],
        restarted: list[_Connection],
        pending_routes: list[tuple[int, Record]],
    ) -> None:
        """A record from pipeline `source` other than a Deliver (`deliver_run` has those)."""
        match record:
            case records.Receipt(conn=conn_id, receipt=receipt):
                conn = self.connections.get(conn_id)
                if conn is not None:
                    conn.session.receipt(receipt, source)
                    touched.add(conn)
            case records.Refuse(conn=conn_id):
                conn = self.connections.get(conn_id)
                if conn is not None:
                    # One per frame a client pipelined, naming its destination: collapsed.
                    log_collapsed(
                        log,
                        logging.WARNING,
                        "refused a frame",
                        conn.peer,
                        "refused a frame from %s: %s",
                        conn.peer,
                        client_text(record.message),
                    )
                    conn.session.refused(record, source)
                    touched.add(conn)
            case records.BarrierDone(conn=conn_id, token=token, pipeline=pipeline):
                conn = self.connections.get(conn_id)
                if conn is not None:
                    doubt = conn.session.barrier_done(token, pipeline)
                    if doubt:
                        log.warning("connection from %s: %s", conn.peer, doubt)
                    touched.add(conn)
            case records.PipelineHello(pipeline=pipeline, incarnation=incarnation):
                if incarnation > 0:
                    log.info("pipeline %d restarted: re-registering subscriptions", pipeline)
                for conn in self.connections.values():
                    doubt = conn.session.pipeline_restarted(pipeline, replaced=incarnation > 0)
                    if doubt:
                        log.warning("connection from %s: %s", conn.peer, doubt)
                    restarted.append(conn)
                pending_routes.append((pipeline, records.Registered(self.index, incarnation)))
                # Its predecessor's stops are moot; it announces the ones that still hold.
                self.flow.pipeline_restarted(pipeline)
                self._flow_changed()
            case records.FlowState():
                self.flow.apply(record)
                self._flow_changed()
            case _:
                log.error("unexpected record from a pipeline: %r", type(record).__name__)

    def check_transactions(self, now_ms: int) -> None:
        """Open transactions the budget discarded, for another connection's SEND
        (`transactions.reduce_strategy`) or for their age (`timeout_ms`): their sessions
        write the ERROR, which closes their connections."""
        budget = self.tx_budget
        budget.expire(now_ms)
        for conn_id in budget.take_to_tell():
            conn = self.connections.get(conn_id)
            if conn is None:
                continue  # gone already: closing it dropped its transactions
            reason = conn.session.check_transactions(now_ms)
            if reason:
                # Once per connection (it closes), but the text names a client's
                # transaction, and one client may open many connections.
                log_collapsed(
                    log,
                    logging.INFO,
                    "closing a connection: transaction discarded",
                    conn.peer,
                    "closing %s: %s",
                    conn.peer,
                    client_text(reason),
                )
            self.flush(conn)

    def _flow_changed(self) -> None:
        self.flow_changed.set()
        self.flow_changed = trio.Event()

    async def _wait_for_room(self, frame: Frame, stop: Stop) -> Stop | None:
        """Hold a SEND while its destination is stopped, at most its send timeout; the
        stop still in force then (None: it may go). The connection reads nothing more
        meanwhile (frames after it must not overtake it); other connections go on."""
        current: Stop | None = stop
        with trio.move_on_after(self.admission.send_timeout_s(frame)):
            while current is not None:
                # The event first, then the stop: a change between the two is not missed.
                changed = self.flow_changed
                current = self.admission.stop_for(frame, self.control.memwatch_level)
                if current is not None:
                    await changed.wait()
        return current

    async def publish_stats(self) -> None:
        """Our state for the admin API, every admin.stats_interval_ms."""
        interval = self.config.admin.stats_interval_ms / 1000
        while True:
            now = time.monotonic()
            held = [
                HeldSend(
                    peer=conn.peer,
                    destination=destination,
                    limit=stop.reason,
                    store=stop.store,
                    waiting_ms=int((now - since) * 1000),
                )
                for conn, (destination, stop, since) in self.held_sends.items()
            ]
            self.base.publish_stats(
                GatewayStats(
                    title=self.spec.title,
                    pid=os.getpid(),
                    at_ms=epoch_ms(),
                    connections=len(self.connections),
                    stopped_producers=held,
                    stops_known=len(self.flow.stops),
                    connections_accepted=self.accepted,
                    connections_refused=dict(self.refused),
                    frames_in=self.slot.counter(GATEWAY_FRAMES_IN),
                    frames_out=self.frames_out_closed
                    + sum(c.session.frames_out for c in self.connections.values()),
                    transactions_open=len(self.tx_budget.open_transactions()),
                    transactions_bytes=self.tx_budget.used,
                    transactions_discarded=self.tx_budget.discarded_for_room,
                    transactions_timed_out=self.tx_budget.discarded_for_age,
                )
            )
            await trio.sleep(interval)

    # -- connections ---------------------------------------------------------------------

    def _total(self, counter: int) -> int:
        """A counter of every gateway's slot, added up (each counts its own)."""
        layout, control = self.layout, self.control
        return sum(
            control.slot(layout.gateway_slot(g)).counter(counter) for g in range(layout.gateways)
        )

    def _admit_connection(self, arrival: _Arrival) -> tuple[str, ConnectionRefused] | None:
        """Whether a new connection, already counted, may go on: None when it may (maybe
        after closing another to make room for it), else (the kind, for the refusal
        counters; the refusal). The kind is `_SPEAK_FIRST` when it has sent nothing yet and
        no connection is idle (`_victim`): the caller gives it `_FIRST_BYTES_S` to send
        something, and asks again. Counted first and judged after: two gateways
        taking the last place at once both see the other, so both refuse (early), never
        both take it (late).

        Only clients through CONNECT can lock others out: when they hold every place, a
        new connection is refused. Connections still connecting (idle sockets, slowloris)
        never can: when the broker is full, or this gateway holds its share of
        `broker.max_connections_connecting`, the oldest of them makes room (`_victim`), as
        nginx closes idle connections when it runs out. A gateway closes only its own: each
        has its share of the connecting limit (the limit split evenly over the gateways,
        at least one each; the kernel spreads connections evenly over them), so making
        room is local, immediate and exact, with no round trip through shared memory to
        another process. `max_connections` is a total over every gateway, since clients
        through CONNECT may sit anywhere; when the connections still connecting that fill
        it are all other gateways', this one lets the new connection in one over (see
        below), and `_connected` keeps clients through CONNECT within max_connections."""
        broker = self.config.broker
        if self.stopping:
            return "shutting_down", ConnectionRefused("broker is shutting down")
        limit = broker.max_connections
        if self._total(GATEWAY_CONNECTED) >= limit:
            return _limit_refusal("max_connections", limit)
        per_address = broker.max_connections_per_address
        if per_address and self.addresses.total(arrival.address) > per_address:
            # (Before making room: one address does not close others' connections.)
            return _limit_refusal("max_connections_per_address", per_address)
        connecting = broker.connecting_limit()
        if self._total(GATEWAY_CONNECTIONS) > limit:
            kind, value = "max_connections", limit
        elif len(self.arrivals) >= max(1, connecting // self.layout.gateways):
            kind, value = "max_connections_connecting", connecting
        else:
            return None
        victim = self._victim(arrival)
        if victim is arrival:
            kind, refusal = _limit_refusal(kind, value)
            return (kind if arrival.waited else _SPEAK_FIRST), refusal
        if victim is not None:
            self._displace(victim, kind, value)
        # (None: this gateway holds no other connection still connecting, so those that
        # fill the broker are other gateways'. Refusing would lock clients out of this
        # gateway for as long as idle sockets keep coming to the others; it takes this one
        # over the total instead, by one connection, which its next newcomer replaces if
        # it is still connecting then.)
        return None

    def _victim(self, newcomer: _Arrival) -> _Arrival | None:
        """Which connection still connecting gives its place to `newcomer`: this gateway's
        oldest that is idle, having sent nothing in the `_FIRST_BYTES_S` since its accept
        (an idle socket, or a client that went away). When none is, the oldest one if the
        newcomer has sent something; if it has not, the newcomer itself, which is refused
        once it had `_FIRST_BYTES_S` to send something: a socket that has said nothing
        pushes out only one that has said nothing for longer, never a client that is
        sending its CONNECT (or has just connected). None when this gateway has no other
        connection still connecting."""
        idle_before = trio.current_time() - _FIRST_BYTES_S
        oldest: _Arrival | None = None
        for n, arrival in enumerate(self.arrivals):
            if oldest is None:
                oldest = arrival
            if arrival.since > idle_before or n >= _SILENT_SCAN:
                break  # (the rest are younger)
            if not arrival.has_spoken():
                return arrival
        if oldest is None or newcomer.has_spoken():
            return oldest
        return newcomer

    def _displace(self, victim: _Arrival, kind: str, value: int) -> None:
        """Close a connection still connecting to make room: its place is the newcomer's
        at once, and it gets an ERROR saying why (or, in its handshake, is closed)."""
        victim.displaced = Displaced(kind, value)
        self._release(victim)
        self._count_refusal("displaced")
        log_collapsed(
            log,
            logging.INFO,
            f"closing a connection to make room: {kind}",
            victim.peer,
            "closing %s to make room for a new connection: %s %d reached, and it has not "
            "completed CONNECT",
            victim.peer,
            kind,
            value,
        )
        victim.scope.cancel()

    def _release(self, arrival: _Arrival) -> None:
        """The connection no longer counts (it ended, or was closed to make room). Once."""
        self.arrivals.pop(arrival, None)
        if not arrival.counted:
            return
        arrival.counted = False
        self.slot.add_counter(GATEWAY_CONNECTIONS, -1)
        self.addresses.add(self.index, arrival.address, -1)
        if arrival.connected:
            arrival.connected = False
            self.slot.add_counter(GATEWAY_CONNECTED, -1)

    def _count_refusal(self, kind: str) -> None:
        """A connection refused, by kind (`GatewayStats.connections_refused`)."""
        self.refused[kind] = self.refused.get(kind, 0) + 1

    async def accept(
        self,
        stream: Transport,
        tls: TlsHandshakes | None = None,
        ws: WebSocketHandshakes | None = None,
    ) -> None:
        """A new connection (from any listener): counted against the limits, refused
        past them; a TLS connection's handshake first, a WebSocket's next, then
        `serve_connection`."""
        # The WebSocket handshake's deadline counts from here (TLS's time included).
        deadline = trio.current_time() + self.config.stomp.connect_timeout_ms / 1000
        peer = _peer_name(stream)
        arrival = _Arrival(peer, _socket_of(stream))
        arrival.counted = True
        self.slot.add_counter(GATEWAY_CONNECTIONS, 1)
        self.addresses.add(self.index, arrival.address, 1)
        try:
            refused = self._admit_connection(arrival)
            if refused is not None and refused[0] == _SPEAK_FIRST:
                with trio.move_on_after(_FIRST_BYTES_S) as wait:
                    await trio.lowlevel.wait_readable(arrival.sock)
                if not wait.cancelled_caught and not _waiting_bytes(arrival.sock):
                    # Readable with nothing to read: it went away. No refusal to tell.
                    await trio.aclose_forcefully(stream)
                    return
                arrival.waited = True
                refused = self._admit_connection(arrival)
            if refused is not None:
                kind, refusal = refused
                self._count_refusal(kind)
                await self._refuse(stream, peer, refusal, ws)
                return
            self.arrivals[arrival] = None
            client: _ClientStream | None = None
            with arrival.scope:  # (cancelled by `_displace`)
                # (A failed handshake closes its stream.)
                if tls is not None and not (
                    isinstance(stream, trio.SSLStream) and await tls.complete(stream, peer)
                ):
                    self._count_refusal("tls_handshake")
                else:
                    client = stream if ws is None else await ws.complete(stream, peer, deadline)
                    if client is None:
                        self._count_refusal("websocket_handshake")
            if arrival.displaced is not None:
                await trio.aclose_forcefully(client or stream)
            elif client is not None:
                arrival.heard = tls is not None or ws is not None
                self.accepted += 1
                await self.serve_connection(self._open(client, arrival))
        finally:
            self._release(arrival)

    def _open(self, stream: _ClientStream, arrival: _Arrival) -> _Connection:
        session = GatewaySession(
            next(self._conn_ids),
            self.config,
            self.layout.topology,
            self.message_ids,
            self.tx_budget,
            self.access,
        )
        return _Connection(session, stream, arrival.peer, arrival)

    def _connected(self, conn: _Connection, frame: Frame) -> bool:
        """The connection's CONNECT is about to go through (its login was checked): it
        counts as connected from now on. False when it may not: it was closed to make
        room meanwhile, or clients through CONNECT hold every place now (counted first
        and judged after, as `_admit_connection` does); the ERROR is queued."""
        arrival = conn.arrival
        if arrival.displaced is not None:
            self._close_displaced(conn, arrival.displaced)
            return False
        self.arrivals.pop(arrival, None)
        arrival.connected = True
        self.slot.add_counter(GATEWAY_CONNECTED, 1)
        limit = self.config.broker.max_connections
        if self._total(GATEWAY_CONNECTED) <= limit:
            return True
        # Only possible when a gateway let a connection in over the total (`_admit_connection`).
        arrival.connected = False
        self.slot.add_counter(GATEWAY_CONNECTED, -1)
        kind, refusal = _limit_refusal("max_connections", limit)
        self._count_refusal(kind)
        log_collapsed(
            log,
            logging.WARNING,
            "refused connection",
            conn.peer,
            "refused connection from %s: %s",
            conn.peer,
            refusal.reason,
        )
        conn.session.refuse(frame, refusal)
        conn.close_with(CLOSE_POLICY)
        return False

    def _close_displaced(self, conn: _Connection, displaced: Displaced) -> None:
        """It was closed to make room (`_displace` logged it): the ERROR."""
        conn.session.closing(displaced)
        conn.close_with(CLOSE_POLICY)

    async def serve_connection(self, conn: _Connection) -> None:
        """Read and write one connection until it ends (`accept` counted it)."""
        session, stream, peer = conn.session, conn.stream, conn.peer
        conn_id = session.conn
        self.connections[conn_id] = conn
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._reader, conn)
                # The writer decides when the connection ends: once the session is
                # closing and everything owed to the client (ERROR, RECEIPT) is written.
                await self._writer(conn)
                nursery.cancel_scope.cancel()
        except Exception:
            # One connection's failure must never take the gateway (and every other
            # connection on it) down.
            log_collapsed(
                log,
                logging.ERROR,
                "connection failed",
                peer,
                "connection from %s failed",
                peer,
                exc_info=True,
            )
        finally:
            del self.connections[conn_id]
            session.closed()
            self.frames_out_closed += session.frames_out
            # Its pipelines hear of the end last (ConnClosed), whatever ended it.
            self.flush(conn)
            if isinstance(stream, WebSocketStream):
                # A close frame with the reason's code, the client's answer, then the
                # socket (TLS's close_notify for wss), briefly.
                with trio.move_on_after(1):
                    await stream.aclose()
            elif isinstance(stream, trio.SSLStream):
                # TLS says goodbye (close_notify), or clients that wait for it (stomp.py's
                # unwrap) report a reset after every DISCONNECT; briefly, for a client
                # that has gone.
                with trio.move_on_after(1), contextlib.suppress(trio.BrokenResourceError):
                    await stream.aclose()
            await trio.aclose_forcefully(stream)

    async def _refuse(
        self,
        stream: Transport,
        peer: str,
        refusal: ConnectionRefused,
        ws: WebSocketHandshakes | None,
    ) -> None:
        log_collapsed(
            log,
            logging.WARNING,
            "refused connection",
            peer,
            "refused connection from %s: %s",
            peer,
            refusal.reason,
        )
        if isinstance(stream, trio.SSLStream):
            # No handshake to say why: refusing must cost less than serving, or a flood
            # of TLS connections past the limits would cost a handshake each.
            await trio.aclose_forcefully(stream.transport_stream)
            return
        frame = Frame("ERROR", {"message": refusal.message})
        if ws is not None:
            # The ERROR as a message, if the client completes its handshake at once (it
            # does not wait for anything): a browser shows no HTTP status to a page.
            client = await ws.complete(stream, peer, trio.current_time() + 1)
            if client is not None:
                client.close_code = CLOSE_GOING_AWAY if self.stopping else CLOSE_POLICY
                with trio.move_on_after(1), contextlib.suppress(trio.BrokenResourceError):
                    await client.send_frames([encode_frame(frame)])
                    await client.aclose()
                await trio.aclose_forcefully(client)
            return
        with trio.move_on_after(1), contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(encode_frame(frame))
        await trio.aclose_forcefully(stream)

    async def _reader(self, conn: _Connection) -> None:
        try:
            await self._read_frames(conn)
        finally:
            conn.notify()  # the writer finishes what is owed and ends the connection

    async def _read_frames(self, conn: _Connection) -> None:
        session = conn.session
        arrival = conn.arrival
        parser = FrameParser(self.limits, commands=CLIENT_COMMANDS)
        stomp = self.config.stomp
        # One socket read; frames within are handled as one batch.
        reader_bytes = self.config.memory.socket_reader_threshold_bytes
        connect_deadline = trio.current_time() + stomp.connect_timeout_ms / 1000
        # When the frame being read must be complete (inf: none is being read).
        frame_deadline = float("inf")
        while session.accepts_frames():
            awaiting = session.state is SessionState.AWAITING_CONNECT
            if awaiting:
                if arrival.displaced is not None:  # (while it was busy: not reading)
                    self._close_displaced(conn, arrival.displaced)
                    break
                deadline = connect_deadline
            elif session.heartbeat[1]:
                deadline = trio.current_time() + session.heartbeat[1] * stomp.heartbeat_grace / 1000
            else:
                deadline = float("inf")
            trickled = frame_deadline < deadline
            deadline = min(deadline, frame_deadline)
            with trio.CancelScope(deadline=deadline) as scope:
                if awaiting:
                    arrival.scope = scope  # closing it to make room cancels the read
                try:
                    # bytes() for the type checker: an SSLStream's reads are typed
                    # bytes | bytearray, and are bytes (of which bytes() is no copy).
                    data = bytes(await conn.stream.receive_some(reader_bytes))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                except ProtocolError as exc:
                    # A WebSocket message past the limit (refused before it is read).
                    self._protocol_error(conn, exc)
                    break
            if scope.cancelled_caught and arrival.displaced is not None:
                self._close_displaced(conn, arrival.displaced)
                break
            if scope.cancelled_caught:
                # One kind each, so one does not hide another's first line.
                if trickled:
                    late = "a frame too slow"
                elif session.state is SessionState.AWAITING_CONNECT:
                    late = "no CONNECT"
                else:
                    late = "no heart-beat"
                log_collapsed(
                    log,
                    logging.INFO,
                    f"closing a connection: {late}",
                    conn.peer,
                    "closing %s: %s",
                    conn.peer,
                    session.timed_out(stomp.heartbeat_grace, frame_started=trickled),
                )
                break
            if not data:
                session.closed()  # the client went away: nothing more can be written to it
                break
            if awaiting:
                arrival.heard = True
            try:
                frames = parser.feed(data)
            except ProtocolError as exc:
                self._protocol_error(conn, exc)
                frames = []
            read_at = trio.current_time()
            now = epoch_ms()
            at = 0
            while at < len(frames):
                # The common frames in a compiled loop; it stops at one the shell must handle.
                at, stopped = receive_run(
                    session,
                    frames,
                    at,
                    now,
                    self.admission,
                    self.control.memwatch_level,
                    conn.pacer,
                )
                if stopped == RUN_DENIED:
                    self._log_denial(conn)
                    continue
                if stopped != RUN_SHELL:
                    # (A SEND refused for its headers or destination is no denial.)
                    if stopped == RUN_REFUSED and session.denial:
                        self._log_denial(conn)
                    break
                frame = frames[at]
                at += 1
                # The state may change while we wait (a pipeline refused a frame, the broker
                # stops, the client went away): nothing more is read then.
                if not session.accepts_frames():
                    break
                if flow_controlled(session.state, frame):
                    if session.refuses_send(frame):
                        if session.denial:
                            self._log_denial(conn)
                        break
                    if not self.admission.admits_at_once(
                        frame, self.control.memwatch_level, conn.pacer
                    ):
                        admitted = await self._admit(conn, frame)
                        if admitted is _REFUSED or not session.accepts_frames():
                            break
                        if admitted is _WAITED:
                            now = epoch_ms()
                if (
                    session.state is SessionState.AWAITING_CONNECT
                    and frame.command in ("CONNECT", "STOMP")
                    and not (await self._authenticate(conn, frame) and self._connected(conn, frame))
                ):
                    break
                session.frame_received(frame, now)
                if session.denial:
                    self._log_denial(conn)
                parser.version = session.version  # CONNECT may have changed it
            if session.notices:
                self._log_notices(conn)
            # A SEND may have discarded other connections' transactions: they say so now.
            self.check_transactions(now)
            self.slot.add_counter(GATEWAY_FRAMES_IN, len(frames))
            for port in self.flush(conn):
                # A full ring: read nothing more until what we sent is in it.
                await port.drained()
            # A frame begun and not complete has frame_timeout_ms from the read that began it
            # (a read that completed frames began the one left over), not counting the time
            # we made the client wait (flow control, a full ring) before reading again.
            if not parser.buffered_bytes or not stomp.frame_timeout_ms:
                frame_deadline = float("inf")
            elif frames or frame_deadline == float("inf"):
                frame_deadline = trio.current_time() + stomp.frame_timeout_ms / 1000
            else:
                frame_deadline += trio.current_time() - read_at
        conn.notify()  # the writer writes what is owed and ends the connection

    def _protocol_error(self, conn: _Connection, exc: ProtocolError) -> None:
        """The client broke STOMP: a line per address in 10 s, and the session's ERROR."""
        log_collapsed(
            log,
            logging.WARNING,
            "protocol error",
            conn.peer,
            "protocol error from %s: %s",
            conn.peer,
            client_text(str(exc)),
        )
        conn.close_with(CLOSE_TOO_BIG if isinstance(exc, FrameTooLarge) else CLOSE_PROTOCOL_ERROR)
        conn.session.frame_error(exc)

    def _log_notices(self, conn: _Connection) -> None:
        """Headers the session ignored on purpose (each once per connection): a line per
        address in 10 s, then a count."""
        for line in conn.session.notices:
            log_collapsed(
                log,
                logging.INFO,
                "header ignored",
                conn.peer,
                "%s, from %s",
                client_text(line),
                conn.peer,
            )
        conn.session.notices.clear()

    def _log_denial(self, conn: _Connection) -> None:
        """The session refused a frame for its user's permissions: a line per address in
        10 s (then a count)."""
        log_collapsed(
            log,
            logging.WARNING,
            "access denied",
            conn.peer,
            "%s, from %s",
            client_text(conn.session.denial),
            conn.peer,
        )
        conn.session.denial = ""
        conn.close_with(CLOSE_POLICY)

    async def _authenticate(self, conn: _Connection, frame: Frame) -> bool:
        """Who the CONNECT says it is, checked (a scrypt check, in a thread: it takes tens
        of ms); a refusal is an ERROR, the same for every reason, and a log line."""
        auth = self.authenticator
        login, passcode = frame.headers.get("login"), frame.headers.get("passcode")
        if auth.costly(login, passcode):
            user = await trio.to_thread.run_sync(
                auth.check, login, passcode, limiter=self._auth_limiter
            )
        else:
            user = auth.check(login, passcode)
        if user is None:
            log_collapsed(
                log,
                logging.WARNING,
                "authentication failed",
                conn.peer,
                "authentication failed for %s from %s",
                client_text(login or "(no login)"),
                conn.peer,
            )
            conn.session.refuse(frame, AuthenticationFailed())
            self._count_refusal("authentication")
            conn.close_with(CLOSE_POLICY)
            return False
        if auth.users is not None:
            # A login is who the client is only where it was checked against the users.
            conn.session.user = user
            conn.session.groups = auth.groups(user)
        return True

    def _load_authenticator(self, config: Config) -> Authenticator:
        security = config.security
        users = load_users(Path(security.users_file)) if security.users_file else None
        return Authenticator(users, security.anonymous())

    async def _admit(self, conn: _Connection, frame: Frame) -> _Admitted:
        """Flow control for one SEND: wait for the producer's turn while it is paced, or
        for room while it is stopped (what it sent before goes first); refused when it was
        held past its send timeout."""
        admission = self.admission
        waited = await self._take_turn(conn, admission.memory_pace(self.control.memwatch_level))
        pace = admission.rate_pace(frame)
        if pace is not None:
            # Rate-based flow slows a producer down instead of stopping it.
            waited |= await self._take_turn(conn, pace)
            return _WAITED if waited else _GO
        stop = admission.stop_for(frame, self.control.memwatch_level)
        if stop is None:
            return _WAITED if waited else _GO
        self.flush(conn)  # what came before it goes first
        self.held_sends[conn] = (frame.headers.get("destination", ""), stop, time.monotonic())
        try:
            stop = await self._wait_for_room(frame, stop)
        finally:
            del self.held_sends[conn]
        if stop is None:
            return _WAITED
        refusal = admission.refusal(frame, stop)
        log_collapsed(
            log,
            logging.INFO,
            "refused a SEND",
            conn.peer,
            "refused a SEND from %s: %s",
            conn.peer,
            client_text(refusal.message),
        )
        conn.session.refuse(frame, refusal)
        return _REFUSED

    async def _take_turn(self, conn: _Connection, pace: Pace) -> bool:
        """Wait for the producer's turn at its pace, what it sent before going first;
        True if it had to wait."""
        delay = conn.pacer.delay(pace, trio.current_time())
        if delay is None:
            return False
        if delay > 0:
            self.flush(conn)  # what came before it goes first
            await trio.sleep(delay)
        conn.pacer.sent(pace[0], trio.current_time())
        return delay > 0

    async def _writer(self, conn: _Connection) -> None:
        session = conn.session
        stream = conn.stream
        while True:
            self.flush(conn)
            if not conn.unsent:
                if session.is_ending():
                    return
                send_every = session.heartbeat[0]
                timeout = send_every / 1000 if send_every else float("inf")
                with trio.move_on_after(timeout) as scope:
                    await conn.wake.wait()
                conn.wake = trio.Event()
                if scope.cancelled_caught:
                    conn.unsent.append(HEARTBEAT_BYTES)
                continue
            try:
                if isinstance(stream, WebSocketStream):
                    if not stream.is_open:
                        # Closed (the client's close came): nothing more is written, so
                        # its auto-ack deliveries must not count as sent.
                        session.closed()
                        return
                    # A message per frame: the session kept them whole.
                    frames, conn.unsent = conn.unsent, []
                    session.data_sent()
                    self.flush(conn)
                    await stream.send_frames(frames)
                    continue
                data = b"".join(conn.unsent)
                conn.unsent.clear()
                # Handed to the socket: its auto-ack deliveries leave their windows now.
                session.data_sent()
                self.flush(conn)
                await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                session.closed()
                return

    # -- lifecycle -----------------------------------------------------------------------

    async def shutdown_connections(self) -> None:
        """SIGTERM: tell every client, let the writers flush, then stop."""
        self.stopping = True
        for conn in list(self.connections.values()):
            conn.session.broker_stopping()
            conn.close_with(CLOSE_GOING_AWAY)
            conn.notify()
        with trio.move_on_after(2):
            while self.connections:
                await trio.sleep(0.01)

    def close(self) -> None:
        for ring in self.rings:
            ring.close()
        for bell in self.pipeline_bells:
            bell.close()
        self.addresses.close()
        self.base.close()


def _access_control(config: Config) -> AccessControl:
    return AccessControl(config.acl, config.queues.dead_letter_prefix)


def _limit_refusal(kind: str, value: int) -> tuple[str, ConnectionRefused]:
    """A new connection refused for a limit (`kind`, a setting) reached at `value`."""
    return kind, ConnectionRefused(f"{kind} {value} reached")


def _socket_of(stream: Transport) -> trio.socket.SocketType:
    """The connection's socket (a TLS stream's is its transport's)."""
    return stream.transport_stream.socket if isinstance(stream, trio.SSLStream) else stream.socket


def _waiting_bytes(sock: trio.socket.SocketType) -> int:
    """Bytes the client sent that wait in the socket, unread (FIONREAD: nothing is taken;
    0 once it is closed)."""
    fd = sock.fileno()
    if fd < 0:
        return 0  # closed
    try:
        reply = fcntl.ioctl(fd, termios.FIONREAD, bytes(4))
    except OSError:
        return 0
    return int(struct.unpack("i", reply)[0])


def _peer_name(stream: Transport) -> str:
    """The client's HOST:PORT ("?" once it has gone)."""
    sock = _socket_of(stream)
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"


async def _listen_socket(host: str, port: int, what: str = "") -> trio.socket.SocketType:
    """A socket listening on a port the supervisor reserved: every gateway listens on it
    (SO_REUSEPORT), and the kernel spreads the connections over them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        await sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise OSError(exc.errno, f"cannot listen on {host}:{port}{what}: in use") from None
        raise
    sock.listen(_LISTEN_BACKLOG)
    return sock


async def _main(spec: WorkerSpec, stop: StopOnSignal) -> None:
    config = spec.config
    host = config.broker.host
    tls = None
    if spec.tls_port >= 0 or spec.wss_port >= 0:
        # The supervisor loaded these files at start; a gateway that restarts loads them
        # again (they may have been replaced meanwhile).
        try:
            tls = server_context(config.stomp)
        except ConfigError as exc:
            log.error("%s cannot listen for STOMP over TLS: %s", spec.title, exc)
            raise SystemExit(1) from None
    try:
        gateway = Gateway(spec)
    except UsersFileError as exc:
        # Broken or gone since the start (a restarted gateway reads it again): one line,
        # and the supervisor's back-off, not a traceback per try.
        log.error("%s cannot check logins: %s", spec.title, exc)
        raise SystemExit(1) from None
    try:
        listener = trio.SocketListener(await _listen_socket(host, spec.port))
        # The TLS listeners leave the handshake to the first read or write; `accept` runs
        # it first, with a deadline, so that a failure is told apart from a client that left.
        handshakes = TlsHandshakes(config.stomp.connect_timeout_ms / 1000, log)
        stomp = config.stomp
        websockets = WebSocketHandshakes(
            stomp.ws_allowed_origins, stomp.connect_timeout_ms / 1000, stomp.max_frame_bytes, log
        )
        # The other listeners: (listener, how `accept` takes its connections).
        others: list[tuple[_Listener, Callable[[Transport], Awaitable[None]]]] = []
        if tls is not None and spec.tls_port >= 0:
            tls_sock = await _listen_socket(host, spec.tls_port, " (stomp.tls_port)")
            others.append(
                (
                    trio.SSLListener(trio.SocketListener(tls_sock), tls),
                    partial(gateway.accept, tls=handshakes),
                )
            )
        if spec.ws_port >= 0:
            ws_sock = await _listen_socket(host, spec.ws_port, " (stomp.ws_port)")
            others.append((trio.SocketListener(ws_sock), partial(gateway.accept, ws=websockets)))
        if tls is not None and spec.wss_port >= 0:
            wss_sock = await _listen_socket(host, spec.wss_port, " (stomp.wss_port)")
            others.append(
                (
                    trio.SSLListener(trio.SocketListener(wss_sock), tls),
                    partial(gateway.accept, tls=handshakes, ws=websockets),
                )
            )

        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                for port in gateway.ports:
                    nursery.start_soon(port.run)
                hello = Hello(spec.index, spec.incarnation)
                for port in gateway.route([(p, hello) for p in range(len(gateway.ports))]):
                    await port.drained()
                gateway.base.ready()
                nursery.start_soon(gateway.pump)
                nursery.start_soon(gateway.publish_stats)
                accepting = trio.CancelScope()

                async def accept() -> None:
                    with accepting:
                        # Connections run in the outer nursery, so that stopping the
                        # accept loops leaves them open until they are told to close.
                        async with trio.open_nursery() as loops:
                            serve = partial(trio.serve_listeners, handler_nursery=nursery)
                            loops.start_soon(serve, gateway.accept, [listener])
                            for other, handler in others:
                                loops.start_soon(serve, handler, [other])

                nursery.start_soon(accept)
                if not stop.requested:  # (a signal before the receiver was there)
                    async for _ in signals:
                        break
                gateway.slot.state = STATE_STOPPING
                accepting.cancel()
                await listener.aclose()
                for other, _ in others:
                    await other.aclose()
                await gateway.shutdown_connections()
                # What the connections said last (ConnClosed) reaches the pipelines, unless
                # a ring stays full (a stopped pipeline) for longer than this.
                with trio.move_on_after(_CLOSE_TIMEOUT_S):
                    for port in gateway.ports:
                        await port.drained()
                nursery.cancel_scope.cancel()
    finally:
        gateway.close()


def run_gateway(spec: WorkerSpec) -> None:
    # Handlers that only take note, under trio's signal receiver: what it puts back when it
    # is done. A second signal while the gateway closes (Ctrl-C reaches every process of
    # the group, then the supervisor's SIGTERM follows) was a KeyboardInterrupt or a kill
    # by the default handler, breaking off the close with a traceback.
    stop = StopOnSignal()
    trio.run(_main, spec, stop)
