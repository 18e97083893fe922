"""Reading a running broker's admin API, and making its users (`mpbroker user add`), from tests."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from email.message import Message
from pathlib import Path
from typing import Any

from mpbroker.admin.access import authorization
from mpbroker.harness import BrokerProcess
from tests.http import ask as ask_url


def get(
    broker: BrokerProcess, path: str, credentials: tuple[str, str] | None = None
) -> dict[str, Any]:
    """The page at `path` (as a user and password, for a broker with a users file)."""
    request = urllib.request.Request(f"http://127.0.0.1:{broker.admin_port}{path}")
    if credentials is not None:
        request.add_header("Authorization", authorization(*credentials))
    with urllib.request.urlopen(request, timeout=10) as r:
        data: dict[str, Any] = json.load(r)
        return data


def ask(broker: BrokerProcess, path: str, **headers: str) -> tuple[int, Message, Any]:
    """Status, headers and JSON body of a GET with these headers, whatever the status."""
    return ask_url(f"http://127.0.0.1:{broker.admin_port}{path}", **headers)


def user_add(users: Path, name: str, password: str, *groups: str, replace: bool = False) -> None:
    """`mpbroker user add` as an operator runs it, the password on stdin."""
    command = [sys.executable, "-m", "mpbroker", "user", "add", name, "--users-file", str(users)]
    for group in groups:
        command += ["--group", group]
    if replace:
        command.append("--replace")
    done = subprocess.run(command, input=password + "\n", capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def eventually(check: Callable[[], Any], timeout: float = 10) -> Any:
    """The first truthy result of `check` (the stats are up to 500 ms old)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, "the admin API never showed it"
        time.sleep(0.1)


def worker_stats(broker: BrokerProcess, title: str) -> dict[str, Any]:
    """What one worker (e.g. "p2p 0") published last."""
    [worker] = [w for w in get(broker, "/status")["workers"] if w["title"] == title]
    # null until the worker published its first snapshot
    stats: dict[str, Any] = worker["stats"] or {}
    return stats
