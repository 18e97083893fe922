"""ServerProcess and BrokerProcess: readiness, log lines, failures to start or stop, cleanup."""

from __future__ import annotations

import os
import sys
import textwrap

import psutil
import pytest

from mpbroker.harness import BrokerProcess, ServerError, ServerProcess


def fake_server(body: str) -> list[str]:
    """A Python child process running ``body`` (which may call ``ready()``)."""
    prelude = textwrap.dedent(
        """
        import signal, sys, time
        def ready():
            print("fake ready on 127.0.0.1:4321", file=sys.stderr, flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        """
    )
    return [sys.executable, "-c", prelude + textwrap.dedent(body)]


def test_start_reads_the_address_and_stop_returns_the_exit_status() -> None:
    server = ServerProcess(
        "fake", fake_server("print('hello', file=sys.stderr); ready(); time.sleep(60)")
    )
    with server:
        assert (server.host, server.port) == ("127.0.0.1", 4321)
        assert server.wait_for_log(r"hel+o").group(0) == "hello"
        assert server.lines == ["hello", "fake ready on 127.0.0.1:4321"]
        assert server.processes()[0].pid == server.pid
    assert server.process is not None and server.process.returncode == 0


def test_wait_for_log_fails_with_the_last_lines() -> None:
    with ServerProcess("fake", fake_server("ready(); time.sleep(60)")) as server:
        with pytest.raises(
            AssertionError, match=r"(?s)no log line of fake matching 'never'.*ready on"
        ):
            server.wait_for_log("never", timeout=0.2)
        # From index 1 on, the ready line is not looked at.
        with pytest.raises(AssertionError):
            server.wait_for_log("ready", timeout=0.1, start=1)


def test_on_line_sees_every_line() -> None:
    seen: list[str] = []
    server = ServerProcess(
        "fake", fake_server("print('a', file=sys.stderr); ready(); time.sleep(60)")
    )
    server.on_line = seen.append
    with server:
        pass
    assert seen == ["a\n", "fake ready on 127.0.0.1:4321\n"]


def test_a_server_that_exits_before_it_is_ready_is_an_error_with_its_last_lines() -> None:
    server = ServerProcess("fake", fake_server("print('no port', file=sys.stderr); sys.exit(3)"))
    with pytest.raises(
        ServerError, match=r"(?s)fake exited with status 3 before it was ready.*no port"
    ):
        server.start()


def test_a_server_that_never_says_ready_is_stopped() -> None:
    server = ServerProcess("fake", fake_server("time.sleep(60)"))
    with pytest.raises(ServerError, match=r"fake did not say it was ready within 0\.3 s"):
        server.start(timeout=0.3)
    assert server.process is not None and server.process.returncode == 0


def test_a_server_that_ignores_sigterm_is_killed_with_everything_under_it() -> None:
    body = """
        import subprocess
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        ready()
        time.sleep(60)
        """
    server = ServerProcess("fake", fake_server(body)).start()
    tree = server.processes()
    assert len(tree) == 2
    with pytest.raises(ServerError, match=r"ignored SIGTERM for 0\.5 s and was killed"):
        server.stop(timeout=0.5)
    _, alive = psutil.wait_procs(tree, timeout=5)
    assert alive == []
    assert server.process is not None and server.process.returncode == -9


def test_stop_checked_refuses_a_nonzero_exit_status() -> None:
    server = ServerProcess(
        "fake",
        fake_server(
            "signal.signal(signal.SIGTERM, lambda *_: sys.exit(5)); ready(); time.sleep(60)"
        ),
    ).start()
    with pytest.raises(ServerError, match="fake exited with status 5 after SIGTERM"):
        server.stop_checked()


def test_a_temporary_directory_goes_once_the_server_stopped(tmp_path: os.PathLike[str]) -> None:
    temp_dir = os.path.join(tmp_path, "temp")
    os.mkdir(temp_dir)
    with ServerProcess("fake", fake_server("ready(); time.sleep(60)"), temp_dir=temp_dir):
        assert os.path.isdir(temp_dir)
    assert not os.path.exists(temp_dir)


def test_a_broker_with_a_temporary_data_directory_and_config() -> None:
    broker = BrokerProcess(gateways=1, config="[stomp]\nmax_headers = 20\n")
    data_dir = broker.data_dir
    assert (data_dir.parent / "data.toml").read_text() == "[stomp]\nmax_headers = 20\n"
    with broker:
        assert broker.admin_url == f"http://127.0.0.1:{broker.admin_port}"
        assert sorted(broker.workers()) == ["gateway 0", "p2p 0", "pubsub 0", "replay 0"]
        assert broker.forkserver().ppid() == broker.pid
        assert broker.shm_entries()
        assert data_dir.is_dir()
    assert broker.shm_entries() == []
    assert not data_dir.parent.exists()


def test_a_broker_without_the_admin_api() -> None:
    with BrokerProcess(gateways=1, admin=False) as broker:
        assert (broker.admin_url, broker.admin_port) == (None, 0)
