"""A store's filesystem running out of room, on a real small filesystem (a tmpfs the test
mounts, so it needs root): `store.disk_free_limit_bytes` stops persistent producers before
the disk is full, as RabbitMQ's disk_free_limit does, and lets them go once there is room."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mpbroker.harness import BrokerProcess, RawClient

RawFactory = Callable[[BrokerProcess], RawClient]

pytestmark = pytest.mark.slow

MiB = 1024 * 1024


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs, unmounted at the end (after the brokers a test started: request it
    before `start_broker`)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def persistent_send(client: RawClient, receipt: str) -> None:
    client.send(
        "SEND",
        {"destination": "/queue/disk", "persistent": "true", "receipt": receipt},
        b"kept",
    )


def test_persistent_producers_wait_below_the_disk_free_limit_and_go_on_when_there_is_room(
    small_fs: Path, start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    config = '[store]\ndisk_free_limit_bytes = "8MiB"\n[flow]\nsend_timeout_ms = 1500\n'
    broker = start_broker("--gateways", "1", config=config, data_dir=small_fs / "data")
    producer = raw(broker)
    producer.connect()
    persistent_send(producer, "before")
    assert producer.recv(timeout=10).headers["receipt-id"] == "before"
    # Something else fills the filesystem: less than 8 MiB stays free.
    filler = small_fs / "filler"
    filler.write_bytes(bytes(10 * MiB))
    broker.wait_for_log(r"below store.disk_free_limit_bytes \(8 MiB\): persistent producers wait")
    # Non-persistent messages still go; a persistent one waits, then is refused by name.
    producer.send("SEND", {"destination": "/queue/disk", "receipt": "volatile"}, b"v")
    assert producer.recv(timeout=10).headers["receipt-id"] == "volatile"
    persistent_send(producer, "held")
    error = producer.recv(timeout=10)
    assert error.command == "ERROR"
    assert (
        error.headers["message"]
        == f"ResourceAllocation: /queue/disk disk_free_limit {8 * MiB} reached"
    )
    assert error.headers["receipt-id"] == "held"
    assert b"store.disk_free_limit_bytes" in error.body
    # Room again: producers go on.
    filler.unlink()
    broker.wait_for_log(r"has .* free again: persistent producers may go on")
    again = raw(broker)
    again.connect()
    persistent_send(again, "after")
    assert again.recv(timeout=10).headers["receipt-id"] == "after"
    consumer = raw(broker)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/disk", "id": "c"})
    assert [consumer.recv(timeout=10).body for _ in range(3)] == [b"kept", b"v", b"kept"]
    consumer.assert_no_frame(0.3)


def test_the_broker_starts_on_a_full_filesystem_and_says_so(
    small_fs: Path, start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    (small_fs / "filler").write_bytes(bytes(12 * MiB))
    config = '[store]\ndisk_free_limit_bytes = "8MiB"\n[flow]\nsend_timeout_ms = 500\n'
    broker = start_broker("--gateways", "1", config=config, data_dir=small_fs / "data")
    broker.wait_for_log(r"below store.disk_free_limit_bytes")
    client = raw(broker)
    client.connect()
    client.send("SEND", {"destination": "/queue/disk", "receipt": "volatile"}, b"v")
    assert client.recv(timeout=10).headers["receipt-id"] == "volatile"
    persistent_send(client, "held")
    assert "disk_free_limit" in client.recv(timeout=10).headers["message"]
