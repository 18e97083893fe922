"""The broker under a service manager: the notify protocol against a fake NOTIFY_SOCKET
listener (READY, STATUS, WATCHDOG while healthy and not while a worker is stopped, RELOADING
then READY on SIGHUP, STOPPING on SIGTERM), and journald's log format."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mpbroker.harness import BrokerProcess, RawClient

pytestmark = pytest.mark.slow

Datagram = tuple[float, dict[str, str]]


class FakeManager:
    """What systemd's side of NOTIFY_SOCKET sees: every datagram, with when it came."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address.replace("@", "\0", 1) if address.startswith("@") else address)
        self.sock.settimeout(0.1)
        self.address = address
        self.got: list[Datagram] = []
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._closed:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines())
            with self._changed:
                self.got.append((time.monotonic(), fields))
                self._changed.notify_all()

    def wait_for(self, test: Callable[[dict[str, str]], bool], after: int = 0) -> int:
        """The index of the first datagram from `after` on that passes `test`."""
        deadline = time.monotonic() + 60
        with self._changed:
            while True:
                for i in range(after, len(self.got)):
                    if test(self.got[i][1]):
                        return i
                left = deadline - time.monotonic()
                if left <= 0:
                    shown = "\n".join(str(f) for _, f in self.got[after:])
                    raise AssertionError(f"no such notification; got:\n{shown}")
                self._changed.wait(left)

    def close(self) -> None:
        self._closed = True
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[FakeManager]:
    fake = FakeManager(str(tmp_path / "notify"))
    yield fake
    fake.close()


def watchdog(fields: dict[str, str]) -> bool:
    return fields.get("WATCHDOG") == "1"


def test_ready_status_watchdog_reload_and_stopping(manager: FakeManager, tmp_path: Path) -> None:
    broker = BrokerProcess(
        config="[broker]\nlog_level = 'info'\n",
        data_dir=tmp_path / "data",
        # A ping every 0.2 s.
        env={"NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": "400000"},
    )
    with broker:
        ready = manager.wait_for(lambda f: f.get("READY") == "1")
        # Before READY: only what it is doing.
        assert all(set(f) == {"STATUS"} for _, f in manager.got[:ready])
        assert manager.got[0][1]["STATUS"].startswith("starting")
        assert "5 of 5 workers ready" in manager.got[ready][1]["STATUS"]
        # READY means the port accepts connections.
        clients = [RawClient(broker.host, broker.port) for _ in range(2)]
        try:
            for client in clients:
                assert client.connect().command == "CONNECTED"
            manager.wait_for(lambda f: "2 connections" in f.get("STATUS", ""), ready)
        finally:
            for client in clients:
                client.close()
        start = len(manager.got)
        time.sleep(2)
        pings = [t for t, f in manager.got[start:] if watchdog(f)]
        assert len(pings) >= 5, manager.got[start:]
        # SIGHUP: RELOADING (with the time) then READY again.
        mark = len(manager.got)
        os.kill(broker.pid, signal.SIGHUP)
        reloading = manager.wait_for(lambda f: f.get("RELOADING") == "1", mark)
        assert int(manager.got[reloading][1]["MONOTONIC_USEC"]) > 0
        manager.wait_for(lambda f: f.get("READY") == "1", reloading)
        broker.wait_for_log("SIGHUP: flow settings reloaded")
        mark = len(manager.got)
    # SIGTERM (the context manager's stop): STOPPING, and exit code 0.
    stopping = manager.wait_for(lambda f: f.get("STOPPING") == "1", mark)
    assert manager.got[stopping][1]["STATUS"] == "stopping: SIGTERM"
    assert broker.process is not None and broker.process.returncode == 0


def test_no_watchdog_while_a_worker_is_stopped_past_the_stall_timeout(tmp_path: Path) -> None:
    manager = FakeManager(f"@mpbroker-test-notify-{os.getpid()}")  # an abstract name
    broker = BrokerProcess(
        config="[broker]\nworker_stall_timeout_ms = 3000\n",
        data_dir=tmp_path / "data",
        env={"NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": "200000"},
    )
    try:
        with broker:
            ready = manager.wait_for(lambda f: f.get("READY") == "1")
            manager.wait_for(watchdog, ready)
            worker = broker.workers()["p2p 0"]
            stopped_at = len(manager.got)
            worker.send_signal(signal.SIGSTOP)
            broker.wait_for_log(r"p2p 0 \(pid \d+\) stalled: no heartbeat")
            sick = manager.wait_for(lambda f: "after a stall" in f.get("STATUS", ""), stopped_at)
            well = manager.wait_for(lambda f: "STATUS" in f and "stall" not in f["STATUS"], sick)
            assert "5 of 5 workers ready" in manager.got[well][1]["STATUS"]
            manager.wait_for(watchdog, well)
            # Within the stall timeout a silent worker is no reason to worry...
            assert any(watchdog(f) for _, f in manager.got[stopped_at:sick])
            # ...past it, nothing fed the watchdog until a new p2p 0 served.
            assert not any(watchdog(f) for _, f in manager.got[sick:well])
            assert broker.workers()["p2p 0"].pid != worker.pid
    finally:
        manager.close()


def test_under_journald_every_line_has_a_priority_and_no_time(tmp_path: Path) -> None:
    """JOURNAL_STREAM names stderr: the journal format, in every process."""
    read_end, write_end = os.pipe()
    st = os.fstat(write_end)
    env = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    command = [sys.executable, "-m", "mpbroker", "serve", "--port", "0", "--admin-port", "-1"]
    command += ["--data-dir", str(tmp_path / "data"), "--log-level", "debug"]
    process = subprocess.Popen(command, stderr=write_end, stdin=subprocess.DEVNULL, env=env)
    os.close(write_end)
    lines: list[str] = []
    with os.fdopen(read_end) as stderr:
        try:
            for line in stderr:
                lines.append(line.rstrip("\n"))
                if "mpbroker ready on" in line:
                    process.send_signal(signal.SIGTERM)
        finally:
            assert process.wait(60) == 0
    pattern = re.compile(r"<[0-7]>[a-z0-9-]+\[\d+\] (DEBUG|INFO|WARNING|ERROR) \S")
    assert lines and all(pattern.match(line) for line in lines), lines
    assert not any(re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", line) for line in lines)
    roles = {line.split("[", 1)[0][3:] for line in lines}
    assert {"supervisor", "forkserver"} <= roles
    assert any(line.startswith("<6>supervisor[") and "mpbroker ready on" in line for line in lines)
    assert any(line.startswith("<7>") for line in lines)
