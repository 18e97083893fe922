"""A broker on free ports records them in its data dir (mpbroker-ports.json, owner-only),
so that a plain `mpbroker admin status --data-dir DIR` finds it; the record goes when the
broker stops, and one left by a killed broker does not send `mpbroker admin` astray."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mpbroker.harness import BrokerProcess
from mpbroker.shm import remove_instance

pytestmark = pytest.mark.slow

PORTS_FILE = "mpbroker-ports.json"


def mpbroker(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The real command line, as a user runs it."""
    command = [sys.executable, "-m", "mpbroker", *argv]
    env = {k: v for k, v in os.environ.items() if k != "MPBROKER_PASSWORD"}
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=cwd, env=env)


def test_admin_status_finds_a_broker_on_free_ports_by_its_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "mpbroker-data"
    # --port 0 --admin-port 0 --data-dir DATA, and a WebSocket port.
    with BrokerProcess("--gateways", "1", data_dir=data, config="[stomp]\nws_port = 0\n") as broker:
        assert broker.admin_port and broker.ws_port
        path = data / PORTS_FILE
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        recorded = json.loads(path.read_text())
        assert recorded["pid"] == broker.pid
        assert (recorded["host"], recorded["port"]) == (broker.host, broker.port)
        assert (recorded["admin_host"], recorded["admin_port"]) == ("127.0.0.1", broker.admin_port)
        assert recorded["ws_port"] == broker.ws_port
        assert recorded["tls_port"] is None and recorded["wss_port"] is None

        status = mpbroker("admin", "status", "--data-dir", str(data))
        assert (status.returncode, status.stderr) == (0, ""), status.stderr
        assert "gateway 0  ready" in status.stdout
        assert "p2p 0" in status.stdout
        # From the directory that holds it, no option at all: ./mpbroker-data is the
        # default data dir of both serve and admin.
        flow = mpbroker("admin", "flow", "--json", cwd=tmp_path)
        assert (flow.returncode, flow.stderr) == (0, ""), flow.stderr
        assert '"destinations"' in flow.stdout
    # A clean stop removes it.
    assert not (data / PORTS_FILE).exists()
    gone = mpbroker("admin", "status", "--data-dir", str(data))
    assert gone.returncode == 1
    assert f"no running broker recorded its ports in {data / PORTS_FILE}" in gone.stderr


def test_the_record_of_a_killed_broker_does_not_mislead(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = BrokerProcess("--gateways", "1", data_dir=data).start()
    try:
        broker.kill()
    finally:
        # What kill -9 left in /dev/shm (the next start would sweep it).
        remove_instance(str(broker.pid))
    assert (data / PORTS_FILE).exists()
    result = mpbroker("admin", "status", "--data-dir", str(data))
    assert result.returncode == 1
    assert result.stderr == (
        f"mpbroker: admin: the broker of data dir {data} is not running: "
        f"{data / PORTS_FILE} is from pid {broker.pid}, which is gone (give --port P for a "
        "broker elsewhere)\n"
    )
    # The next broker on the data dir records its own ports over it.
    with BrokerProcess("--gateways", "1", data_dir=data) as again:
        result = mpbroker("admin", "status", "--data-dir", str(data))
        assert (result.returncode, result.stderr) == (0, ""), result.stderr
        assert json.loads((data / PORTS_FILE).read_text())["pid"] == again.pid
