"""Who may connect, end to end: a users file made with `mpbroker user add`, stomp.py and
our client with good and bad credentials, the anonymous rules, SIGHUP reading the users
again, and the start-up refusals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import stomp

from mpbroker.client import StompError, connect
from mpbroker.harness import BrokerProcess, RawClient
from tests.e2e._admin import user_add

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("secured")
    users = root / "users"
    user_add(users, "alice", "s3cret", "producers")
    config = f'[security]\nusers_file = "{users}"\n'
    with BrokerProcess(config=config, data_dir=root / "data") as broker:
        yield broker


def refusal(broker: BrokerProcess, **headers: str) -> list[tuple[str, str]]:
    client = RawClient(broker.host, broker.port)
    try:
        client.send("CONNECT", {"accept-version": "1.2", "host": "/", **headers})
        return [(f.command, f.headers.get("message", "")) for f in client.recv_until_closed()]
    finally:
        client.close()


def test_good_credentials_connect_with_stomp_py_and_our_client(secured: BrokerProcess) -> None:
    conn = stomp.Connection12([(secured.host, secured.port)])
    conn.connect("alice", "s3cret", wait=True)
    assert conn.is_connected()
    conn.disconnect()
    with connect(secured.host, secured.port, login="alice", passcode="s3cret") as ours:
        sub = ours.subscribe("/queue/authenticated")
        ours.send("/queue/authenticated", "in", receipt=True)
        got = sub.get(timeout=10)
        assert got is not None and got.text == "in"


def test_a_wrong_passcode_an_unknown_user_and_no_login_get_the_same_error(
    secured: BrokerProcess,
) -> None:
    expected = [("ERROR", "authentication failed")]
    assert refusal(secured, login="alice", passcode="wrong") == expected
    assert refusal(secured, login="mallory", passcode="s3cret") == expected
    assert refusal(secured) == expected  # a users file and no allow_anonymous: no anonymous
    conn = stomp.Connection12([(secured.host, secured.port)])
    with pytest.raises(stomp.exception.ConnectFailedException):
        conn.connect("alice", "wrong", wait=True)
    with pytest.raises(StompError, match="authentication failed"):
        connect(secured.host, secured.port, login="mallory", passcode="x")
    # Logged with the address (repeats within 10 s are counted, then summed up).
    secured.wait_for_log(r"authentication failed for \S+ from 127\.0\.0\.1:\d+")
    # The log never names the passcode.
    assert "s3cret" not in secured.log_text() and "wrong" not in secured.log_text()


def test_sighup_reads_the_users_again(tmp_path: Path) -> None:
    users = tmp_path / "users"
    user_add(users, "alice", "one")
    config = tmp_path / "broker.toml"
    config.write_text(f'[security]\nusers_file = "{users}"\n')
    broker = BrokerProcess(data_dir=tmp_path / "data")
    broker.command += ["--config", str(config)]
    with broker.start():
        assert refusal(broker, login="bob", passcode="two") == [("ERROR", "authentication failed")]
        user_add(users, "bob", "two")
        mark = len(broker.lines)
        os.kill(broker.pid, signal.SIGHUP)
        gateways = sum(title.startswith("gateway") for title in broker.workers())
        for _ in range(gateways):  # every gateway took it
            mark = (
                broker.lines.index(
                    broker.wait_for_log(
                        r"INFO gateway-\d+\[\d+\] flow settings reloaded", start=mark
                    ).string
                )
                + 1
            )
        for _ in range(4):  # whichever gateway the connection lands on
            with connect(broker.host, broker.port, login="bob", passcode="two"):
                pass
        # A users file broken meanwhile is refused as a whole: bob still gets in.
        users.write_text(users.read_text() + "garbage\n")
        mark = len(broker.lines)
        os.kill(broker.pid, signal.SIGHUP)
        broker.wait_for_log(r"SIGHUP: configuration not reloaded: users file .*line 4", start=mark)
        with connect(broker.host, broker.port, login="bob", passcode="two"):
            pass


def test_anonymous_is_allowed_without_a_users_file_on_loopback(
    start_broker: type[BrokerProcess],
) -> None:
    broker = start_broker()
    with connect(broker.host, broker.port):
        pass


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mpbroker", "serve", "--port", "0", "--admin-port", "-1"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60)


def test_listening_beyond_loopback_without_users_is_refused(tmp_path: Path) -> None:
    result = serve("--host", "0.0.0.0", "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2
    assert result.stderr.startswith(
        "mpbroker: config: security.allow_anonymous = 'auto': the broker would listen on "
        "0.0.0.0, beyond this machine, with no security.users_file"
    )
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "data").exists()  # refused before anything


def test_a_bad_users_file_is_refused_naming_the_line(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.write_text("alice:plain:\n")
    config = tmp_path / "broker.toml"
    config.write_text(f'[security]\nusers_file = "{users}"\n')
    result = serve("--config", str(config), "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2
    assert result.stderr == (
        f"mpbroker: users file {users}, line 1: not a scrypt$N$r$p$salt$key hash\n"
    )
