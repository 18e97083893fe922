"""The disk reserve: a file a store gives back when its filesystem is full, so that
settlements, segment retirement and opening still find room; on a real full filesystem (a
tmpfs the test mounts as root) and, for the pure parts, on any."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import pytest

from mpbroker.config import StoreSettings
from mpbroker.stores import MessageStore, StoreError
from mpbroker.stores._reserve import RESERVE_NAME, DiskReserve, is_disk_full
from tests.filesystems import fill, small_tmpfs

from .helpers import msg

KiB = 1024
SETTINGS = StoreSettings(disk_reserve_bytes=256 * KiB, segment_max_age_s=0)


def sqlite_error(code: int) -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError("database or disk is full")
    exc.sqlite_errorcode = code  # type: ignore[attr-defined]
    return exc


def test_full_filesystem_errors_are_told_from_others() -> None:
    assert is_disk_full(sqlite_error(sqlite3.SQLITE_FULL))
    assert is_disk_full(sqlite_error(sqlite3.SQLITE_IOERR_SHMSIZE))
    assert not is_disk_full(sqlite_error(sqlite3.SQLITE_CORRUPT))
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(None)


def test_a_store_error_tells_clients_no_server_path(tmp_path: Path) -> None:
    try:
        raise StoreError(tmp_path / "seg-1.db", "settle", "disk I/O error") from sqlite_error(
            sqlite3.SQLITE_IOERR
        )
    except StoreError as exc:
        assert exc.disk_full
        assert exc.client_text == "store error: settle: disk I/O error"
        assert str(tmp_path) in str(exc)


def test_a_reserve_is_made_once_released_once_and_owner_only(tmp_path: Path) -> None:
    reserve = DiskReserve(tmp_path, 64 * KiB)
    assert not reserve.held and not reserve.release()
    assert reserve.ensure() and reserve.held
    stat = (tmp_path / RESERVE_NAME).stat()
    assert (stat.st_size, stat.st_mode & 0o777) == (64 * KiB, 0o600)
    assert reserve.release() and not reserve.held
    assert not reserve.release()
    assert not DiskReserve(tmp_path, 0).ensure(), "size 0: no reserve"


def test_no_reserve_is_made_where_space_is_short(tmp_path: Path) -> None:
    huge = DiskReserve(tmp_path, 1 << 60)  # more than any filesystem has twice over
    assert not huge.ensure()
    assert not (tmp_path / RESERVE_NAME).exists()


def test_a_store_holds_its_reserve_from_the_first_open(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path / "s", SETTINGS) as store:
        assert store.reserve.held
        assert (tmp_path / "s" / RESERVE_NAME).stat().st_size == 256 * KiB


def test_a_drained_segment_is_rolled_and_retired_at_once_while_space_is_short(
    tmp_path: Path,
) -> None:
    with MessageStore.open(tmp_path, SETTINGS) as store:
        seqs = store.append([msg(1), msg(2)])
        store.settle(seqs[:1], "acked", 1)
        store.low_on_disk = True
        store.settle(seqs[1:], "acked", 1)  # the last live message of the active segment
        [active] = store.segments()
        assert active.index == 2 and active.messages == 0
        assert not (tmp_path / "seg-00000001.db").exists()
        # With room, a drained active segment stays (a new file per drain would be waste).
        store.low_on_disk = False
        store.settle(store.append([msg(3)]), "acked", 1)
        assert [s.index for s in store.segments()] == [2]


@pytest.fixture
def full_fs(tmp_path: Path) -> Path:
    with small_tmpfs(tmp_path / "fs", "4m") as mount:
        yield mount


def test_settling_on_a_full_filesystem_spends_the_reserve_and_frees_the_space(
    full_fs: Path,
) -> None:
    with MessageStore.open(full_fs / "s", SETTINGS) as store:
        seqs = store.append([msg(n, body=bytes(8 * KiB)) for n in range(1, 101)])
        fill(full_fs / "filler")
        with pytest.raises(StoreError) as refused:
            store.append([msg(101, body=bytes(8 * KiB))])
        assert refused.value.disk_full
        assert store.reserve.held, "an append never takes the reserve"
        store.low_on_disk = True
        store.settle(seqs, "acked", 1)  # needs room: the reserve gives it
        assert not store.reserve.held
        assert [s.index for s in store.segments()] == [2]
        # The space the messages held is free again: new messages fit.
        assert store.append([msg(102, body=bytes(8 * KiB))]) == [101]
    with MessageStore.open(full_fs / "s", SETTINGS) as store:
        assert [s.message.message_id for s in store.live()] == ["m102"]


def test_a_store_opens_on_a_full_filesystem_with_its_reserve(full_fs: Path) -> None:
    with MessageStore.open(full_fs / "s", SETTINGS) as store:
        store.append([msg(1)])
    fill(full_fs / "filler")
    with MessageStore.open(full_fs / "s", SETTINGS) as store:
        assert not store.reserve.held
        assert [s.seq for s in store.live()] == [1]
        store.settle([1], "acked", 1)


def test_without_a_reserve_a_full_filesystem_is_named_not_taken_for_corruption(
    full_fs: Path,
) -> None:
    settings = StoreSettings(disk_reserve_bytes=0)
    with MessageStore.open(full_fs / "s", settings) as store:
        store.append([msg(1)])
    fill(full_fs / "filler")
    with pytest.raises(StoreError) as refused:
        MessageStore.open(full_fs / "s", settings)
    assert "not an SQLite database" not in str(refused.value)
    assert "is its filesystem full?" in str(refused.value)
