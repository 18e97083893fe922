"""The fork server on its own: exit codes, its process tree, its end, dying with its parent.

(The whole broker's use of it, restarts and kill -9 included, is in tests/e2e/test_faults.py.)
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from mpbroker.config import Config, config_from_mapping, replace_settings
from mpbroker.routing import Topology
from mpbroker.workers._launcher import Launcher, LauncherError
from mpbroker.workers._layout import Layout, WorkerSpec

pytestmark = pytest.mark.slow


def _ended(pid: int, timeout: float) -> bool:
    """Whether process `pid` ended (gone, or a zombie) within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _title(pid: int, timeout: float = 30.0) -> str:
    """The process title, once the fork server has set it."""
    deadline = time.monotonic() + timeout
    while True:
        title = " ".join(psutil.Process(pid).cmdline()).strip()
        if title.startswith("mpbroker:") or time.monotonic() > deadline:
            return title
        time.sleep(0.05)


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    started = Launcher("error")
    started.start()
    try:
        yield started
    finally:
        started.close()


def _orphan_spec(tmp_path: Path) -> WorkerSpec:
    """A gateway of a broker instance that does not exist: it fails at once, exit code 1."""
    config = replace_settings(Config(), "broker", data_dir=str(tmp_path), log_level="error")
    layout = Layout(f"{os.getpid()}launchertest", 1, Topology(1, 1), 1)
    return WorkerSpec("gateway", 0, 0, layout, config, 0)


def test_the_fork_server_is_one_titled_process_and_ends_when_closed(
    launcher: Launcher, tmp_path: Path
) -> None:
    pid = launcher.pid
    assert pid is not None
    assert _title(pid) == "mpbroker: forkserver"
    # Its first answer comes once it has imported what the workers need.
    launcher.launch(_orphan_spec(tmp_path), "mpbroker-gateway 0").close()
    server = psutil.Process(pid)
    assert server.ppid() == os.getpid()
    assert server.num_threads() == 1
    _gone, alive = psutil.wait_procs(server.children(), timeout=30)
    assert alive == []
    assert server.children() == []  # no resource tracker, nothing else
    launcher.close()
    assert _ended(pid, 5)


def test_a_worker_s_exit_code_reaches_the_supervisor(launcher: Launcher, tmp_path: Path) -> None:
    worker = launcher.launch(_orphan_spec(tmp_path), "mpbroker-gateway 0")
    try:
        assert psutil.Process(worker.pid).ppid() == launcher.pid
        worker.join(30)
        assert not worker.is_alive()
        assert worker.exitcode == 1
    finally:
        worker.close()
    # The server carries on: another worker, same story.
    again = launcher.launch(_orphan_spec(tmp_path), "mpbroker-gateway 0")
    again.join(30)
    assert again.exitcode == 1
    again.close()


def test_a_large_spec_goes_through_in_pieces(launcher: Launcher, tmp_path: Path) -> None:
    tables = {f"/queue/q{i}.*": {"msg_high": 100, "msg_low": 50} for i in range(8000)}
    config = config_from_mapping({"destinations": tables})
    spec = dataclasses.replace(_orphan_spec(tmp_path), config=config)
    assert len(pickle.dumps(spec)) > 256 * 1024  # above a SOCK_SEQPACKET message's limit
    worker = launcher.launch(spec, "mpbroker-gateway 0")
    worker.join(30)
    assert worker.exitcode == 1  # the worker got its spec (and then found no broker)
    worker.close()


def test_a_dead_fork_server_is_noticed(launcher: Launcher, tmp_path: Path) -> None:
    assert launcher.running()
    pid = launcher.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert _ended(pid, 5)
    assert not launcher.running()
    with pytest.raises(LauncherError):
        launcher.launch(_orphan_spec(tmp_path), "mpbroker-gateway 0")
    assert launcher.reap() == -signal.SIGKILL
    assert launcher.pid is None


def test_the_fork_server_dies_with_its_parent() -> None:
    # A stand-in supervisor: starts a fork server, says its pid, waits to be killed.
    code = (
        "import sys, time\n"
        "from mpbroker.workers._launcher import Launcher\n"
        "launcher = Launcher('error')\n"
        "launcher.start()\n"
        "print(launcher.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        server = int(parent.stdout.readline())
        assert _title(server) == "mpbroker: forkserver"
        parent.kill()
        parent.wait(10)
        assert _ended(server, 5), "the fork server outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
