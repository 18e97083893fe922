"""MemWatch in a running broker: its level is published, logged and shown."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

from mpbroker.harness import BrokerProcess

pytestmark = pytest.mark.slow


def test_a_broker_over_its_memory_level_warns_and_shows_the_level(
    start_broker: type[BrokerProcess],
) -> None:
    # Levels the idle broker is already past: level 2 at once. (A max_memory below what an
    # idle broker uses would be refused: its theoretical maximum must fit.)
    config = '[memory]\nmemwatch_levels = "1,2"\nmemwatch_interval_ms = 100\n'
    broker = start_broker("--gateways", "1", config=config)
    broker.wait_for_log(r"WARNING supervisor\[\d+\] memory level 2: \d+ MiB of max_memory 256 MiB")
    deadline = time.monotonic() + 10
    while True:
        url = f"http://127.0.0.1:{broker.admin_port}/status"
        with urllib.request.urlopen(url, timeout=10) as response:
            status: dict[str, Any] = json.load(response)
        if status["memory"]["level"] == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    memory = status["memory"]
    assert memory["level"] == 2 and memory["max_memory"] == 256 * 2**20
    assert memory["percent"] >= 2
