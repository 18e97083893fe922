"""DiskWatch: a store's free space read once a second, and after every batch while it is
near `store.disk_free_limit_bytes`; the store hears whether space is short."""

from __future__ import annotations

from pathlib import Path

from mpbroker.config import Config, replace_settings
from mpbroker.pipeline._disk import DiskWatch
from mpbroker.stores import MessageStore

MiB = 1024 * 1024
TOTAL = 1024 * MiB


def test_the_free_space_is_read_at_every_batch_only_near_the_limit(tmp_path: Path) -> None:
    config = replace_settings(Config(), "store", disk_free_limit_bytes="64MiB")
    readings = [500 * MiB]
    reads: list[float] = []

    def read(directory: Path) -> tuple[int, int]:
        reads.append(len(reads))
        return readings[-1], TOTAL

    with MessageStore.open(tmp_path / "s", config.store) as store:
        watch = DiskWatch(store, config, read)
        assert watch.check(0.0) is None
        assert watch.check(0.1) is None and len(reads) == 1  # plenty: once a second
        readings.append(100 * MiB)  # within twice the limit
        assert watch.check(1.0) is None and watch.near
        readings.append(60 * MiB)
        assert watch.check(1.01) == f"disk_free_limit {64 * MiB}"  # read at once
        assert store.low_on_disk
        readings.append(200 * MiB)
        assert watch.check(1.02) == ""
        assert not watch.near and not store.low_on_disk
        assert len(reads) == 4
