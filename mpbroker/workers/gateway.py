"""Gateway worker: STOMP over TCP (trio) on one side, rings to the pipelines on the other.

A thin shell: `FrameParser` turns bytes into frames, `GatewaySession` decides what they
mean, and this module moves bytes between sockets and rings. Every gateway listens on the
same port with SO_REUSEPORT, so the kernel spreads connections over them.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import signal
import socket
import time

import trio

from mpbroker import records
from mpbroker.clock import epoch_ms
from mpbroker.errors import LimitReached
from mpbroker.flow import (
    STORE_MEMORY,
    FlowGate,
    RateFlow,
    RateSettings,
    Stop,
    rate_settings_for,
    throttle_rate_settings,
)
from mpbroker.gateway_session import GatewaySession, SessionState, TransactionBudget
from mpbroker.records import Hello, Record
from mpbroker.shm import (
    STATE_READY,
    STATE_STOPPING,
    ControlBlock,
    Doorbell,
    Ring,
    RingReader,
    RingWriter,
    StatsBlock,
    park_async,
)
from mpbroker.stomp import (
    CLIENT_COMMANDS,
    HEARTBEAT_BYTES,
    Frame,
    FrameLimits,
    FrameParser,
    ProtocolError,
    encode_frame,
)

from . import _stats
from ._gc import LevelGC
from ._layout import WorkerSpec
from ._reload import ConfigWatch

__all__ = ["run_gateway"]

log = logging.getLogger("mpbroker.gateway")

# Control-block counters of a gateway slot.
COUNTER_CONNECTIONS = 0
COUNTER_FRAMES_IN = 1
COUNTER_MESSAGES_OUT = 2

_LISTEN_BACKLOG = 1024
# The key of a producer's MemWatch pace in _Connection.rates (no destination is "").
_MEMORY_RATE = ""
_CLOSE_TIMEOUT_S = 2.0


class _Port:
    """The writing end of one gateway->pipeline ring."""

    def __init__(self, writer: RingWriter) -> None:
        self.writer = writer
        self.dirty = False

    async def send(self, record: Record) -> None:
        kind, payload = records.encode(record)
        if not self.writer.stage(kind, payload):
            # Full: `put` publishes what is staged first, then waits for room.
            await self.writer.put(kind, payload)
        self.dirty = True

    def flush(self) -> None:
        if self.dirty:
            self.writer.publish()
            self.dirty = False


class _Connection:
    def __init__(self, session: GatewaySession, stream: trio.SocketStream, peer: str) -> None:
        self.session = session
        self.stream = stream
        self.peer = peer
        self.wake = trio.Event()
        self.last_received = time.monotonic()
        # Rate-based flow: this producer's pace per destination while it is controlled,
        # and over all destinations (key _MEMORY_RATE) while MemWatch throttles.
        self.rates: dict[str, RateFlow] = {}

    def notify(self) -> None:
        self.wake.set()


class Gateway:
    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.config = spec.config
        layout = spec.layout
        self.layout = layout
        self.index = spec.index
        self.control = ControlBlock.attach(layout.control)
        self.slot = self.control.slot(spec.slot)
        self.doorbell = Doorbell.create(layout.gateway_bell(spec.index))
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
        # Connection ids stay unique across restarts of this gateway: incarnation in the
        # high bits, so a pipeline never confuses a new connection with a dead one's.
        self._conn_ids = itertools.count((spec.incarnation << 40) + 1)
        # No colons: STOMP 1.2 escapes them in header values, which would put every
        # MESSAGE frame on the encoder's slow path.
        prefix = f"ID-{layout.instance}-{spec.index}.{spec.incarnation}-"
        self.message_ids = (f"{prefix}{n}" for n in itertools.count(1))
        self.tx_budget = TransactionBudget(self.config.transactions.max_uncommitted_bytes)
        stomp = self.config.stomp
        self.limits = FrameLimits(
            max_frame_bytes=stomp.max_frame_bytes,
            max_headers=stomp.max_headers,
            max_header_bytes=stomp.max_header_bytes,
        )
        self.stopping = False
        # Flow control: the stops our pipelines announced; waiting SENDs wake on a change.
        self.flow = FlowGate(layout.topology)
        self.flow_changed = trio.Event()
        # SENDs held by flow control now, for the admin API: conn -> (destination, stop, since).
        self.held_sends: dict[_Connection, tuple[str, Stop, float]] = {}
        self.stats = StatsBlock.attach(layout.stats(spec.slot))
        self.rate_for = rate_settings_for(self.config)
        self.throttle_rate = throttle_rate_settings(self.config)
        self.config_watch = ConfigWatch(self.control, spec)
        self.level_gc = LevelGC(self.control, spec.config)
        # MemWatch's level as last seen: held SENDs wake when it changes.
        self.memory_level = 0

    # -- rings ---------------------------------------------------------------------------

    async def route(self, routes: list[tuple[int, Record]]) -> None:
        for pipeline, record in routes:
            await self.ports[pipeline].send(record)
        routes.clear()
        for port in self.ports:
            port.flush()

    async def pump(self) -> None:
        """Take records from the pipelines and turn them into frames for connections."""
        batch_records = self.config.rings.batch_records
        park_timeout = self.config.rings.park_timeout_ms / 1000
        decode = records.decode
        while True:
            touched: set[_Connection] = set()
            pending_routes: list[tuple[int, Record]] = []
            got = False
            for reader in self.readers:
                batch = reader.read_batch(batch_records)
                if not batch:
                    continue
                got = True
                for kind, payload in batch:
                    self._apply(decode(kind, payload), touched, pending_routes)
            for conn in touched:
                conn.notify()
            if pending_routes:
                await self.route(pending_routes)
            # The heartbeat says the event loop turns, busy or idle (park times out).
            self.slot.beat()
            self.level_gc.tick()
            if self.control.memwatch_level != self.memory_level:
                self.memory_level = self.control.memwatch_level
                self._flow_changed()  # large SENDs held for memory may go now
            reloaded = self.config_watch.poll()
            if reloaded is not None:
                # SIGHUP: send timeouts and rate-based flow as reloaded; held SENDs and
                # producers being paced go on with what they started with.
                self.config = reloaded
                self.rate_for = rate_settings_for(reloaded)
                self.throttle_rate = throttle_rate_settings(reloaded)
                log.info("flow settings reloaded")
            if got:
                await trio.lowlevel.checkpoint()
            else:
                await park_async(self.readers, self.doorbell, park_timeout)

    def _apply(
        self,
        record: Record,
        touched: set[_Connection],
        pending_routes: list[tuple[int, Record]],
    ) -> None:
        match record:
            case records.Deliver(targets=targets, message=message):
                shared: dict[str, memoryview] = {}
                for conn_id, sub in targets:
                    conn = self.connections.get(conn_id)
                    if conn is not None and conn.session.deliver(sub, message, shared):
                        touched.add(conn)
            case records.Receipt(conn=conn_id, receipt=receipt):
                conn = self.connections.get(conn_id)
                if conn is not None:
                    conn.session.receipt(receipt)
                    touched.add(conn)
            case records.Refuse(conn=conn_id):
                conn = self.connections.get(conn_id)
                if conn is not None:
                    log.warning("refused a frame from %s: %s", conn.peer, record.message)
                    conn.session.refused(record)
                    touched.add(conn)
            case records.BarrierDone(conn=conn_id, token=token, pipeline=pipeline):
                conn = self.connections.get(conn_id)
                if conn is not None:
                    conn.session.barrier_done(token, pipeline)
                    touched.add(conn)
            case records.PipelineHello(pipeline=pipeline, incarnation=incarnation):
                if incarnation > 0:
                    log.info("pipeline %d restarted: re-registering subscriptions", pipeline)
                for conn in self.connections.values():
                    conn.session.resubscribe(pipeline)
                    pending_routes.extend(conn.session.routes)
                    conn.session.routes.clear()
                pending_routes.append((pipeline, records.Registered(self.index, incarnation)))
                # Its predecessor's stops are moot; it announces the ones that still hold.
                self.flow.pipeline_restarted(pipeline)
                self._flow_changed()
            case records.FlowState():
                self.flow.apply(record)
                self._flow_changed()
            case _:
                log.error("unexpected record from a pipeline: %r", type(record).__name__)

    def _flow_changed(self) -> None:
        self.flow_changed.set()
        self.flow_changed = trio.Event()

    async def _wait_for_room(
        self, session: GatewaySession, frame: Frame, stop: Stop
    ) -> Stop | None:
        """Hold a SEND while its destination is stopped, at most `send_timeout_ms`; the
        stop still in force then (None: it may go). The connection reads nothing more
        meanwhile (frames after it must not overtake it); other connections go on."""
        destination = frame.headers.get("destination", "")
        current: Stop | None = stop
        with trio.move_on_after(self.config.send_timeout_ms(destination) / 1000):
            while current is not None:
                await self.flow_changed.wait()
                current = self._stop_for(session, frame)
        return current

    async def publish_stats(self) -> None:
        """Our state for the admin API, every admin.stats_interval_ms."""
        interval = self.config.admin.stats_interval_ms / 1000
        while True:
            now = time.monotonic()
            held = [
                {
                    "peer": conn.peer,
                    "destination": destination,
                    "limit": stop.reason,
                    "store": stop.store,
                    "waiting_ms": int((now - since) * 1000),
                }
                for conn, (destination, stop, since) in self.held_sends.items()
            ]
            _stats.publish(
                self.stats,
                {
                    "title": self.spec.title,
                    "pid": os.getpid(),
                    "at_ms": epoch_ms(),
                    "connections": len(self.connections),
                    "stopped_producers": held,
                    "stops_known": len(self.flow.stops),
                },
            )
            await trio.sleep(interval)

    # -- connections ---------------------------------------------------------------------

    def _open_connections(self) -> int:
        """Connections open on every gateway (each gateway counts its own in its slot)."""
        total = 0
        for g in range(self.layout.gateways):
            total += self.control.slot(self.layout.gateway_slot(g)).counter(COUNTER_CONNECTIONS)
        return total

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        try:
            host, port = stream.socket.getpeername()[:2]
            peer = f"{host}:{port}"
        except OSError:
            peer = "?"
        limit = self.config.broker.max_connections
        if self.stopping or self._open_connections() >= limit:
            await self._refuse(stream, peer, limit)
            return
        conn_id = next(self._conn_ids)
        session = GatewaySession(
            conn_id, self.config, self.layout.topology, self.message_ids, self.tx_budget
        )
        conn = _Connection(session, stream, peer)
        self.connections[conn_id] = conn
        self.slot.add_counter(COUNTER_CONNECTIONS, 1)
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
            log.exception("connection from %s failed", peer)
        finally:
            del self.connections[conn_id]
            self.slot.add_counter(COUNTER_CONNECTIONS, -1)
            routes = session.close_records()
            # Shielded so a cancelled connection still tells its pipelines; bounded so a
            # full ring to a stopped pipeline cannot hold the gateway up at shutdown.
            with trio.move_on_after(_CLOSE_TIMEOUT_S, shield=True):
                await self.route(routes)
            await trio.aclose_forcefully(stream)

    async def _refuse(self, stream: trio.SocketStream, peer: str, limit: int) -> None:
        reason = "broker is shutting down" if self.stopping else f"max_connections {limit} reached"
        log.warning("refused connection from %s: %s", peer, reason)
        frame = Frame("ERROR", {"message": f"connection refused: {reason}"})
        with trio.move_on_after(1), contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(encode_frame(frame))
        await stream.aclose()

    async def _reader(self, conn: _Connection) -> None:
        try:
            await self._read_frames(conn)
        finally:
            conn.notify()  # the writer finishes what is owed and ends the connection

    async def _read_frames(self, conn: _Connection) -> None:
        session = conn.session
        parser = FrameParser(self.limits, commands=CLIENT_COMMANDS)
        stomp = self.config.stomp
        # One socket read; frames within are handled as one batch.
        reader_bytes = self.config.memory.socket_reader_threshold_bytes
        connect_deadline = trio.current_time() + stomp.connect_timeout_ms / 1000
        while not session.closing and not session.disconnecting:
            if session.state == SessionState.AWAIT_CONNECT:
                deadline = connect_deadline
            elif session.heartbeat[1]:
                deadline = trio.current_time() + session.heartbeat[1] * stomp.heartbeat_grace / 1000
            else:
                deadline = float("inf")
            with trio.CancelScope(deadline=deadline) as scope:
                try:
                    data = await conn.stream.receive_some(reader_bytes)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
            if scope.cancelled_caught:
                if session.state == SessionState.AWAIT_CONNECT:
                    reason = f"no CONNECT within connect_timeout_ms {stomp.connect_timeout_ms}"
                else:
                    reason = (
                        f"no heart-beat or frame for {session.heartbeat[1] * stomp.heartbeat_grace:.0f} ms "
                        f"(negotiated heart-beat {session.heartbeat[1]} ms)"
                    )
                log.info("closing %s: %s", conn.peer, reason)
                session.fail(reason)
                break
            if not data:
                # The client went away: nothing more can be written to it.
                session.closing = True
                session.discard_unwritten()
                break
            try:
                frames = parser.feed(data)
            except ProtocolError as exc:
                log.warning("protocol error from %s: %s", conn.peer, exc)
                session.fail(str(exc))
                frames = []
            now = epoch_ms()
            for frame in frames:
                await self._memory_paced(conn, frame)
                # Rate-based flow slows a producer down instead of stopping it.
                paced = await self._paced(conn, frame)
                stop = None if paced else self._stop_for(session, frame)
                if stop is not None:
                    # What came before it goes first; then it waits for room.
                    if session.routes:
                        await self.route(session.routes)
                    destination = frame.headers.get("destination", "")
                    self.held_sends[conn] = (destination, stop, time.monotonic())
                    try:
                        stop = await self._wait_for_room(session, frame, stop)
                    finally:
                        del self.held_sends[conn]
                    if stop is not None:
                        self._refuse_stopped(conn, frame, stop)
                        break
                    now = epoch_ms()
                was_connected = session.connected
                session.on_frame(frame, now)
                if not was_connected and session.connected:
                    parser.version = session.version
                    conn.notify()  # heart-beat intervals changed
                if session.is_closing():
                    break
            self.slot.add_counter(COUNTER_FRAMES_IN, len(frames))
            if session.routes:
                await self.route(session.routes)
            if session.out or session.closing or session.disconnecting:
                conn.notify()

    async def _paced(self, conn: _Connection, frame: Frame) -> bool:
        """Rate-based flow (WebLogic): a SEND to a destination with `flow_control` waits
        for its producer's turn at the current rate, which decays while the destination is
        armed and recovers once it is not. True when the destination is rate-controlled."""
        if not _flow_controlled(conn.session, frame):
            return False
        destination = frame.headers.get("destination", "")
        settings = self.rate_for(destination)
        if settings is None:
            return False
        persistent = frame.headers.get("persistent") == "true"
        armed = self.flow.stop_for(destination, persistent) is not None
        await self._take_turn(conn, destination, armed, settings)
        return True

    async def _take_turn(
        self, conn: _Connection, key: str, armed: bool, settings: RateSettings
    ) -> None:
        """Wait for the producer's turn at its rate for `key` (geometric decay while
        `armed`, linear recovery after; no rate once fully recovered), what it sent before
        going first."""
        now = trio.current_time()
        rate = conn.rates.get(key)
        if armed:
            if rate is None:
                rate = conn.rates[key] = RateFlow(settings)
            rate.arm(now)
        elif rate is None:
            return
        else:
            rate.disarm(now)
            if rate.rate(now) is None:  # fully recovered: no longer controlled
                del conn.rates[key]
                return
        delay = rate.delay(now)
        if delay > 0:
            if conn.session.routes:
                await self.route(conn.session.routes)  # what came before goes first
            await trio.sleep(delay)
        rate.sent(trio.current_time())

    def _stop_for(self, session: GatewaySession, frame: Frame) -> Stop | None:
        if not _flow_controlled(session, frame):
            return None
        destination = frame.headers.get("destination", "")
        threshold = self.config.memory.socket_reader_threshold_bytes
        if len(frame.body) > threshold and self._memory_short():
            # A large message waits while memory is short (the seed's socket reader
            # threshold: smaller ones are taken without a memory check).
            level = self.config.memory.throttle_level
            return Stop(
                "",
                STORE_MEMORY,
                f"throttle_level {level} (MemWatch level {self.control.memwatch_level}; a "
                f"{len(frame.body)}-byte message is above socket_reader_threshold_bytes "
                f"{threshold})",
            )
        if not self.flow.stops:
            return None
        return self.flow.stop_for(destination, frame.headers.get("persistent") == "true")

    def _memory_short(self) -> bool:
        level = self.config.memory.throttle_level
        return bool(level) and self.control.memwatch_level >= level

    async def _memory_paced(self, conn: _Connection, frame: Frame) -> None:
        """MemWatch at `memory.throttle_level`: every producer is slowed down with the
        [flow] rates (geometric decay), and recovers linearly once memory is back under."""
        if not _flow_controlled(conn.session, frame):
            return
        await self._take_turn(conn, _MEMORY_RATE, self._memory_short(), self.throttle_rate)

    def _refuse_stopped(self, conn: _Connection, frame: Frame, stop: Stop) -> None:
        destination = frame.headers.get("destination", "")
        timeout = self.config.send_timeout_ms(destination)
        where = f"{stop.store}.{stop.reason.split(' ')[0]}"
        refusal = LimitReached(
            destination,
            stop.reason,
            detail=f"The message was not accepted: "
            f"{'its destination' if stop.destination else 'the store'}"
            f" stayed over {where} for send_timeout_ms {timeout}.",
        )
        log.info("refused a SEND from %s: %s", conn.peer, refusal.message)
        conn.session.fail(refusal.message, refusal.detail, frame.headers.get("receipt", ""))

    async def _writer(self, conn: _Connection) -> None:
        session = conn.session
        stream = conn.stream
        while True:
            if not session.out:
                if session.closing and not session.pending_receipts:
                    return
                send_every = session.heartbeat[0]
                timeout = send_every / 1000 if send_every else float("inf")
                with trio.move_on_after(timeout) as scope:
                    await conn.wake.wait()
                conn.wake = trio.Event()
                if scope.cancelled_caught and not session.out:
                    session.out.append(HEARTBEAT_BYTES)
                if not session.out:
                    continue
            data = b"".join(session.out)
            session.out.clear()
            # Auto-ack deliveries handed to the socket leave their windows now: once
            # given to send_all they may reach the client, so they must never come back
            # (at most once); and the window still bounds what this gateway buffers.
            credits = session.take_credits()
            if credits:
                await self.route(credits)
            try:
                await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                session.closing = True
                session.discard_unwritten()
                return
            if session.closing and not session.out and not session.pending_receipts:
                return

    # -- lifecycle -----------------------------------------------------------------------

    async def shutdown_connections(self) -> None:
        """SIGTERM: tell every client, let the writers flush, then stop."""
        self.stopping = True
        for conn in list(self.connections.values()):
            conn.session.fail("broker is shutting down")
            conn.notify()
        with trio.move_on_after(2):
            while self.connections:
                await trio.sleep(0.01)

    def close(self) -> None:
        for ring in self.rings:
            ring.close()
        for bell in self.pipeline_bells:
            bell.close()
        self.doorbell.close()
        self.stats.close()
        self.control.close()


def _flow_controlled(session: GatewaySession, frame: Frame) -> bool:
    """A SEND that flow control may hold or pace: not one inside a transaction (the
    transaction budget bounds those; they reach the pipeline at COMMIT)."""
    return frame.command == "SEND" and session.connected and "transaction" not in frame.headers


def _listen_socket(host: str, port: int) -> trio.socket.SocketType:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


async def _main(spec: WorkerSpec) -> None:
    gateway = Gateway(spec)
    try:
        sock = _listen_socket(spec.config.broker.host, spec.port)
        try:
            await sock.bind((spec.config.broker.host, spec.port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise OSError(
                    exc.errno, f"cannot listen on {spec.config.broker.host}:{spec.port}: in use"
                ) from None
            raise
        sock.listen(_LISTEN_BACKLOG)
        listener = trio.SocketListener(sock)
        hello = Hello(spec.index, spec.incarnation)
        await gateway.route([(p, hello) for p in range(len(gateway.ports))])
        gateway.slot.pid = os.getpid()
        gateway.slot.incarnation = spec.incarnation
        gateway.slot.beat()  # before READY: the supervisor judges ready workers by it
        gateway.slot.state = STATE_READY
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(gateway.pump)
                nursery.start_soon(gateway.publish_stats)
                accepting = trio.CancelScope()

                async def accept() -> None:
                    with accepting:
                        # Connections run in the outer nursery, so that stopping the
                        # accept loop leaves them open until they are told to close.
                        await trio.serve_listeners(
                            gateway.serve_connection, [listener], handler_nursery=nursery
                        )

                nursery.start_soon(accept)
                async for _ in signals:
                    break
                gateway.slot.state = STATE_STOPPING
                accepting.cancel()
                await listener.aclose()
                await gateway.shutdown_connections()
                nursery.cancel_scope.cancel()
    finally:
        gateway.close()


def run_gateway(spec: WorkerSpec) -> None:
    trio.run(_main, spec)
