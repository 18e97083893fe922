"""A port in use ends the start with one line that names the way out: the option (or
setting) that picks another port, 0 for a free one (and -1 for no admin API). Exit code 1:
the port may be free at the next try. (A second broker on a broker's port:
tests/e2e/test_faults.py.) A data dir in use by another broker is refused the same way."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpbroker.client import connect
from mpbroker.harness import BrokerProcess
from mpbroker.workers.datadir import PORTS_FILE

pytestmark = pytest.mark.slow


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


def serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mpbroker", "serve", "--data-dir", str(tmp_path / "data")]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60)


def refused(result: subprocess.CompletedProcess[str], line: str) -> None:
    assert result.returncode == 1, result.stderr
    # One line, and nothing started: no "stopped" after it.
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.endswith(f" cannot start: {line}\n"), result.stderr


def test_the_stomp_port_in_use_names_port_and_port_0(tmp_path: Path, taken: int) -> None:
    refused(
        serve(tmp_path, "--port", str(taken), "--admin-port", "0"),
        f"cannot listen on 127.0.0.1:{taken}: Address already in use (another broker?); pick "
        "another with --port N, or --port 0 for a free one",
    )


def test_the_admin_port_in_use_names_admin_port_0_and_minus_1(tmp_path: Path, taken: int) -> None:
    refused(
        serve(tmp_path, "--port", "0", "--admin-port", str(taken)),
        f"cannot serve the admin API on 127.0.0.1:{taken}: Address already in use (another "
        "broker?); pick another with --admin-port N, or --admin-port 0 for a free one; "
        "--admin-port -1 turns the admin API off",
    )


def test_the_websocket_port_in_use_names_its_setting(tmp_path: Path, taken: int) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(f"[stomp]\nws_port = {taken}\n")
    refused(
        serve(tmp_path, "--port", "0", "--admin-port", "-1", "--config", str(config)),
        f"cannot listen on 127.0.0.1:{taken} (stomp.ws_port): Address already in use (another "
        "broker?); set stomp.ws_port to another port, or to 0 for a free one",
    )


def test_a_second_broker_on_a_running_brokers_data_dir_is_refused(tmp_path: Path) -> None:
    """On free ports (`bash ops/run.sh --port 0` twice from one directory), a second broker
    would share the first one's stores: it would deliver a stored message twice and take
    over its ports record. It starts nothing, says who holds the data dir, and the first
    one serves on, still found by `mpbroker admin`."""
    data = tmp_path / "data"
    with BrokerProcess("--gateways", "1", data_dir=data) as first:
        with connect(first.host, first.port) as conn:
            conn.send("/queue/kept", "stored once", headers={"persistent": "true"}, receipt=True)
        record = (data / PORTS_FILE).read_text()
        result = serve(tmp_path, "--port", "0", "--admin-port", "0")
        refused(
            result,
            f"data dir {data}: in use by another broker (pid {first.pid}): stop it, or give "
            "this one another --data-dir (two brokers on one data dir would deliver its "
            "stored messages twice)",
        )
        assert (data / PORTS_FILE).read_text() == record
        with connect(first.host, first.port) as conn:
            sub = conn.subscribe("/queue/kept", ack="client-individual")
            message = sub.get(timeout=10)
            assert message is not None and message.text == "stored once"
            conn.ack(message)
    # Stopped: the lock is free for the next broker.
    with BrokerProcess("--gateways", "1", data_dir=data):
        pass
