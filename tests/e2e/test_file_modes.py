"""The data dir holds every stored message: owner-only, whatever the umask the broker was
started with, and a data dir made before (or by hand) is made so at start."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mpbroker.harness import BrokerProcess, RawClient

pytestmark = pytest.mark.slow


def modes(root: Path) -> dict[str, int]:
    """Every entry under `root` (itself included) with its permission bits."""
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for entry in root.rglob("*"):
        found[str(entry.relative_to(root))] = stat.S_IMODE(entry.lstat().st_mode)
    return found


def test_everything_the_broker_writes_is_owner_only_under_umask_022(tmp_path: Path) -> None:
    data = tmp_path / "data"
    old = os.umask(0o022)  # the broker inherits it
    try:
        broker = BrokerProcess(data_dir=data).start()
    finally:
        os.umask(old)
    with broker:
        client = RawClient(broker.host, broker.port)
        try:
            client.connect()
            client.send(
                "SEND", {"destination": "/queue/kept", "persistent": "true", "receipt": "1"}, b"x"
            )
            assert client.recv().command == "RECEIPT"
        finally:
            client.close()
        seen = modes(data)
    # Stores, their WAL files, the durable registry, the partitions record: all there...
    names = " ".join(seen)
    for expected in ("p2p-0", "seg-", "pubsub-1-durable.db", "mpbroker-partitions.json"):
        assert expected in names, names
    # ...and not one readable by anyone but the broker's user.
    assert {name: mode for name, mode in seen.items() if mode & 0o077} == {}
    assert seen["."] == 0o700


def test_a_data_dir_made_before_is_made_owner_only_at_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    (data / "notes.txt").write_text("the operator's")
    os.chmod(data / "notes.txt", 0o644)
    with BrokerProcess(data_dir=data) as broker:
        broker.wait_for_log(r"data dir .*: took group and other permissions off 2 entries")
    seen = modes(data)
    assert seen["."] == 0o700 and seen["notes.txt"] == 0o600
