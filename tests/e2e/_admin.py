"""Reading a running broker's admin API from tests."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from mpbroker.harness import BrokerProcess


def get(broker: BrokerProcess, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.admin_port}{path}", timeout=10) as r:
        data: dict[str, Any] = json.load(r)
        return data


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
