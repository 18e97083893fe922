"""Opening stores and segments: fresh, re-open, and everything that must be refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest

from mpbroker.compression import compress
from mpbroker.config import StoreSettings
from mpbroker.stores import MIGRATIONS, MessageStore, StoreError
from mpbroker.stores._segment import (
    apply_migrations,
    configure_database,
    connect_database,
    segment_name,
)
from mpbroker.stores._store import MARKER_NAME, MARKER_TEXT

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


def _segment_before_0002(directory: Path, index: int, *, sealed: bool) -> Path:
    """A segment as the release before migration 0002 wrote it: no `encoding` column,
    holding messages seq `index * 10 + 1` and `+ 2`."""
    directory.mkdir(exist_ok=True)
    (directory / MARKER_NAME).write_text(MARKER_TEXT)
    path = directory / segment_name(index)
    db = connect_database(path)
    try:
        configure_database(db, path, "normal", 256 * 1024)
        db.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied_ms INTEGER)")
        apply_migrations(db, path, 1, MIGRATIONS[:1])
        base = index * 10 + 1
        db.conn.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?)",
            [
                ("format", "mpbroker-segment"),
                ("segment_index", index),
                ("base_seq", base),
                ("created_ms", 1),
                ("sealed", int(sealed)),
            ],
        )
        db.conn.executemany(
            "INSERT INTO messages (seq, message_id, destination, headers, body, timestamp_ms,"
            " priority, expires_ms, size) VALUES (?, ?, '/queue/a', ?, ?, 1, 4, 0, 3)",
            [(seq, f"old{seq}", msgspec.msgpack.encode({}), b"old") for seq in (base, base + 1)],
        )
        assert "encoding" not in db["messages"].columns_dict
    finally:
        db.conn.close()
    return path


def test_segments_written_before_the_encoding_column_migrate_on_open(tmp_path: Path) -> None:
    sealed = _segment_before_0002(tmp_path, 1, sealed=True)
    active = _segment_before_0002(tmp_path, 2, sealed=False)
    packed, encoding = compress(b"new body " * 200, "zstd")
    settings = StoreSettings(segment_max_age_s=0)  # created_ms 1 would roll it at once
    with MessageStore.open(tmp_path, settings) as store:
        old = store.live()
        assert [(m.seq, m.message.message_id, m.message.body) for m in old] == [
            (11, "old11", b"old"),
            (12, "old12", b"old"),
            (21, "old21", b"old"),
            (22, "old22", b"old"),
        ]
        assert {m.message.encoding for m in old} == {""}
        assert store.read(12).message.encoding == ""
        [seq] = store.append([msgspec.structs.replace(msg(5, body=packed), encoding=encoding)])
        assert seq == 23
        assert store.segments()[-1].path == active  # still the active segment
    for path in (sealed, active):
        assert _applied(path) == ["0001_segment_tables", "0002_message_encoding"]
    with MessageStore.open(tmp_path, settings) as store:
        assert store.read(23).message.body == packed
        assert store.read(23).message.encoding == "zstd"
        assert [m.message.encoding for m in store.live()] == ["", "", "", "", "zstd"]
