"""The memory budget at start: a config over max_memory is refused before anything starts;
a config the wizard wrote starts and carries messages."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from mpbroker.harness import BrokerProcess, RawClient, broker_command
from mpbroker.memory import WizardInputs, derive

pytestmark = pytest.mark.slow


def test_a_config_over_max_memory_is_refused_naming_the_modules(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    # 32 MiB rings: 8 of them (2 gateways to and from 2 pipelines) are far beyond 256 MiB.
    config.write_text("[stomp]\nmax_frame_bytes = 16777216\n[rings]\ncapacity_bytes = 33554432\n")
    data = tmp_path / "data"
    proc = subprocess.Popen(
        broker_command(data, "--gateways", "2", config_path=config),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert err.startswith("mpbroker: config: memory.max_memory = 268435456: ")
    assert "exceeds memory.max_memory = 256 MiB by " in err
    assert (
        "thread/buffer (rings) 320.04 MiB (10 rings x (32 MiB + 4 KiB): rings.capacity_bytes)"
        in err
    )
    assert "Lower rings.capacity_bytes" in err and "raise memory.max_memory" in err
    assert "mpbroker ready" not in err
    # Nothing was started: no data directory, no shared memory.
    assert not data.exists()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"mpb.{proc.pid}.")]


def test_a_config_the_wizard_wrote_runs(
    start_broker: type[BrokerProcess], raw: Callable[[BrokerProcess], RawClient]
) -> None:
    result = derive(
        WizardInputs(
            memory_bytes=256 * 2**20,
            topics=2,
            queues=2,
            largest_topic_message_bytes=64 * 1024,
            largest_queue_message_bytes=64 * 1024,
            rate_per_s=100,
            connections=10,
            threads=2,
            cpus=2,
        )
    )
    broker = start_broker(config=result.toml())
    client = raw(broker)
    client.connect()
    client.send("SUBSCRIBE", {"destination": "/queue/wizard", "id": "1"})
    body = b"x" * (64 * 1024)
    client.send("SEND", {"destination": "/queue/wizard", "receipt": "r"}, body)
    frames = [client.recv(), client.recv()]
    assert sorted(f.command for f in frames) == ["MESSAGE", "RECEIPT"]
    assert next(f for f in frames if f.command == "MESSAGE").body == body
