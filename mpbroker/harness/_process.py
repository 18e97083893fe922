"""A server in a child process: the broker (``mpbroker serve``) or the baseline forwarder.

Each says ``... ready on HOST:PORT`` on stderr once it accepts connections. A thread drains
stderr from the start, so a chatty server never blocks on a full pipe; it keeps every line,
for :meth:`ServerProcess.wait_for_log` and to explain a failure.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

import psutil

from mpbroker.shm import SHM_DIR

#: How long a server may take to say it is ready; the broker starts several processes.
START_TIMEOUT_S = 60.0
#: How long a server may take to exit after SIGTERM (the broker drains its clients).
STOP_TIMEOUT_S = 30.0
#: Set (to anything) to copy every line the servers write to stderr to our stderr.
ECHO_ENV = "MPBROKER_TEST_ECHO"
_TAIL_LINES = 40


class ServerError(RuntimeError):
    """A server did not start, or did not stop cleanly; the message says which and why."""


def broker_command(
    data_dir: str | os.PathLike[str],
    *args: str,
    config_path: str | os.PathLike[str] | None = None,
    admin: bool = True,
) -> list[str]:
    """``mpbroker serve`` on a free loopback port, with ``args`` last. ``admin``: serve the
    admin API on a free port too (else none)."""
    command = [sys.executable, "-m", "mpbroker", "serve", "--port", "0"]
    command += ["--admin-port", "0" if admin else "-1", "--data-dir", str(data_dir)]
    if config_path is not None:
        command += ["--config", str(config_path)]
    return command + list(args)


def baseline_command(host: str = "127.0.0.1") -> list[str]:
    """The baseline forwarder (:mod:`mpbroker.loadgen.baseline`) on a free port."""
    return [sys.executable, "-m", "mpbroker.loadgen.baseline", "--host", host, "--port", "0"]


class ServerProcess:
    """A server child process that logs ``ready on HOST:PORT`` on stderr when it serves.

    Nothing runs until :meth:`start` (which returns the object); as a context manager it
    starts on entry and on exit stops with :meth:`stop_checked` (or, when the block failed,
    just stops). ``name`` appears in messages. ``temp_dir``, if given, is removed once the
    server stopped. ``on_line``, if set before :meth:`start`, is called with every line the
    server writes to stderr, from the thread that drains it. ``env``: variables added to
    the server's environment (``NOTIFY_SOCKET``, say).
    """

    READY: ClassVar[re.Pattern[str]] = re.compile(r"ready on (\S+):(\d+)")

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        *,
        temp_dir: str | os.PathLike[str] | None = None,
        on_line: Callable[[str], None] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.env = dict(env or {})
        self.command = list(command)
        self.temp_dir = None if temp_dir is None else Path(temp_dir)
        self.on_line = on_line
        self.process: subprocess.Popen[str] | None = None
        self.host = ""
        self.port = 0
        #: Every line of stderr so far, without its newline.
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader: threading.Thread | None = None

    @classmethod
    def baseline(cls, host: str = "127.0.0.1") -> ServerProcess:
        """The baseline forwarder, not started yet."""
        return cls("baseline", baseline_command(host))

    @property
    def pid(self) -> int:
        if self.process is None:
            raise ServerError(f"{self.name} was not started")
        return self.process.pid

    def start(self, timeout: float = START_TIMEOUT_S) -> Self:
        """Start the server and wait until it says it is ready; :class:`ServerError` (after
        stopping it) if it does not within ``timeout`` seconds, or exits first."""
        if self.process is not None:
            raise ServerError(f"{self.name} was started already")
        self.process = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **self.env} if self.env else None,
        )
        self._reader = threading.Thread(target=self._drain, name=f"{self.name}-stderr", daemon=True)
        self._reader.start()
        match = self._wait_for(self.READY, timeout, 0)
        if match is None:
            status = self.process.poll()
            if status is None and not self._reader.is_alive():
                # stderr ended, so it is exiting: give it a moment for its status.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    status = self.process.wait(5)
            if status is None:
                problem = f"did not say it was ready within {timeout:g} s"
            else:
                problem = f"exited with status {status} before it was ready"
            with contextlib.suppress(ServerError):
                self.stop(timeout=5.0)
            raise ServerError(f"{self.name} {problem}; its last lines:\n{self.tail()}")
        self.host = match.group(1)
        self.port = int(match.group(2))
        return self

    def _drain(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        echo = bool(os.environ.get(ECHO_ENV))
        for line in self.process.stderr:
            if self.on_line is not None:
                self.on_line(line)
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
            if echo:
                sys.stderr.write(line)
        with self._changed:
            self._changed.notify_all()

    def _wait_for(self, regex: re.Pattern[str], timeout: float, start: int) -> re.Match[str] | None:
        """First line from index ``start`` that ``regex`` finds; None after ``timeout``
        seconds, or once stderr ended."""
        deadline = time.monotonic() + timeout
        seen = start
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    if match := regex.search(line):
                        return match
                seen = len(self.lines)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._reader is None or not self._reader.is_alive():
                    return None
                self._changed.wait(min(remaining, 0.2))

    def wait_for_log(
        self, pattern: str | re.Pattern[str], timeout: float = 10.0, start: int = 0
    ) -> re.Match[str]:
        """First log line (from index ``start``) matching ``pattern``, waiting up to
        ``timeout`` seconds for it; AssertionError with the last lines if none comes."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        match = self._wait_for(regex, timeout, start)
        if match is None:
            raise AssertionError(
                f"no log line of {self.name} matching {regex.pattern!r}; log:\n{self.tail()}"
            )
        return match

    def log_text(self) -> str:
        """Every line of stderr so far."""
        with self._changed:
            return "\n".join(self.lines)

    def tail(self) -> str:
        """The last lines of stderr, indented, to explain a failure."""
        with self._changed:
            last = self.lines[-_TAIL_LINES:]
        return "\n".join(f"  {line}" for line in last) or "  (nothing)"

    def processes(self) -> list[psutil.Process]:
        """The server, then every process under it, by pid (none once it exited)."""
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM and wait; the exit status (None if it never started). If it does not
        exit within ``timeout`` seconds: kill -9 it and all under it, and ServerError."""
        process = self.process
        try:
            if process is None:
                return None
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.kill()
                    raise ServerError(
                        f"{self.name} (pid {process.pid}) ignored SIGTERM for {timeout:g} s "
                        f"and was killed; its last lines:\n{self.tail()}"
                    ) from None
            self._close_pipe()
            return process.returncode
        finally:
            if self.temp_dir is not None:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
                self.temp_dir = None

    def stop_checked(self) -> None:
        """Stop; :class:`ServerError` unless the server exited with status 0."""
        status = self.stop()
        if status not in (0, None):
            raise ServerError(
                f"{self.name} exited with status {status} after SIGTERM; its last lines:\n"
                f"{self.tail()}"
            )

    def kill(self) -> None:
        """kill -9 the server and every process under it (what a crash or an OOM kill
        does), and reap them. Keeps ``temp_dir``: a test may start again on its data."""
        process = self.process
        if process is None:
            return
        # Once it was reaped, its pid may be someone else's: look for its tree only before.
        doomed = self.processes() if process.poll() is None else []
        for proc in doomed:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        process.wait(10)
        psutil.wait_procs(doomed[1:], timeout=10)
        self._close_pipe()

    def _close_pipe(self) -> None:
        """Join the stderr reader and close the pipe (left open if a process that inherited
        it still runs, so the reader is not cut off mid-line)."""
        reader = self._reader
        if reader is not None:
            reader.join(5)
        stderr = self.process.stderr if self.process is not None else None
        if stderr is not None and (reader is None or not reader.is_alive()):
            stderr.close()

    def __enter__(self) -> Self:
        if self.process is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.stop_checked()
        else:
            # Already failing: clean up, but report the first problem, not this one.
            with contextlib.suppress(ServerError):
                self.stop()


class BrokerProcess(ServerProcess):
    """``mpbroker serve`` on free loopback ports, ``args`` passed on (``"--log-level", "debug"``).

    ``gateways``: that many gateway processes (None: the broker's default). ``data_dir`` None: a temporary directory, removed once the broker stopped. ``config``:
    TOML text, written next to the data directory (``<data_dir>.toml``) and passed with
    ``--config``. ``admin``: serve the admin API on a free port (:attr:`admin_port`). A
    config with ``[stomp] tls_port = 0`` (and its files) listens for STOMP over TLS on a
    free port too (:attr:`tls_port`); ``ws_port = 0`` and ``wss_port = 0``, STOMP over
    WebSocket (:attr:`ws_port`, :attr:`wss_port`).
    :meth:`stop_checked`, and so the context manager, also checks that the broker left
    nothing in /dev/shm.
    """

    READY: ClassVar[re.Pattern[str]] = re.compile(r"mpbroker ready on (\S+):(\d+)")
    _ADMIN: ClassVar[re.Pattern[str]] = re.compile(r"admin API on http://(\S+):(\d+)")
    _TLS: ClassVar[re.Pattern[str]] = re.compile(r"STOMP over TLS on (\S+):(\d+)")
    _WS: ClassVar[re.Pattern[str]] = re.compile(r"STOMP over WebSocket on ws://(\S+):(\d+)/")
    _WSS: ClassVar[re.Pattern[str]] = re.compile(r"STOMP over WebSocket on wss://(\S+):(\d+)/")

    def __init__(
        self,
        *args: str,
        gateways: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        config: str | None = None,
        admin: bool = True,
        on_line: Callable[[str], None] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        temp_dir = None
        if data_dir is None:
            temp_dir = Path(tempfile.mkdtemp(prefix="mpbroker-harness-"))
            data_dir = temp_dir / "data"
        self.data_dir = Path(data_dir)
        config_path = None
        if config is not None:
            config_path = self.data_dir.parent / f"{self.data_dir.name}.toml"
            config_path.write_text(config, encoding="utf-8")
        if gateways is not None:
            args = ("--gateways", str(gateways), *args)
        command = broker_command(self.data_dir, *args, config_path=config_path, admin=admin)
        super().__init__("mpbroker", command, temp_dir=temp_dir, on_line=on_line, env=env)
        #: The admin API's address ``http://HOST:PORT`` and port, once started (None, 0: none).
        self.admin_url: str | None = None
        self.admin_port = 0
        #: The STOMP over TLS port, once started (0: none).
        self.tls_port = 0
        #: The STOMP over WebSocket ports, plain and over TLS, once started (0: none).
        self.ws_port = 0
        self.wss_port = 0

    def start(self, timeout: float = START_TIMEOUT_S) -> Self:
        super().start(timeout)
        # The broker logs the admin API's address before it says it is ready.
        if admin := self._wait_for(self._ADMIN, 0, 0):
            self.admin_url = f"http://{admin.group(1)}:{admin.group(2)}"
            self.admin_port = int(admin.group(2))
        # So is the TLS listener's.
        if tls := self._wait_for(self._TLS, 0, 0):
            self.tls_port = int(tls.group(2))
        if ws := self._wait_for(self._WS, 0, 0):
            self.ws_port = int(ws.group(2))
        if wss := self._wait_for(self._WSS, 0, 0):
            self.wss_port = int(wss.group(2))
        return self

    def workers(self) -> dict[str, psutil.Process]:
        """Live worker processes by title, e.g. ``{'gateway 0': proc, 'p2p 0': proc}``.

        Workers are the supervisor's grandchildren: its child, the fork server, forks them.
        """
        found: dict[str, psutil.Process] = {}
        for child in self.processes()[1:]:
            try:
                title = " ".join(child.cmdline())
            except psutil.NoSuchProcess:
                continue
            if match := re.match(r"mpbroker: (\w+ \d+)", title):
                found[match.group(1)] = child
        return found

    def forkserver(self) -> psutil.Process:
        """The fork server (the supervisor's only child)."""
        children = psutil.Process(self.pid).children()
        assert len(children) == 1, children
        assert " ".join(children[0].cmdline()).strip() == "mpbroker: forkserver"
        return children[0]

    def wait_for_worker(
        self, title: str, not_pid: int | None = None, timeout: float = 15.0
    ) -> psutil.Process:
        """The live worker ``title`` (one other than pid ``not_pid``: its restarted self),
        waiting up to ``timeout`` seconds for it; AssertionError if none appears."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.workers().get(title)
            if proc is not None and proc.pid != not_pid:
                return proc
            time.sleep(0.05)
        raise AssertionError(f"worker {title!r} did not (re)appear; log:\n{self.tail()}")

    def shm_entries(self) -> list[str]:
        """This broker's shared-memory segments and semaphores in /dev/shm, by name."""
        prefixes = (f"mpb.{self.pid}.", f"sem.mpb.{self.pid}.")
        return sorted(name for name in os.listdir(SHM_DIR) if name.startswith(prefixes))

    def stop_checked(self) -> None:
        """Stop; :class:`ServerError` unless the broker exited with status 0 and left
        nothing in /dev/shm."""
        super().stop_checked()
        if self.process is not None and (left := self.shm_entries()):
            raise ServerError(f"{self.name} left {left} in {SHM_DIR}")
