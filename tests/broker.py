"""Run a real broker (`python -m mpbroker serve --port 0`) in a subprocess for tests."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from mpbroker.stomp import SERVER_COMMANDS, Frame, FrameParser, encode_frame

READY = re.compile(r"mpbroker ready on (\S+):(\d+)")
START_TIMEOUT_S = 60.0


def serve_command(data_dir: Path, *args: str, config_path: Path | None = None) -> list[str]:
    """`mpbroker serve` on free loopback ports (STOMP and admin API), with `args` last."""
    cmd = [
        sys.executable,
        "-m",
        "mpbroker",
        "serve",
        "--port",
        "0",
        "--admin-port",
        "0",
        "--data-dir",
        str(data_dir),
    ]
    if config_path is not None:
        cmd += ["--config", str(config_path)]
    return cmd + list(args)


@contextlib.contextmanager
def stopped_cleanly(proc: BrokerProcess) -> Iterator[BrokerProcess]:
    """`proc` until the block ends; then SIGTERM, and what every user relies on: exit
    code 0 and nothing left in /dev/shm."""
    try:
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, proc.log_text()[-3000:]
        assert proc.shm_entries() == [], proc.shm_entries()


class BrokerProcess:
    """A broker subprocess; stderr is collected line by line in `lines`."""

    def __init__(self, data_dir: Path, *args: str, config: str | None = None) -> None:
        self.data_dir = data_dir
        config_path = None
        if config is not None:
            config_path = data_dir.parent / f"{data_dir.name}.toml"
            config_path.write_text(config)
        cmd = serve_command(data_dir, *args, config_path=config_path)
        self.proc = subprocess.Popen(
            cmd,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        try:
            match = self.wait_for_log(READY, START_TIMEOUT_S)
        except AssertionError:
            self.kill()  # nothing left running, no pipe left open
            raise
        self.host = match.group(1)
        self.port = int(match.group(2))
        admin = re.search(r"admin API on http://(\S+):(\d+)", self.log_text())
        self.admin_port = int(admin.group(2)) if admin else 0

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
            if os.environ.get("MPBROKER_TEST_ECHO"):
                sys.stderr.write(line)
        with self._changed:
            self._changed.notify_all()

    def wait_for_log(
        self, pattern: str | re.Pattern[str], timeout: float = 10.0, start: int = 0
    ) -> re.Match[str]:
        """First log line (from index `start`) matching `pattern`; AssertionError on timeout."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        seen = start
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    m = regex.search(line)
                    if m:
                        return m
                seen = len(self.lines)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    log = "\n".join(self.lines[-40:])
                    raise AssertionError(f"no log line matching {regex.pattern!r}; log:\n{log}")
                self._changed.wait(min(remaining, 0.2))

    def log_text(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def workers(self) -> dict[str, psutil.Process]:
        """Live worker processes by title, e.g. {'gateway 0': proc, 'p2p 0': proc}.

        Workers are the supervisor's grandchildren: its child, the fork server, forks them.
        """
        found: dict[str, psutil.Process] = {}
        for child in self.processes()[1:]:
            try:
                title = " ".join(child.cmdline())
            except psutil.NoSuchProcess:
                continue
            m = re.match(r"mpbroker: (\w+ \d+)", title)
            if m:
                found[m.group(1)] = child
        return found

    def processes(self) -> list[psutil.Process]:
        """The supervisor, then every process under it (fork server, workers), by pid."""
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def forkserver(self) -> psutil.Process:
        """The fork server (the supervisor's only child)."""
        children = psutil.Process(self.pid).children()
        assert len(children) == 1, children
        assert " ".join(children[0].cmdline()).strip() == "mpbroker: forkserver"
        return children[0]

    def wait_for_worker(
        self, title: str, not_pid: int | None = None, timeout: float = 15.0
    ) -> psutil.Process:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.workers().get(title)
            if proc is not None and proc.pid != not_pid:
                return proc
            time.sleep(0.05)
        raise AssertionError(
            f"worker {title!r} did not (re)appear; log:\n{self.log_text()[-3000:]}"
        )

    def shm_entries(self) -> list[str]:
        return sorted(
            n
            for n in os.listdir("/dev/shm")
            if n.startswith(f"mpb.{self.pid}.") or n.startswith(f"sem.mpb.{self.pid}.")
        )

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code (kills it if it hangs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(
                    f"broker did not stop on SIGTERM; log:\n{self.log_text()[-3000:]}"
                ) from None
        self._reader.join(5)
        self._close_pipe()
        return self.proc.returncode

    def _close_pipe(self) -> None:
        if self.proc.stderr is not None and not self._reader.is_alive():
            self.proc.stderr.close()

    def kill(self) -> None:
        """kill -9 the supervisor and every worker (what a crash or OOM kill does)."""
        try:
            children = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        for p in [psutil.Process(self.pid), *children] if self.proc.poll() is None else children:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        self.proc.wait(10)
        psutil.wait_procs(children, timeout=10)
        self._reader.join(5)
        self._close_pipe()


class RawClient:
    """A bare socket speaking frames through the codec, for exact and malformed input."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.parser = FrameParser(commands=SERVER_COMMANDS)
        self.frames: list[Frame] = []

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.sock.sendall(encode_frame(Frame(command, dict(headers or {}), body)))

    def connect(self, **headers: str) -> Frame:
        self.send("CONNECT", {"accept-version": "1.2", "host": "/", **headers})
        frame = self.recv()
        assert frame.command == "CONNECTED", frame
        return frame

    def recv(self, timeout: float = 10.0) -> Frame:
        """Next frame; AssertionError on timeout or on the connection closing."""
        deadline = time.monotonic() + timeout
        while not self.frames:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError("no frame within timeout")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                raise ConnectionError("connection closed by broker")
            self.frames.extend(self.parser.feed(data))
        return self.frames.pop(0)

    def recv_until_closed(self, timeout: float = 10.0) -> list[Frame]:
        """Every frame until the broker closes the connection."""
        frames: list[Frame] = []
        deadline = time.monotonic() + timeout
        while True:
            frames.extend(self.frames)
            self.frames.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"connection not closed within timeout; got {frames}")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                return frames
            if not data:
                return frames
            self.frames.extend(self.parser.feed(data))

    def close(self) -> None:
        self.sock.close()
