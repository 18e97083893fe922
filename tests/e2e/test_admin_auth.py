"""The admin API of a broker with a users file, end to end: HTTP Basic credentials of a
user in group admin, 401 and 403 otherwise, `mpbroker admin --user`, and SIGHUP reading
the users again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpbroker.admin.access import authorization
from mpbroker.harness import BrokerProcess
from tests.e2e._admin import ask, get, user_add

pytestmark = pytest.mark.slow

CHALLENGE = 'Basic realm="mpbroker", charset="UTF-8"'
PASSWORDS = ("r00t", "s3cret", "gue55", "first-pw", "second-pw")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker whose users are root (group admin) and alice (producers only)."""
    root = tmp_path_factory.mktemp("admin-auth")
    users = root / "users"
    user_add(users, "root", "r00t", "admin")
    user_add(users, "alice", "s3cret", "producers")
    config = f'[security]\nusers_file = "{users}"\n'
    with BrokerProcess(gateways=1, config=config, data_dir=root / "data") as broker:
        yield broker


def admin_command(
    broker: BrokerProcess, page: str, *argv: str, password: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`mpbroker admin PAGE` as an operator runs it, the password in MPBROKER_PASSWORD."""
    env = {k: v for k, v in os.environ.items() if k != "MPBROKER_PASSWORD"}
    if password is not None:
        env["MPBROKER_PASSWORD"] = password
    command = [sys.executable, "-m", "mpbroker", "admin", page]
    return subprocess.run(
        [*command, "--port", str(broker.admin_port), *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        stdin=subprocess.DEVNULL,  # no terminal: never a prompt
    )


def test_without_credentials_the_answer_is_401_with_a_basic_challenge(
    secured: BrokerProcess,
) -> None:
    for path in ("/status", "/flow", "/nonesuch"):  # not even which pages exist
        code, headers, body = ask(secured, path)
        assert (code, headers["WWW-Authenticate"]) == (401, CHALLENGE)
        assert body == {
            "error": "authentication required: HTTP Basic credentials of a user in group 'admin'"
        }
    secured.wait_for_log(
        r"WARNING supervisor\[\d+\] admin: refused a request from 127\.0\.0\.1: "
        r"authentication required"
    )


def test_a_wrong_password_and_an_unknown_user_get_the_same_401(secured: BrokerProcess) -> None:
    wrong = ask(secured, "/status", Authorization=authorization("root", "gue55"))
    unknown = ask(secured, "/status", Authorization=authorization("mallory", "r00t"))
    for code, headers, body in (wrong, unknown):
        assert (code, headers["WWW-Authenticate"], body) == (
            401,
            CHALLENGE,
            {"error": "authentication failed"},
        )
    malformed = ask(secured, "/status", Authorization="Basic cm9vdA==")  # "root", no colon
    assert malformed[0] == 401
    # Logged with the address (repeats within 10 s are counted, then summed up).
    secured.wait_for_log(
        r"admin: refused a request from 127\.0\.0\.1 by '\w+': authentication failed "
        r"\(HTTP 401\)"
    )


def test_a_user_outside_group_admin_gets_403(secured: BrokerProcess) -> None:
    code, headers, body = ask(secured, "/flow", Authorization=authorization("alice", "s3cret"))
    assert (code, body) == (403, {"error": "user 'alice' is not in group 'admin'"})
    assert "WWW-Authenticate" not in headers
    secured.wait_for_log(
        r"admin: refused a request from 127\.0\.0\.1 by 'alice': user 'alice' is not in "
        r"group 'admin' \(HTTP 403\)"
    )


def test_an_admin_reads_status_and_flow(secured: BrokerProcess) -> None:
    status = get(secured, "/status", ("root", "r00t"))
    assert {"gateway 0", "p2p 0", "pubsub 0"} <= {w["title"] for w in status["workers"]}
    flow = get(secured, "/flow?limit=0", ("root", "r00t"))
    assert flow["destinations"] == [] and "destinations_not_shown" in flow
    # The Host header is still checked, before the credentials.
    code, headers, _ = ask(
        secured, "/status", Host="evil.example", Authorization=authorization("root", "r00t")
    )
    assert code == 403 and "WWW-Authenticate" not in headers


def test_the_admin_command_passes_the_password_of_the_environment(
    secured: BrokerProcess,
) -> None:
    done = admin_command(secured, "status", "--user", "root", password="r00t")
    assert (done.returncode, done.stderr) == (0, "")
    assert "gateway 0" in done.stdout
    done = admin_command(secured, "flow", "--user", "root", "--json", password="r00t")
    assert done.returncode == 0 and '"stopped_producers"' in done.stdout


def test_the_admin_command_refused_says_why_in_one_line_and_exits_2(
    secured: BrokerProcess,
) -> None:
    url = f"http://127.0.0.1:{secured.admin_port}/status"
    done = admin_command(secured, "status", "--user", "root", password="gue55")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"mpbroker: admin API at {url}: HTTP 401: authentication failed\n"
    done = admin_command(secured, "status", "--user", "alice", password="s3cret")
    assert (done.returncode, done.stderr) == (
        2,
        f"mpbroker: admin API at {url}: HTTP 403: user 'alice' is not in group 'admin'\n",
    )
    done = admin_command(secured, "status")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "HTTP 401" in done.stderr and "--user NAME" in done.stderr
    # Neither its text nor the broker's log ever names a password.
    assert not any(p in secured.log_text() for p in PASSWORDS)


def test_sighup_reads_the_users_again_for_the_admin_api(tmp_path: Path) -> None:
    users = tmp_path / "users"
    user_add(users, "root", "first-pw", "admin")
    config = f'[security]\nusers_file = "{users}"\n'
    with BrokerProcess(gateways=1, config=config, data_dir=tmp_path / "data") as broker:
        assert get(broker, "/status", ("root", "first-pw"))["workers"]  # remembered from now on
        user_add(users, "root", "second-pw", "admin", replace=True)
        mark = len(broker.lines)
        os.kill(broker.pid, signal.SIGHUP)
        broker.wait_for_log(r"supervisor\[\d+\] SIGHUP: flow settings reloaded", start=mark)
        assert ask(broker, "/status", Authorization=authorization("root", "first-pw"))[0] == 401
        assert get(broker, "/status", ("root", "second-pw"))["workers"]
        done = admin_command(broker, "status", "--user", "root", password="second-pw")
        assert (done.returncode, done.stderr) == (0, "")
        # A users file broken meanwhile is refused as a whole: the users read before stay.
        users.write_text(users.read_text() + "garbage\n")
        mark = len(broker.lines)
        os.kill(broker.pid, signal.SIGHUP)
        broker.wait_for_log(r"SIGHUP: configuration not reloaded: users file", start=mark)
        assert get(broker, "/status", ("root", "second-pw"))["workers"]
        assert not any(p in broker.log_text() for p in PASSWORDS)
