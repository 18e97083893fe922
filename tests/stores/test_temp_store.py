"""The temp store: paged bodies in allocation units, bounded, emptied at every start."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpbroker.config import TempStoreSettings
from mpbroker.stores import StoreError, TempStore

UNIT = 64 * 1024


def open_store(directory: Path, units: int = 3) -> TempStore:
    settings = TempStoreSettings(limit_bytes=units * UNIT, segment_bytes=UNIT)
    return TempStore.open(directory, settings, cache_bytes=64 * 1024)


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_bodies_come_back_as_written_and_are_forgotten_after(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    keys = [store.put(b"body %d" % n) for n in range(10)]
    assert all(keys)
    store.commit()
    assert [store.take(k) for k in keys if k] == [b"body %d" % n for n in range(10)]
    assert store.held_messages == 0
    with pytest.raises(StoreError, match="no body"):
        store.take(10**6)
    store.close()


def test_files_are_allocation_units_and_go_when_every_body_in_them_is_gone(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path, units=4)
    body = bytes(UNIT // 4)
    keys = [store.put(body) for _ in range(8)]  # two units' worth
    assert all(keys) and len(files(tmp_path)) == 2
    assert store.usage_bytes == 2 * UNIT
    for key in keys[:4]:
        assert key is not None
        store.drop(key)
    assert len(files(tmp_path)) == 1  # the first file went whole
    assert store.usage_bytes == UNIT and store.held_messages == 4
    store.close()
    assert files(tmp_path) == []


def test_a_full_store_refuses_until_a_unit_is_freed(tmp_path: Path) -> None:
    store = open_store(tmp_path, units=2)
    body = bytes(UNIT // 2)
    keys = [store.put(body) for _ in range(4)]
    assert all(keys)
    assert store.put(body) is None and store.full
    first = keys[0]
    assert first is not None
    store.take(first)
    assert store.full  # half a unit back is no unit back
    second = keys[1]
    assert second is not None
    store.take(second)
    assert not store.full
    assert store.put(body) is not None
    store.close()


def test_a_body_larger_than_a_unit_takes_a_file_of_its_own(tmp_path: Path) -> None:
    store = open_store(tmp_path, units=4)
    assert store.put(b"x") is not None
    big = store.put(bytes(UNIT * 2))
    assert big is not None and len(files(tmp_path)) == 2
    assert store.usage_bytes == UNIT + 2 * UNIT
    assert store.take(big) == bytes(UNIT * 2)
    store.close()


def test_opening_deletes_what_an_earlier_run_left(tmp_path: Path) -> None:
    first = open_store(tmp_path)
    assert first.put(b"left behind") is not None
    first.commit()  # and the process dies: nothing closes it
    second = open_store(tmp_path)
    assert files(tmp_path) == [] and second.held_messages == 0
    second.close()
