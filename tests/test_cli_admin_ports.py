"""`mpbroker admin` without --port: the admin port the broker of --data-dir recorded in its
mpbroker-ports.json (tests/e2e/test_admin_ports_file.py with a real broker). Here the
record is written by hand, for an admin API in this process, and for brokers that are gone."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from mpbroker.cli import main
from mpbroker.workers.datadir import (
    PORTS_FILE,
    DataDirError,
    PortsRecord,
    read_ports,
    remove_ports,
    write_ports,
)


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in an empty directory (the default data dir, ./mpbroker-data, is not there)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MPBROKER_PASSWORD", raising=False)


@pytest.fixture
def admin_port() -> Iterator[int]:
    """The port of an admin API in this process, without users."""
    from mpbroker.admin import StatusView
    from mpbroker.admin.server import AdminServer

    server = AdminServer("127.0.0.1", 0, lambda: StatusView(at_ms=1, workers=[]))
    server.start()
    yield server.address[1]
    server.close()


def record(admin_port: int | None, pid: int | None = None) -> PortsRecord:
    """What a broker with supervisor `pid` (default: this process) would record."""
    pid = os.getpid() if pid is None else pid
    return PortsRecord(
        pid=pid,
        started=psutil.Process(os.getpid()).create_time(),
        host="127.0.0.1",
        port=61613,
        tls_port=None,
        ws_port=None,
        wss_port=None,
        admin_host=None if admin_port is None else "127.0.0.1",
        admin_port=admin_port,
    )


def a_free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port: int = sock.getsockname()[1]
        return port


def a_gone_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def admin(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["admin", "status", "--json", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_record_is_owner_only_and_reads_back(tmp_path: Path) -> None:
    old = os.umask(0o022)  # owner-only whatever the umask
    try:
        assert write_ports(tmp_path, record(8161)) is None
    finally:
        os.umask(old)
    path = tmp_path / PORTS_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_ports(tmp_path) == record(8161)
    assert read_ports(tmp_path / "missing") is None
    # Only the broker that wrote it removes it.
    remove_ports(tmp_path, os.getpid() + 1)
    assert path.exists()
    remove_ports(tmp_path, os.getpid())
    assert not path.exists()


@pytest.mark.parametrize(
    "text", ["{", "[]", '{"pid": 1}', '{"pid": 0, "started": 0, "host": "h", "port": 99999}']
)
def test_a_damaged_record_is_named(tmp_path: Path, text: str) -> None:
    (tmp_path / PORTS_FILE).write_text(text)
    with pytest.raises(DataDirError, match=f"{PORTS_FILE}: damaged"):
        read_ports(tmp_path)


def test_admin_finds_the_port_the_broker_of_its_data_dir_recorded(
    admin_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write_ports(data, record(admin_port))
    code, out, err = admin(capsys, "--data-dir", str(data))
    assert (code, err) == (0, "")
    assert '"workers": []' in out
    # The default data dir is serve's: ./mpbroker-data.
    default = tmp_path / "mpbroker-data"
    default.mkdir()
    write_ports(default, record(admin_port))
    code, out, err = admin(capsys)
    assert (code, err) == (0, "")


def test_an_explicit_port_wins_over_the_record(
    admin_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_ports(tmp_path, record(a_free_port()))
    code, _, err = admin(capsys, "--data-dir", str(tmp_path), "--port", str(admin_port))
    assert (code, err) == (0, "")


def test_a_record_whose_port_answers_nothing_is_named_in_the_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = a_free_port()
    write_ports(tmp_path, record(port))
    code, out, err = admin(capsys, "--data-dir", str(tmp_path))
    assert (code, out) == (1, "")
    assert err.startswith(f"mpbroker: cannot reach the admin API at http://127.0.0.1:{port}/")
    assert err.endswith(
        f" (the port the broker with pid {os.getpid()} recorded in {tmp_path / PORTS_FILE})\n"
    )


def test_the_record_of_a_broker_that_is_gone_does_not_mislead(
    admin_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = a_gone_pid()
    write_ports(tmp_path, record(admin_port, pid=gone))
    code, out, err = admin(capsys, "--data-dir", str(tmp_path))
    assert (code, out) == (1, "")
    assert err == (
        f"mpbroker: admin: the broker of data dir {tmp_path} is not running: "
        f"{tmp_path / PORTS_FILE} is from pid {gone}, which is gone (give --port P for a "
        "broker elsewhere)\n"
    )
    # Nor does one whose pid another process has now: it started at another time.
    write_ports(tmp_path, replace(record(admin_port), started=1.0))
    code, _, err = admin(capsys, "--data-dir", str(tmp_path))
    assert code == 1
    assert "is not running" in err


def test_a_broker_without_admin_api_is_said_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_ports(tmp_path, record(None))
    code, out, err = admin(capsys, "--data-dir", str(tmp_path))
    assert (code, out) == (1, "")
    assert err == (
        f"mpbroker: admin: the broker of data dir {tmp_path} (pid {os.getpid()}) serves no "
        "admin API (it was started with admin.port = -1)\n"
    )


@pytest.mark.parametrize("damaged", [False, True], ids=["no record", "damaged record"])
def test_without_a_record_the_default_port_and_why(
    damaged: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 8161)) == 0:
            pytest.skip("something listens on port 8161 on this machine")
    path = tmp_path / PORTS_FILE
    if damaged:
        path.write_text("{")
    code, out, err = admin(capsys, "--data-dir", str(tmp_path))
    assert (code, out) == (1, "")
    assert err.startswith("mpbroker: cannot reach the admin API at http://127.0.0.1:8161/status")
    if damaged:
        assert f"(the default port: data dir {path}: damaged (" in err
    else:
        assert err.endswith(
            f" (the default port: no running broker recorded its ports in {path}; give "
            "--port P, or --data-dir DIR of the broker)\n"
        )
