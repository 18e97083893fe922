"""Opening stores and segments: fresh, re-open, and everything that must be refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from mpbroker.config import StoreSettings
from mpbroker.stores import MIGRATIONS, MessageStore, StoreError

from .helpers import msg


def _applied(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT name FROM _migrations ORDER BY rowid")]
    finally:
        conn.close()


def test_fresh_store_runs_every_migration_in_wal_mode(tmp_path: Path) -> None:
    d = tmp_path / "p2p-0"
    with MessageStore.open(d, StoreSettings()) as store:
        seg = store.segments()[0].path
        assert seg == d / "seg-00000001.db"
    assert (d / "mpbroker-store").exists()
    assert _applied(seg) == [name for name, _ in MIGRATIONS]
    conn = sqlite3.connect(seg)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    finally:
        conn.close()
    assert meta["format"] == "mpbroker-segment" and meta["sealed"] == 0


def test_reopen_applies_nothing_twice_and_keeps_data(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path, StoreSettings()) as store:
        store.append([msg(1)])
    with MessageStore.open(tmp_path, StoreSettings()) as store:
        assert [m.message.message_id for m in store.live()] == ["m1"]
        path = store.segments()[0].path
        assert len(store.segments()) == 1
    assert _applied(path) == [name for name, _ in MIGRATIONS]


def test_newer_schema_refused(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path, StoreSettings()) as store:
        path = store.segments()[0].path
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO _migrations (name, applied_ms) VALUES ('9999_from_the_future', 0)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError) as info:
        MessageStore.open(tmp_path, StoreSettings())
    assert info.value.path == path
    assert "newer" in str(info.value) and "9999_from_the_future" in str(info.value)


def test_foreign_directory_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match=r"not an mpbroker store .*notes\.txt"):
        MessageStore.open(tmp_path, StoreSettings())
    assert not (tmp_path / "mpbroker-store").exists()


def test_foreign_marker_refused(tmp_path: Path) -> None:
    (tmp_path / "mpbroker-store").write_text("something else\n")
    with pytest.raises(StoreError, match="unknown store marker"):
        MessageStore.open(tmp_path, StoreSettings())


def test_segment_that_is_not_sqlite_refused(tmp_path: Path) -> None:
    MessageStore.open(tmp_path, StoreSettings()).close()
    bad = tmp_path / "seg-00000002.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="not an SQLite database") as info:
        MessageStore.open(tmp_path, StoreSettings())
    assert info.value.path == bad


def test_sqlite_file_of_someone_else_refused(tmp_path: Path) -> None:
    MessageStore.open(tmp_path, StoreSettings()).close()
    bad = tmp_path / "seg-00000002.db"
    conn = sqlite3.connect(bad)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="no _migrations table") as info:
        MessageStore.open(tmp_path, StoreSettings())
    assert info.value.path == bad


def test_half_created_segment_is_removed(tmp_path: Path) -> None:
    # A crash while creating a segment leaves only its temporary file.
    with MessageStore.open(tmp_path, StoreSettings()) as store:
        store.append([msg(1)])
    (tmp_path / "seg-00000002.db.tmp").write_bytes(b"partial")
    with MessageStore.open(tmp_path, StoreSettings()) as store:
        assert [s.index for s in store.segments()] == [1]
        assert [m.seq for m in store.live()] == [1]
    assert not (tmp_path / "seg-00000002.db.tmp").exists()
