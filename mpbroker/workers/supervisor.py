"""Supervisor: creates the shared segments, starts the workers, restarts the ones that die.

`mpbroker serve` runs this in the foreground. It owns every segment of its instance
(named after its pid), holds the instance's lock (`InstanceLock`) while they exist and removes
them on a clean stop; a start first sweeps the segments of instances that died without cleaning
up (kill -9: nobody holds their lock any more). Workers are forked by a fork server
(`_launcher`) that the supervisor starts first: supervisor -> fork server -> workers.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pickle
import select
import signal
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import msgspec

from mpbroker import native
from mpbroker.admin import (
    DestinationsStatus,
    MemoryLevel,
    MemoryStatus,
    QueueWorkerStats,
    StatusView,
    TopicWorkerStats,
)
from mpbroker.admin.server import AdminServer, WorkerRef, allowed_names, status_view
from mpbroker.config import Config, ConfigError, parse_levels, reload_flow_settings
from mpbroker.memory import (
    PER_DESTINATION_BYTES,
    MemWatch,
    broker_memory,
    check,
    max_destinations,
    require_fits,
)
from mpbroker.routing import Topology
from mpbroker.security import User, UsersFileError, load_users, server_context, unknown_names
from mpbroker.shm import (
    STATE_EMPTY,
    STATE_READY,
    AddressCounts,
    ControlBlock,
    Doorbell,
    InstanceLock,
    Ring,
    ShmError,
    StatsBlock,
    monotonic_ms,
    remove_instance,
    sweep_stale,
)
from mpbroker.systemd import Counters, Notifier, NotifyError, WorkerBeat

from ._counters import (
    GATEWAY_CONNECTIONS,
    PIPELINE_DELIVERED,
    PIPELINE_DESTINATIONS,
    PIPELINE_RECEIVED,
)
from ._launcher import Launcher, LauncherError, WorkerProcess
from ._layout import Layout, WorkerSpec, reloaded_config
from ._service import BrokerFigures, ServiceLink
from .datadir import (
    DataDirError,
    DataDirLock,
    PortsRecord,
    check_data_dir,
    owner_only,
    read_partitions,
    remove_ports,
    write_partitions,
    write_ports,
)

__all__ = ["EXIT_FAILED", "EXIT_REFUSED", "StartupError", "serve"]

log = logging.getLogger("mpbroker.supervisor")

_SLOT_COUNTERS = 16
# A worker that dies sooner than this after starting is "crash looping": back off.
_STABLE_AFTER_S = 5.0
_FIRST_BACKOFF_S = 0.1
_STARTUP_TIMEOUT_S = 60.0


# Exit codes of a broker that did not start. 2: it refused what it was given (a setting,
# the data dir, the environment): starting again cannot help, so systemd does not
# (RestartPreventExitStatus=2). 1: it could not start now (a port in use, a worker that
# failed while starting): another try may work.
EXIT_REFUSED = 2
EXIT_FAILED = 1


class StartupError(RuntimeError):
    """The broker could not start; the message says why, `exit_code` how it ends."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(eq=False)
class _Worker:
    role: str
    index: int
    incarnation: int = 0
    process: WorkerProcess | None = None
    started_at: float = 0.0
    backoff_s: float = 0.0
    restart_at: float | None = None
    spec_title: str = ""
    exit_codes: list[int | None] = field(default_factory=list)
    # For the watchdog (mpbroker.systemd.stalled): since when it has not been ready
    # (monotonic seconds; None while it is), and whether it replaces a stalled worker.
    down_since: float | None = None
    after_stall: bool = False


class Supervisor:
    def __init__(self, config: Config, reload_source: Callable[[], Config] | None = None) -> None:
        self.config = config
        self.instance = str(os.getpid())
        broker = config.broker
        self.layout = Layout(
            self.instance,
            broker.gateway_count(),
            Topology(broker.p2p_workers, broker.pubsub_workers, config.queues.dead_letter_prefix),
            config.replay.workers,
        )
        # Forks every worker; started first thing, so it imports while segments are made.
        self.launcher = Launcher(broker.log_level, broker.log_format)
        self.workers: list[_Worker] = []
        self.rings: list[Ring] = []
        self.bells: list[Doorbell] = []
        self.control: ControlBlock | None = None
        self.addresses: AddressCounts | None = None
        # Held from before the first segment exists until the last is removed: while it is
        # held, no other broker's start sweeps this instance's segments.
        self.instance_lock: InstanceLock | None = None
        self.data_lock: DataDirLock | None = None
        self.stats: dict[int, StatsBlock] = {}
        self.admin: AdminServer | None = None
        self.port_holder: socket.socket | None = None
        self.port = broker.port
        # STOMP over TLS (stomp.tls_port; -1: none), reserved the same way.
        self.tls_holder: socket.socket | None = None
        self.tls_port = config.stomp.tls_port
        # STOMP over WebSocket, plain and over TLS (stomp.ws_port, stomp.wss_port).
        self.ws_holder: socket.socket | None = None
        self.ws_port = config.stomp.ws_port
        self.wss_holder: socket.socket | None = None
        self.wss_port = config.stomp.wss_port
        self._stop = False
        # SIGHUP: where the configuration is read again from (None: no file to reload).
        self.reload_source = reload_source
        self._reload = False
        memory = config.memory
        self.memwatch = MemWatch(
            memory.max_memory,
            parse_levels(memory.memwatch_levels, memory.memwatch_gc_intervals_ms),
            memory.memwatch_warn_level,
        )
        self.next_memwatch = 0.0
        # MemWatch's last reading of each process, by pid (for /status: a new dict each
        # time, so the admin thread never sees one half written).
        self.process_memory: dict[int, int] = {}
        self._wakeup_r, self._wakeup_w = socket.socketpair()
        self._signal_name = ""
        try:
            # Read (and taken out of the environment) before the fork server starts.
            notifier = Notifier.from_environment()
        except NotifyError as exc:
            raise StartupError(str(exc), EXIT_REFUSED) from None
        self.service = ServiceLink(
            notifier, broker.worker_stall_timeout_ms, int(_STARTUP_TIMEOUT_S * 1000)
        )

    # -- set-up --------------------------------------------------------------------------

    def create_segments(self) -> None:
        try:
            self.instance_lock = InstanceLock.acquire(self.instance)
        except (ShmError, OSError) as exc:
            raise StartupError(f"cannot lock broker instance {self.instance}: {exc}") from None
        removed = sweep_stale()
        if removed:
            log.info("removed %d shared-memory entries of dead broker instances", len(removed))
        layout = self.layout
        capacity = self.config.rings.capacity_bytes
        self.control = ControlBlock.create(layout.control, layout.workers)
        self.addresses = AddressCounts.create(layout.addresses, layout.gateways)
        for slot in range(layout.workers):
            self.stats[slot] = StatsBlock.create(layout.stats(slot), self.config.admin.stats_bytes)
        # Doorbell FIFOs exist from the start so writers can attach before their reader
        # runs; each reader re-creates its own when it starts (see Doorbell.create).
        for g in range(layout.gateways):
            self.bells.append(Doorbell.create(layout.gateway_bell(g)))
        for p in range(layout.topology.pipelines):
            self.bells.append(Doorbell.create(layout.pipeline_bell(p)))
        for r in range(layout.replayers):
            self.bells.append(Doorbell.create(layout.replay_bell(r)))
        for bell in self.bells:
            bell.close()
        for p in range(layout.topology.pipelines):
            for g in range(layout.gateways):
                self.rings.append(Ring.create(layout.to_pipeline(g, p), capacity))
                self.rings.append(Ring.create(layout.to_gateway(p, g), capacity))
        for p in range(layout.topology.p2p, layout.topology.pipelines):
            self.rings.append(Ring.create(layout.to_replay(p), capacity))
            self.rings.append(Ring.create(layout.from_replay(p), capacity))
        total = capacity * len(self.rings)
        log.debug("created %d rings of %d bytes (%d bytes)", len(self.rings), capacity, total)

    def reserve_port(self) -> None:
        """Bind (without listening) so the ports stay ours across gateway restarts: the
        STOMP port, and the STOMP over TLS and WebSocket ports when there are.

        A bound socket that does not listen receives no connections; the gateways bind the
        same port with SO_REUSEPORT and listen. With --port 0 this is how the port is chosen.
        """
        host = self.config.broker.host
        self.port_holder, self.port = _reserve(host, self.config.broker.port, "broker.port")
        tls_port = self.config.stomp.tls_port
        if tls_port >= 0:
            self.tls_holder, self.tls_port = _reserve(host, tls_port, "stomp.tls_port")
        stomp = self.config.stomp
        if stomp.ws_port >= 0:
            self.ws_holder, self.ws_port = _reserve(host, stomp.ws_port, "stomp.ws_port")
        if stomp.wss_port >= 0:
            self.wss_holder, self.wss_port = _reserve(host, stomp.wss_port, "stomp.wss_port")

    def _spec(self, worker: _Worker) -> WorkerSpec:
        return WorkerSpec(
            worker.role,
            worker.index,
            worker.incarnation,
            self.layout,
            self.config,
            self.port,
            self.tls_port,
            self.ws_port,
            self.wss_port,
        )

    def _slot_index(self, worker: _Worker) -> int:
        return self.layout.slot(worker.role, worker.index)

    def start_launcher(self) -> None:
        try:
            self.launcher.start()
        except OSError as exc:
            raise StartupError(f"cannot start the fork server: {exc}") from None

    def start_worker(self, worker: _Worker) -> None:
        """Fork the worker (LauncherError if the fork server cannot)."""
        assert self.control is not None
        slot = self.control.slot(self._slot_index(worker))
        # The dead worker can no longer write its slot; start its successor from zero.
        slot.state = STATE_EMPTY
        for i in range(_SLOT_COUNTERS):
            if i == PIPELINE_DESTINATIONS and worker.role in ("p2p", "pubsub"):
                # Its destinations (broker.max_destinations) stay counted until its
                # successor, which recovers them, counts them again.
                continue
            slot.set_counter(i, 0)
        if worker.role == "gateway" and self.addresses is not None:
            # So are its connections per address, which only it could count down.
            self.addresses.clear(worker.index)
        spec = self._spec(worker)
        worker.spec_title = spec.title
        worker.process = self.launcher.launch(spec, name=f"mpbroker-{spec.title}")
        worker.started_at = time.monotonic()
        worker.restart_at = None
        if worker.down_since is None:
            worker.down_since = worker.started_at

    def start_all(self) -> None:
        topology = self.layout.topology
        for g in range(self.layout.gateways):
            self.workers.append(_Worker("gateway", g))
        for p in range(topology.pipelines):
            role, _ = topology.role(p)
            self.workers.append(_Worker(role, p))
        for r in range(self.layout.replayers):
            self.workers.append(_Worker("replay", r))
        # Pipelines first: gateways and replay workers announce themselves to them on start.
        for worker in sorted(self.workers, key=lambda w: w.role in ("gateway", "replay")):
            try:
                self.start_worker(worker)
            except LauncherError as exc:
                raise StartupError(f"cannot start {worker.spec_title}: {exc}") from None

    def wait_ready(self) -> None:
        assert self.control is not None
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        said: list[_Worker] = []
        while True:
            if self.stop_requested():
                raise StartupError("stopped by a signal while starting")
            missing = [
                w
                for w in self.workers
                if self.control.slot(self._slot_index(w)).state != STATE_READY
            ]
            if not missing:
                return
            if missing != said:
                said = missing
                names = ", ".join(w.spec_title for w in missing)
                self.service.starting(f"waiting for {names}")
            for w in missing:
                if w.process is not None and not w.process.is_alive():
                    raise StartupError(
                        f"{w.spec_title} exited with code {w.process.exitcode} while starting "
                        "(see its log lines above)"
                    )
            if time.monotonic() > deadline:
                names = ", ".join(w.spec_title for w in missing)
                raise StartupError(f"workers not ready after {_STARTUP_TIMEOUT_S:.0f} s: {names}")
            time.sleep(0.02)

    def bind_admin(self) -> None:
        """Take the admin API's port, if configured: with the STOMP ports, before anything
        starts, so that a port in use ends the start with one line. It serves from
        `start_admin` on (it only reads shared memory: a thread is enough)."""
        admin = self.config.admin
        if admin.port < 0:
            return
        users_file = self.config.security.users_file
        try:
            # With a users file, only its group `admin` may read the API.
            users = load_users(Path(users_file)) if users_file else None
        except UsersFileError as exc:  # broken since serve() read it
            raise StartupError(str(exc), EXIT_REFUSED) from None
        try:
            self.admin = AdminServer(
                admin.host,
                admin.port,
                self.admin_status,
                allowed_names(admin.host, admin.host_names),
                users,
                admin.metrics_max_destinations,
            )
        except OSError as exc:
            raise StartupError(
                f"cannot serve the admin API on {admin.host}:{admin.port}: {exc.strerror}"
                + (_in_use_hint("admin.port") if exc.errno == errno.EADDRINUSE else "")
            ) from None

    def lock_data_dir(self) -> None:
        """Take the data dir (`DataDirLock`): with the ports, before anything starts, so
        that a second broker on the same data dir starts nothing (exit 1: once the other
        one stops, it may)."""
        try:
            self.data_lock = DataDirLock.acquire(Path(self.config.broker.data_dir))
        except DataDirError as exc:
            raise StartupError(str(exc)) from None

    def start_admin(self) -> None:
        """Serve the admin API bound by `bind_admin`, if any."""
        if self.admin is None:
            return
        self.admin.start()
        host, port = self.admin.address
        log.info("admin API on http://%s:%d (dashboard /, /status, /flow, /metrics)", host, port)

    def record_ports(self) -> None:
        """Record where this broker listens in its data dir, for `mpbroker admin` (removed
        by `cleanup`); a broker that cannot goes on, and says so."""
        import psutil

        admin = self.admin.address if self.admin is not None else (None, None)
        record = PortsRecord(
            pid=os.getpid(),
            started=psutil.Process().create_time(),
            host=self.config.broker.host,
            port=self.port,
            tls_port=self.tls_port if self.tls_holder is not None else None,
            ws_port=self.ws_port if self.ws_holder is not None else None,
            wss_port=self.wss_port if self.wss_holder is not None else None,
            admin_host=admin[0],
            admin_port=admin[1],
        )
        problem = write_ports(Path(self.config.broker.data_dir), record)
        if problem is not None:
            log.warning("%s: `mpbroker admin` needs --port to find this broker", problem)

    def admin_status(self) -> StatusView:
        assert self.control is not None
        refs: list[WorkerRef] = [
            (w.spec_title, w.role, w.index, self._slot_index(w)) for w in self.workers
        ]
        watch = self.memwatch
        memory = MemoryStatus(
            level=watch.level,
            used_bytes=watch.used,
            max_memory=watch.max_memory,
            percent=round(100 * watch.used / watch.max_memory, 1),
            levels=[
                MemoryLevel(level=i, percent=m.percent, gc_interval_ms=m.gc_interval_ms)
                for i, m in enumerate(watch.levels, start=1)
            ],
        )
        status = status_view(self.control, self.stats, refs, memory, self.process_memory)
        return msgspec.structs.replace(status, destinations=self._destinations_status(status))

    def _destinations_status(self, status: StatusView) -> DestinationsStatus:
        """Every pipeline's destinations (their slots' counters, read now) against
        broker.max_destinations, and the refusals they published."""
        assert self.control is not None
        count = sum(
            self.control.slot(self._slot_index(w)).counter(PIPELINE_DESTINATIONS)
            for w in self.workers
            if w.role in ("p2p", "pubsub")
        )
        refused = sum(
            w.stats.destinations_refused
            for w in status.workers
            if isinstance(w.stats, QueueWorkerStats | TopicWorkerStats)
        )
        limit = max_destinations(self.config)
        return DestinationsStatus(
            count=count,
            max_destinations=limit,
            per_destination_bytes=PER_DESTINATION_BYTES,
            budget_bytes=limit * PER_DESTINATION_BYTES,
            refused=refused,
        )

    # -- running -------------------------------------------------------------------------

    def stop_reason(self) -> str:
        """The signal that asked for the stop ("SIGTERM"), for the STOPPING status."""
        return self._signal_name or "asked to stop"

    def stop_requested(self) -> bool:
        """SIGTERM or SIGINT arrived (a method: signal handlers change it behind our back)."""
        return self._stop

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self._reload = True  # done by the loop, woken by the wake-up fd
            return
        self._signal_name = signal.Signals(signum).name
        self._stop = True

    def install_signals(self) -> None:
        self._wakeup_w.setblocking(False)
        signal.set_wakeup_fd(self._wakeup_w.fileno(), warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)

    def watch(self) -> None:
        """Restart workers that die, until a stop signal."""
        max_backoff = self.config.broker.restart_backoff_max_ms / 1000
        while not self.stop_requested():
            now = time.monotonic()
            timeouts = [w.restart_at - now for w in self.workers if w.restart_at is not None]
            timeout = max(0.0, min([0.5, self.service.next_due(now), *timeouts]))
            sentinels = [self._wakeup_r.fileno()]
            if self.launcher.sentinel is not None:
                sentinels.append(self.launcher.sentinel.fileno())
            sentinels += [w.process.sentinel for w in self.workers if w.process is not None]
            poller = select.poll()
            for fd in sentinels:
                poller.register(fd, select.POLLIN)
            ready = {fd for fd, _ in poller.poll(timeout * 1000)}
            if self._wakeup_r.fileno() in ready:
                with contextlib.suppress(BlockingIOError):
                    self._wakeup_r.recv(512)
            if self.stop_requested():
                break
            if self._reload:
                self._reload = False
                self.reload()
            now = time.monotonic()
            self.watch_launcher()
            self.watch_memory(now)
            self.kill_stalled()
            self.service.tick(now, self.figures(now))
            for worker in self.workers:
                process = worker.process
                if process is not None and not process.is_alive():
                    process.join()
                    process.close()
                    code = process.exitcode
                    if code is None:
                        how = "ended (exit code unknown: the fork server was gone)"
                    elif code < 0:
                        how = f"killed by signal {-code}"
                    else:
                        how = f"exited with code {code}"
                    lived = now - worker.started_at
                    if lived < _STABLE_AFTER_S:
                        worker.backoff_s = min(
                            max_backoff, max(_FIRST_BACKOFF_S, worker.backoff_s * 2)
                        )
                    else:
                        worker.backoff_s = 0.0
                    log.error(
                        "%s (pid %s) %s after %.1f s; restarting in %.1f s",
                        worker.spec_title,
                        process.pid,
                        how,
                        lived,
                        worker.backoff_s,
                    )
                    worker.process = None
                    worker.restart_at = now + worker.backoff_s
                if (
                    worker.process is None
                    and worker.restart_at is not None
                    and now >= worker.restart_at
                ):
                    worker.incarnation += 1
                    try:
                        self.start_worker(worker)
                    except LauncherError as exc:
                        # The fork server died meanwhile: watch_launcher starts another.
                        worker.backoff_s = min(
                            max_backoff, max(_FIRST_BACKOFF_S, worker.backoff_s * 2)
                        )
                        worker.restart_at = now + worker.backoff_s
                        log.error(
                            "cannot restart %s: %s; trying again in %.1f s",
                            worker.spec_title,
                            exc,
                            worker.backoff_s,
                        )
                        continue
                    log.info(
                        "%s restarted (pid %s, incarnation %d)",
                        worker.spec_title,
                        worker.process.pid if worker.process else "?",
                        worker.incarnation,
                    )

    def figures(self, now: float) -> BrokerFigures:
        """What systemd's STATUS line and watchdog are told of the broker now (cheap: the
        control block's slots)."""
        assert self.control is not None
        now_ms = monotonic_ms()
        beats = []
        counters: dict[str, Counters] = {}
        connections = 0
        for worker in self.workers:
            slot = self.control.slot(self._slot_index(worker))
            process = worker.process
            ready = slot.state == STATE_READY and process is not None and process.is_alive()
            if ready:
                worker.down_since = None
                worker.after_stall = False
            elif worker.down_since is None:
                worker.down_since = now
            down_ms = 0 if worker.down_since is None else int((now - worker.down_since) * 1000)
            age = now_ms - slot.heartbeat_ms if slot.heartbeat_ms else None
            beats.append(WorkerBeat(worker.spec_title, ready, age, down_ms, worker.after_stall))
            if worker.role == "gateway":
                connections += slot.counter(GATEWAY_CONNECTIONS)
            elif worker.role in ("p2p", "pubsub"):
                counters[worker.spec_title] = Counters(
                    worker.incarnation,
                    slot.counter(PIPELINE_RECEIVED),
                    slot.counter(PIPELINE_DELIVERED),
                )
        watch = self.memwatch
        return BrokerFigures(
            connections=connections,
            counters=counters,
            memory_used=watch.used,
            max_memory=watch.max_memory,
            memory_level=watch.level,
            beats=beats,
            restarts=sum(w.incarnation for w in self.workers),
        )

    def watch_launcher(self) -> None:
        """A dead fork server: start another. Its workers die with it (each gets SIGTERM)
        and are restarted through the new one as the watch loop finds them dead."""
        if self.launcher.running():
            return
        pid = self.launcher.pid
        code = self.launcher.reap()
        log.error("the fork server (pid %s) exited with code %s; starting another", pid, code)
        try:
            self.launcher.start()
        except OSError as exc:
            log.error("cannot start the fork server: %s", exc)

    def watch_memory(self, now: float) -> None:
        """MemWatch: measure, publish the level for the workers, log what changed."""
        interval = self.config.memory.memwatch_interval_ms / 1000
        if not interval or now < self.next_memwatch or self.control is None:
            return
        self.next_memwatch = now + interval
        reading = broker_memory(self.instance)
        self.process_memory = reading.processes
        note = self.memwatch.update(reading.total)
        self.control.memwatch_level = self.memwatch.level
        self.control.memwatch_permille = reading.total * 1000 // self.memwatch.max_memory
        if note is not None:
            if self.memwatch.level:
                log.warning("%s", note)
            else:
                log.info("%s", note)

    def reload(self) -> None:
        """SIGHUP: read the configuration again and hand its flow settings to the workers
        (connections stay open). Settings that need a restart are named in the log."""
        self.service.reloading()
        try:
            self._reload_settings()
        finally:
            # Serving on, with the new settings or (after an error, logged) the old ones.
            now = time.monotonic()
            self.service.ready(now, self.figures(now))

    def _reload_settings(self) -> None:
        if self.reload_source is None:
            log.warning("SIGHUP: the broker was started without --config: nothing to reload")
            return
        try:
            effective, ignored = reload_flow_settings(self.config, self.reload_source())
        except (ConfigError, OSError) as exc:  # a bad value; the file gone or unreadable
            log.error("SIGHUP: configuration not reloaded: %s", exc)
            return
        users_file = effective.security.users_file
        users = None
        if users_file:
            # The gateways read it again when the generation changes: it must be good.
            try:
                users = load_users(Path(users_file))
            except UsersFileError as exc:
                log.error("SIGHUP: configuration not reloaded: %s", exc)
                return
            warn_unknown_names(effective, users)
        # The reloaded limits (the VolQueueStore's, the live buffer's) are memory budgets.
        problem = check(effective)
        if problem is not None:
            log.error("SIGHUP: configuration not reloaded: %s", problem)
            return
        if ignored:
            log.warning(
                "SIGHUP: %s changed: takes effect after a restart", ", ".join(sorted(ignored))
            )
        path = reloaded_config(self.config, self.instance)
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_bytes(pickle.dumps(effective))
            os.replace(tmp, path)
        except OSError as exc:  # a full disk: the workers keep the settings they have
            log.error("SIGHUP: configuration not reloaded: cannot write %s: %s", path, exc)
            tmp.unlink(missing_ok=True)
            return
        self.config = effective  # restarted workers start with it too
        assert self.control is not None
        self.control.config_generation += 1
        if self.admin is not None and users is not None:
            # Along with the gateways: the admin API checks the users read just now.
            self.admin.use_users(users)
        log.info("SIGHUP: flow settings reloaded (generation %d)", self.control.config_generation)

    def kill_stalled(self) -> None:
        """Kill ready workers whose heartbeat stopped; the watch loop then restarts them."""
        assert self.control is not None
        limit = self.config.broker.worker_stall_timeout_ms
        if not limit:
            return
        now = monotonic_ms()
        for worker in self.workers:
            process = worker.process
            if process is None or not process.is_alive():
                continue
            slot = self.control.slot(self._slot_index(worker))
            if slot.state != STATE_READY:
                continue
            silent = now - slot.heartbeat_ms
            if silent > limit:
                log.error(
                    "%s (pid %s) stalled: no heartbeat for %d ms (worker_stall_timeout_ms %d); "
                    "killing it",
                    worker.spec_title,
                    process.pid,
                    silent,
                    limit,
                )
                worker.after_stall = True
                process.kill()
                process.join(5)

    # -- stopping ------------------------------------------------------------------------

    def stop_workers(self) -> None:
        """Gateways first (they tell their clients), then pipelines; kill what hangs."""
        timeout = self.config.broker.shutdown_timeout_ms / 1000
        for group in ("gateway", "pipeline"):
            procs = [
                w.process
                for w in self.workers
                if w.process is not None and (w.role == "gateway") == (group == "gateway")
            ]
            for p in procs:
                if p.is_alive():
                    p.terminate()
            deadline = time.monotonic() + timeout
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
                if p.is_alive():
                    log.warning("%s did not stop in %.1f s: killing it", p.name, timeout)
                    p.kill()
                    p.join()
                p.close()
        # Every worker is gone: the fork server ends when its socket closes.
        self.launcher.close()

    def cleanup(self) -> None:
        # First: while it is there, `mpbroker admin` takes the broker for running.
        remove_ports(Path(self.config.broker.data_dir), os.getpid())
        if self.admin is not None:
            self.admin.close()
        for block in self.stats.values():
            block.close()
            block.unlink()
        for ring in self.rings:
            ring.close()
            ring.unlink()
        if self.control is not None:
            self.control.close()
            self.control.unlink()
        if self.addresses is not None:
            self.addresses.close()
            self.addresses.unlink()
        reloaded_config(self.config, self.instance).unlink(missing_ok=True)
        if self.data_lock is not None:
            self.data_lock.release()
        if self.instance_lock is not None:
            # Anything of this instance left behind (e.g. by a worker) goes too, then the
            # lock. (Without the lock we created nothing, and the instance is not ours.)
            remove_instance(self.instance)
            self.instance_lock.release()
        if self.port_holder is not None:
            self.port_holder.close()
        for holder in (self.tls_holder, self.ws_holder, self.wss_holder):
            if holder is not None:
                holder.close()
        signal.set_wakeup_fd(-1)
        self._wakeup_r.close()
        self._wakeup_w.close()


def warn_unknown_names(config: Config, users: Mapping[str, User]) -> None:
    """A [[security.acl]] name no user is (or group no user is in) grants nothing: said
    once, at start and on SIGHUP, since a typo would otherwise deny in silence."""
    unknown = unknown_names(config.acl, users)
    if unknown:
        log.warning(
            "security.acl names what the users file does not have (it grants nothing): %s",
            ", ".join(unknown),
        )


# Command-line options of the settings of ports, for the way out of a port in use.
_PORT_OPTIONS = {"broker.port": "--port", "admin.port": "--admin-port"}


def _in_use_hint(setting: str) -> str:
    """What to add to "Address already in use" for the port of `setting`: how to pick
    another."""
    option = _PORT_OPTIONS.get(setting)
    if option is None:
        way = f"set {setting} to another port, or to 0 for a free one"
    else:
        way = f"pick another with {option} N, or {option} 0 for a free one"
    if setting == "admin.port":
        way += "; --admin-port -1 turns the admin API off"
    return f" (another broker?); {way}"


def _reserve(host: str, port: int, setting: str) -> tuple[socket.socket, int]:
    """A socket bound to `port` (0: a free one) with SO_REUSEPORT, and the port; StartupError
    naming the address (and `setting`, but for broker.port) if it is taken, and how to
    pick another port."""
    what = "" if setting == "broker.port" else f" ({setting})"

    def refused(exc: OSError) -> StartupError:
        hint = _in_use_hint(setting) if exc.errno == errno.EADDRINUSE else ""
        return StartupError(f"cannot listen on {host}:{port}{what}: {exc.strerror}{hint}")

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # First a plain bind (no SO_REUSEPORT): it fails if anything listens there, even
    # another broker whose SO_REUSEPORT group would otherwise silently share our port.
    probe = socket.socket(family, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind((host, port))
        port = probe.getsockname()[1]
    except OSError as exc:
        raise refused(exc) from None
    finally:
        probe.close()
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise refused(exc) from None
    return sock, port


def serve(config: Config, reload_source: Callable[[], Config] | None = None) -> int:
    """Run the broker in the foreground until SIGTERM/SIGINT; returns the exit code (0, or
    `EXIT_REFUSED` or `EXIT_FAILED` when it did not start: the reason is logged in one
    line).

    A config whose theoretical maximum exceeds memory.max_memory is refused before anything
    starts: ConfigError naming the modules, their totals and the excess. So is one whose
    p2p or pubsub worker count differs from the data dir's (`datadir.PartitionMismatch`).
    Every count must be resolved (`mpbroker.memory.fit_workers`): 0 is refused here.
    """
    # Everything the broker creates (stores, the registry, the records of the data dir,
    # what SIGHUP leaves for the workers) is its own alone, whatever umask it was given.
    os.umask(0o077)
    broker = config.broker
    for key, value in (
        ("broker.gateways", broker.gateways),
        ("broker.p2p_workers", broker.p2p_workers),
        ("broker.pubsub_workers", broker.pubsub_workers),
        ("replay.workers", config.replay.workers),
    ):
        if not value:
            raise ConfigError(key, value, "resolve it first (mpbroker.memory.fit_workers)")
    require_fits(config)
    data_dir = Path(broker.data_dir)
    topology = Topology(broker.p2p_workers, broker.pubsub_workers, config.queues.dead_letter_prefix)
    try:
        check_data_dir(data_dir)
        record = read_partitions(data_dir)
        tightened = owner_only(data_dir)
    except DataDirError as exc:
        log.error("cannot start: %s", exc)
        return EXIT_REFUSED
    except OSError as exc:  # an entry that is not ours
        log.error("cannot start: data dir %s: cannot make it owner-only (%s)", data_dir, exc)
        return EXIT_REFUSED
    if tightened:
        log.warning(
            "data dir %s: took group and other permissions off %d entries (it holds every "
            "stored message: owner only)",
            data_dir,
            tightened,
        )
    if record is not None:
        record.check(topology)
    if config.security.users_file:
        try:
            warn_unknown_names(config, load_users(Path(config.security.users_file)))
        except UsersFileError as exc:
            log.error("cannot start: %s", exc)
            return EXIT_REFUSED
    if config.stomp.tls_port >= 0 or config.stomp.wss_port >= 0:
        # Loaded here to be refused before anything starts; each gateway loads them again.
        try:
            server_context(config.stomp)
        except ConfigError as exc:
            log.error("cannot start: %s", exc)
            return EXIT_REFUSED
    try:
        supervisor = Supervisor(config, reload_source)
    except StartupError as exc:
        log.error("cannot start: %s", exc)
        return exc.exit_code
    supervisor.install_signals()
    started = False
    try:
        # The ports first: a broker that cannot have them starts nothing.
        supervisor.reserve_port()
        supervisor.bind_admin()
        supervisor.lock_data_dir()
        started = True
        supervisor.start_launcher()
        supervisor.create_segments()
        problem = write_partitions(data_dir, topology)
        if problem is not None:
            log.warning("%s: the next start reads them from the store directories", problem)
        supervisor.service.starting(f"starting {supervisor.layout.workers} workers")
        supervisor.start_all()
        supervisor.wait_ready()
        supervisor.start_admin()
        if supervisor.tls_holder is not None:
            log.info("STOMP over TLS on %s:%d", broker.host, supervisor.tls_port)
        # As a URL: an IPv6 address in brackets.
        url_host = f"[{broker.host}]" if ":" in broker.host else broker.host
        if supervisor.ws_holder is not None:
            log.info("STOMP over WebSocket on ws://%s:%d/ws", url_host, supervisor.ws_port)
        if supervisor.wss_holder is not None:
            log.info("STOMP over WebSocket on wss://%s:%d/ws", url_host, supervisor.wss_port)
        log.info("running %s", native.describe())
        supervisor.record_ports()
        log.info("mpbroker ready on %s:%d", broker.host, supervisor.port)
        now = time.monotonic()
        supervisor.watch_memory(now)  # READY's status line shows the memory in use
        supervisor.service.ready(now, supervisor.figures(now))
        supervisor.watch()
        supervisor.service.stopping(supervisor.stop_reason())
        log.info("stopping")
        return 0
    except StartupError as exc:
        if supervisor.stop_requested():
            supervisor.service.stopping(supervisor.stop_reason())
            return 0
        supervisor.service.failed(str(exc))
        log.error("cannot start: %s", exc)
        return exc.exit_code
    finally:
        supervisor.stop_workers()
        supervisor.cleanup()
        if started:
            log.info("stopped")
