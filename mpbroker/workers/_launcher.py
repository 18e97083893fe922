"""The fork server every worker process is forked from, and the supervisor's handle on it.

A worker started with multiprocessing's "spawn" is a fresh interpreter that imports all it
needs again: about 19 MiB of private memory per worker. The fork server, started once by the
supervisor, imports the worker modules once (`PRELOAD`), moves everything it holds out of
the garbage collector's reach (`gc.freeze()`, so that collections in the workers do not write
to the shared objects) and then forks each worker from itself: the workers share those pages
with it and with each other until they write to them.

The server is a fresh interpreter, exec'd by the supervisor (which runs threads, so it never
forks itself), single-threaded, and starts nothing else: in particular no multiprocessing
resource tracker (the broker's shared memory is posix_ipc, cleaned up by the supervisor).

Deaths: the tree is supervisor -> fork server -> workers. The server asks Linux for SIGKILL
when the supervisor dies (PR_SET_PDEATHSIG) and exits when its socket to the supervisor
closes; each worker asks for SIGTERM when the server dies (`_bootstrap.worker_entry`). So a
kill -9 of the supervisor takes the server and then every worker down. If the server alone
dies, its workers stop and the supervisor starts a new server and restarts them.

Protocol, on a SOCK_SEQPACKET socket pair: the supervisor sends the size of a pickled
`WorkerSpec` with one file descriptor, the write end of the worker's status pipe, then the
pickle in messages of at most `_CHUNK` bytes; the server forks and replies with the worker's
pid and a pidfd for it (so that the supervisor can wait
for and signal a process that is not its child, without pid-reuse races); when it has reaped
the worker it writes the exit code (as multiprocessing reports it: -N for signal N) to the
status pipe and closes it.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import gc
import importlib
import logging
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
from subprocess import _args_from_interpreter_flags  # type: ignore[attr-defined]
from types import FrameType
from typing import NoReturn

from ._layout import WorkerSpec

__all__ = ["PRELOAD", "Launcher", "LauncherError", "WorkerProcess"]

log = logging.getLogger("mpbroker.launcher")

#: What the server imports before it forks: what every worker needs (and what a worker
#: imports later it imports on its own, into private memory).
PRELOAD = (
    "mpbroker.workers._bootstrap",
    "mpbroker.workers.gateway",
    "mpbroker.workers.pipeline",
    "mpbroker.workers.replay",
    "mpbroker.logs",
    "setproctitle",
)

# Container allocations between two automatic collections in a worker (see main).
_GC_GEN0_THRESHOLD = 20_000
_TITLE = "mpbroker: forkserver"
_REQUEST = struct.Struct("=Q")  # the size of the pickled WorkerSpec that follows
_CHUNK = 32 * 1024  # small reads: no big buffer left behind in the server's heap
_REPLY = struct.Struct("=i")  # the worker's pid, or -errno if the fork failed
_STATUS = struct.Struct("=i")  # the worker's exit code
# How long the server may take to answer (its first answer waits for PRELOAD's imports).
_REPLY_TIMEOUT_S = 60.0
# Between a worker's pidfd turning readable and its exit code arriving from the server.
_STATUS_TIMEOUT_S = 5.0
_STOP_TIMEOUT_S = 5.0


class LauncherError(RuntimeError):
    """The fork server is gone or could not start a worker; the message says why."""


def _readable(fd: int, timeout: float | None) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000))))


# -- the supervisor's side ------------------------------------------------------------------


class WorkerProcess:
    """A worker forked by the fork server: what the supervisor needs of a process handle
    (the names of `multiprocessing.Process`: pid, name, sentinel, is_alive, join, exitcode,
    terminate, kill, close)."""

    def __init__(self, pid: int, name: str, status_fd: int, pidfd: int | None) -> None:
        self.pid = pid
        self.name = name
        self._status_fd = status_fd
        self._pidfd = pidfd
        self._ended = False
        self.exitcode: int | None = None

    @property
    def sentinel(self) -> int:
        """Readable once the worker has ended (a pidfd; without one, its status pipe)."""
        return self._pidfd if self._pidfd is not None else self._status_fd

    def is_alive(self) -> bool:
        if self._ended:
            return False
        if _readable(self.sentinel, 0):
            self._collect()
            return False
        return True

    def join(self, timeout: float | None = None) -> None:
        if not self._ended and _readable(self.sentinel, timeout):
            self._collect()

    def _collect(self) -> None:
        """The worker has ended: read its exit code (None if the server died first)."""
        self._ended = True
        if _readable(self._status_fd, _STATUS_TIMEOUT_S):
            with contextlib.suppress(OSError):
                data = os.read(self._status_fd, _STATUS.size)
                if len(data) == _STATUS.size:
                    (self.exitcode,) = _STATUS.unpack(data)

    def _signal(self, signum: int) -> None:
        if self._ended:
            return
        with contextlib.suppress(ProcessLookupError):
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signum)
            else:
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def close(self) -> None:
        """Release the handle's file descriptors (the supervisor is done with the worker)."""
        for fd in (self._status_fd, self._pidfd):
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._status_fd = -1
        self._pidfd = None
        self._ended = True


class Launcher:
    """The supervisor's handle on its fork server."""

    def __init__(self, log_level: str = "info", log_format: str = "auto") -> None:
        self.log_level = log_level
        self.log_format = log_format
        self.process: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def sentinel(self) -> socket.socket | None:
        """Readable when the server has gone: it only writes in answer to `launch`, which
        reads the answer, so anything else to read is the end of the stream."""
        return self.sock

    def start(self) -> None:
        """Start the server (it imports `PRELOAD` while the caller goes on).

        Call it from the main thread: the server dies with the thread that started it.
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # The same interpreter, flags (-X, -W, ...) and import path as ours, as "spawn" did.
        code = f"import sys; sys.path[:] = {sys.path!r}; "
        code += "from mpbroker.workers._launcher import main; main()"
        command = [
            sys.executable,
            *_args_from_interpreter_flags(),
            "-c",
            code,
            str(theirs.fileno()),
            str(os.getpid()),
            self.log_level,
            self.log_format,
        ]
        try:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, pass_fds=[theirs.fileno()]
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours

    def running(self) -> bool:
        return (
            self.process is not None
            and self.process.poll() is None
            and self.sock is not None
            and not _readable(self.sock.fileno(), 0)
        )

    def launch(self, spec: WorkerSpec, name: str) -> WorkerProcess:
        """Fork a worker running `worker_entry(spec)`; LauncherError if the server is gone."""
        if self.sock is None:
            raise LauncherError("the fork server is not running")
        status_r, status_w = os.pipe()
        try:
            payload = pickle.dumps(spec)
            try:
                socket.send_fds(self.sock, [_REQUEST.pack(len(payload))], [status_w])
                for at in range(0, len(payload), _CHUNK):
                    self.sock.sendall(payload[at : at + _CHUNK])
            except OSError as exc:
                raise LauncherError(f"the fork server is gone ({exc.strerror})") from None
            finally:
                os.close(status_w)
            if not _readable(self.sock.fileno(), _REPLY_TIMEOUT_S):
                raise LauncherError(f"the fork server did not answer in {_REPLY_TIMEOUT_S:.0f} s")
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, _REPLY.size, 1)
            except OSError as exc:
                raise LauncherError(f"the fork server is gone ({exc.strerror})") from None
            if len(data) != _REPLY.size:
                for fd in fds:
                    os.close(fd)
                raise LauncherError("the fork server is gone")
            (pid,) = _REPLY.unpack(data)
            if pid < 0:
                raise LauncherError(f"the fork server could not fork: {os.strerror(-pid)}")
        except BaseException:
            os.close(status_r)
            raise
        return WorkerProcess(pid, name, status_r, fds[0] if fds else None)

    def reap(self) -> int | None:
        """After the server died: collect it; returns its exit code."""
        code = None
        if self.process is not None:
            try:
                code = self.process.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                code = self.process.wait()
        if self.sock is not None:
            self.sock.close()
        self.process = None
        self.sock = None
        return code

    def close(self) -> None:
        """Stop the server: closing its socket ends it (it holds no state)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.process is not None:
            try:
                self.process.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


# -- the server's side ----------------------------------------------------------------------


def _on_sigchld(signum: int, frame: FrameType | None) -> None:
    """Nothing: the byte on the wake-up fd wakes the loop, which reaps."""


class _Server:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        # pid -> the write end of its status pipe
        self.children: dict[int, int] = {}
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def run(self) -> None:
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, _on_sigchld)
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            events = dict(poller.poll())
            if self.wake_r in events:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self.wake_r, 512):
                        pass
            self.reap()
            if self.sock.fileno() in events:
                request = self.receive()
                if request is None:
                    return  # the supervisor closed its end, or died
                if request:
                    self.fork(*request)

    def receive(self) -> tuple[bytes, int] | tuple[()] | None:
        """The next request: (pickled spec, status pipe); () if malformed; None at the end."""
        try:
            head, fds, flags, _addr = socket.recv_fds(self.sock, _REQUEST.size, 1)
            if len(head) != _REQUEST.size or len(fds) != 1 or flags & socket.MSG_TRUNC:
                for fd in fds:
                    os.close(fd)
                if not head:
                    return None
                log.error("malformed request (%d bytes, %d fds): ignored", len(head), len(fds))
                self._reply(-errno.EINVAL)
                return ()
            (size,) = _REQUEST.unpack(head)
            chunks: list[bytes] = []
            while size > 0:
                chunk = self.sock.recv(min(size, _CHUNK))
                if not chunk:
                    os.close(fds[0])
                    return None
                chunks.append(chunk)
                size -= len(chunk)
        except ConnectionResetError:
            return None
        return b"".join(chunks), fds[0]

    def _reply(self, pid: int, pidfd: int | None = None) -> None:
        with contextlib.suppress(OSError):
            socket.send_fds(self.sock, [_REPLY.pack(pid)], [pidfd] if pidfd is not None else [])

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd = self.children.pop(pid, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.write(fd, _STATUS.pack(os.waitstatus_to_exitcode(status)))
                os.close(fd)

    def fork(self, payload: bytes, status_fd: int) -> None:
        me = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(status_fd)
            log.error("cannot fork a worker: %s", exc.strerror)
            self._reply(-(exc.errno or errno.EAGAIN))
            return
        if pid == 0:
            self.child(payload, status_fd, me)
        pidfd: int | None = None
        with contextlib.suppress(OSError, AttributeError):  # Linux 5.3+
            pidfd = os.pidfd_open(pid)
        self.children[pid] = status_fd
        self._reply(pid, pidfd)
        if pidfd is not None:
            os.close(pidfd)

    def child(self, payload: bytes, status_fd: int, parent: int) -> NoReturn:
        """In the forked worker: drop the server's state, run the worker, exit."""
        code: int = 1
        try:
            signal.set_wakeup_fd(-1)
            for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
                signal.signal(signum, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self.sock.close()
            for fd in (self.wake_r, self.wake_w, status_fd, *self.children.values()):
                os.close(fd)
            self.children.clear()
            spec = pickle.loads(payload)
            # Here, not at the top: the supervisor imports this module too, and must not
            # import every worker's modules (the fork server has them from PRELOAD).
            from ._bootstrap import worker_entry

            worker_entry(spec, parent)
            code = 0
        except SystemExit as exc:
            status = exc.code
            if status is None:
                code = 0
            elif isinstance(status, int):
                code = status
            else:
                print(status, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(BaseException):
                atexit._run_exitfuncs()
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)


def main() -> None:
    """The server process: `python -c '...main()' SOCKET_FD SUPERVISOR_PID LOG_LEVEL
    LOG_FORMAT`."""
    from setproctitle import setproctitle

    from mpbroker.logs import setup_logging

    from ._parent import die_with_parent

    sock_fd, supervisor = int(sys.argv[1]), int(sys.argv[2])
    log_level, log_format = sys.argv[3], sys.argv[4]
    die_with_parent(signal.SIGKILL)
    if os.getppid() != supervisor:
        os._exit(1)  # the supervisor died while starting us
    # Ctrl-C reaches the whole process group: the supervisor stops the workers, then us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    setproctitle(_TITLE)
    setup_logging("forkserver", log_level, log_format)
    sock = socket.socket(fileno=sock_fd)
    started = time.monotonic()
    for name in PRELOAD:
        importlib.import_module(name)
    # Everything imported so far lives as long as the server: out of the collector's way, so
    # that the workers' collections do not write to (and so copy) the pages they share.
    gc.collect()
    gc.freeze()
    # A collection every 20,000 container objects allocated (CPython's default is 700),
    # so that the cycle collector does not walk the young objects of every few dozen
    # messages: a worker's messages are freed by reference counting, not by it. Measured
    # with bench.compare: 6 % less CPU per delivery for a queue, 12 % for a topic
    # (docs/benchmarks.md); MemWatch's collections (LevelGC) are unchanged.
    gc.set_threshold(_GC_GEN0_THRESHOLD, 10, 10)
    log.debug("preloaded %d modules in %.2f s", len(sys.modules), time.monotonic() - started)
    _Server(sock).run()
