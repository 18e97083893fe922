"""Starting and stopping the servers a run talks to: mpbroker, or the baseline forwarder.

Each is a child process that logs ``... ready on HOST:PORT`` on stderr once it accepts
connections (nats.py's tests wait for the server's readiness line the same way). A thread
keeps draining stderr afterwards, so a chatty server never blocks on a full pipe, and keeps
the last lines to explain a failure.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from types import TracebackType

__all__ = ["ServerError", "ServerProcess", "baseline_command", "broker_command"]

_READY = re.compile(r"ready on (\S+):(\d+)")
_KEEP_LINES = 40
#: How long a server may take to say it is ready; the broker spawns several processes.
START_TIMEOUT_S = 60.0
#: How long a server may take to exit after SIGTERM (the broker drains its clients).
STOP_TIMEOUT_S = 20.0


class ServerError(RuntimeError):
    """A server did not start, or did not stop cleanly; the message says which and why."""


def broker_command(
    data_dir: str, gateways: int | None, config_path: str | None = None
) -> list[str]:
    command = [sys.executable, "-m", "mpbroker", "serve", "--port", "0", "--data-dir", data_dir]
    command += ["--admin-port", "-1"]  # a bench needs no admin API (nor its port)
    if gateways is not None:
        command += ["--gateways", str(gateways)]
    if config_path is not None:
        command += ["--config", config_path]
    return command


def baseline_command(host: str) -> list[str]:
    return [sys.executable, "-m", "bench.baseline", "--host", host, "--port", "0"]


class ServerProcess:
    """A server child process; use as a context manager (stops it on exit).

    ``name`` appears in messages. ``temp_dir``, if given, is removed once the server stopped
    (the broker's data directory). ``on_line``, if set before :meth:`start`, is called with
    every line the server writes to stderr (from the thread that drains it).
    """

    def __init__(self, name: str, command: Sequence[str], *, temp_dir: str | None = None) -> None:
        self.name = name
        self.command = list(command)
        self.temp_dir = temp_dir
        self.process: subprocess.Popen[str] | None = None
        self.host = ""
        self.port = 0
        self.lines: collections.deque[str] = collections.deque(maxlen=_KEEP_LINES)
        self._ready: queue.Queue[tuple[str, int] | None] = queue.Queue()
        self._reader: threading.Thread | None = None
        self.on_line: Callable[[str], None] | None = None

    @classmethod
    def broker(cls, gateways: int | None = None, config: str | None = None) -> ServerProcess:
        """A broker with a temporary data directory; ``config``, if given, is TOML text
        written next to it and passed with ``--config``."""
        temp_dir = tempfile.mkdtemp(prefix="mpbroker-bench-")
        config_path = None
        if config is not None:
            config_path = os.path.join(temp_dir, "bench-config.toml")
            with open(config_path, "w", encoding="utf-8") as fh:
                fh.write(config)
            data_dir = os.path.join(temp_dir, "data")
        else:
            data_dir = temp_dir
        command = broker_command(data_dir, gateways, config_path)
        return cls("mpbroker", command, temp_dir=temp_dir)

    @classmethod
    def baseline(cls, host: str = "127.0.0.1") -> ServerProcess:
        return cls("baseline", baseline_command(host))

    @property
    def pid(self) -> int:
        if self.process is None:
            raise ServerError(f"{self.name} was not started")
        return self.process.pid

    def start(self, timeout_s: float = START_TIMEOUT_S) -> ServerProcess:
        self.process = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._drain, name=f"{self.name}-stderr", daemon=True)
        self._reader.start()
        timed_out = False
        try:
            found = self._ready.get(timeout=timeout_s)
        except queue.Empty:
            found = None
            timed_out = True
        if found is None:
            status = self.process.poll()
            if not timed_out:
                # stderr ended, so the process is exiting: give it a moment for its status.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    status = self.process.wait(5)
            if status is None:
                problem = f"did not say it was ready within {timeout_s:g} s"
            else:
                problem = f"exited with status {status} before it was ready"
            with contextlib.suppress(ServerError):
                self.stop()
            raise ServerError(f"{self.name} {problem}; its last lines:\n{self._tail()}")
        self.host, self.port = found
        return self

    def _drain(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        announced = False
        on_line = self.on_line
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))
            if on_line is not None:
                on_line(line)
            if not announced and (match := _READY.search(line)):
                announced = True
                self._ready.put((match.group(1), int(match.group(2))))
        if not announced:
            self._ready.put(None)

    def _tail(self) -> str:
        return "\n".join(f"  {line}" for line in self.lines) or "  (nothing)"

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, wait; SIGKILL if it does not exit in time. Returns the exit status."""
        process = self.process
        status: int | None = None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                status = process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise ServerError(
                    f"{self.name} (pid {process.pid}) ignored SIGTERM for {timeout_s:g} s "
                    f"and was killed; its last lines:\n{self._tail()}"
                ) from None
            finally:
                if self._reader is not None:
                    self._reader.join(5)
                with contextlib.suppress(OSError):
                    if process.stderr is not None:
                        process.stderr.close()
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None
        return status

    def stop_checked(self) -> None:
        """Stop, and raise :class:`ServerError` unless the server exited with status 0."""
        status = self.stop()
        if status not in (0, None):
            raise ServerError(
                f"{self.name} exited with status {status} after SIGTERM; its last lines:\n"
                f"{self._tail()}"
            )

    def __enter__(self) -> ServerProcess:
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
