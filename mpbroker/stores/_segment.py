"""One segment file: an SQLite database in WAL mode, its schema and named migrations.

A segment holds the messages appended while it was the active segment, plus the settlement
and delivery-count rows written while it was active (those may concern messages of older
segments). Once sealed (`meta.sealed = 1`) a segment file is never written again.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import sqlite_utils

from mpbroker.storefiles import SEGMENT_FORMAT, fsync_directory, segment_index, segment_name

from ._errors import StoreError, sqlite_detail
from ._live import LiveSet
from ._reserve import is_disk_full

__all__ = [
    "CHECKPOINT_PAGES",
    "MIGRATIONS",
    "NEW_SEGMENT_PAGES",
    "PAGE_BYTES",
    "SEGMENT_FORMAT",
    "Migration",
    "Segment",
    "applied_migrations",
    "apply_migrations",
    "cache_size_pragma",
    "configure_database",
    "connect_database",
    "create_segment",
    "fsync_directory",
    "open_segment",
    "segment_index",
    "segment_name",
]

# SQLite's own side files: a WAL database is the main file plus these two.
SIDE_SUFFIXES: Final = ("-wal", "-shm")
# The page size of a new store file and the WAL checkpoint threshold of every one (SQLite's
# defaults, set so that the disk_free_limit arithmetic, flow.append_need, can count on
# them): a commit that leaves CHECKPOINT_PAGES frames in a WAL copies them into its file.
PAGE_BYTES: Final = 4096
CHECKPOINT_PAGES: Final = 1000
# The most pages a new segment file has, and frames its creation writes to its WAL (9
# pages and 17 frames with the migrations below; tests/pipeline/test_disk.py checks the
# pages, and that no append takes more than the arithmetic says).
NEW_SEGMENT_PAGES: Final = 24


# ---------------------------------------------------------------------------------------------
# Named migrations. Each runs in its own transaction together with the row that records it in
# `_migrations`, so a crash leaves a segment either before or after a migration, never inside.
# Append new migrations at the end; never edit or reorder one that has shipped.


def _m0001_segment_tables(db: sqlite_utils.Database) -> None:
    # Untyped `value` column: integers stay integers, text stays text.
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value)")
    db.table("messages").create(
        {
            "seq": int,
            "message_id": str,
            "destination": str,
            "headers": bytes,  # msgspec msgpack of the headers dict: compact and fast to decode
            "body": bytes,
            "timestamp_ms": int,
            "priority": int,
            "expires_ms": int,
            "size": int,  # mpbroker.records.message_size(), for byte limits without decoding
        },
        pk="seq",
        not_null={
            "message_id",
            "destination",
            "headers",
            "body",
            "timestamp_ms",
            "priority",
            "expires_ms",
            "size",
        },
    )
    # Partial index: most messages never expire, and the expiry scan only wants those that do.
    db.execute("CREATE INDEX messages_expiry ON messages(expires_ms) WHERE expires_ms > 0")
    # Settlement of a message of this or an OLDER segment; one row per seq (settling twice
    # is a no-op), outcome in mpbroker.stores.OUTCOMES.
    db.table("settlements").create(
        {"seq": int, "outcome": str, "at_ms": int}, pk="seq", not_null={"outcome", "at_ms"}
    )
    # Latest delivery count of a message of this or an older segment (the newest segment's
    # row wins over older ones).
    db.table("deliveries").create({"seq": int, "count": int}, pk="seq", not_null={"count"})


def _m0002_message_encoding(db: sqlite_utils.Database) -> None:
    # The codec a compressed body is stored with (mpbroker.records.Message.encoding); ''
    # for a body stored as sent, which every message written before this migration is.
    db.execute("ALTER TABLE messages ADD COLUMN encoding TEXT NOT NULL DEFAULT ''")


Migration = tuple[str, Callable[[sqlite_utils.Database], None]]

MIGRATIONS: Final[tuple[Migration, ...]] = (
    ("0001_segment_tables", _m0001_segment_tables),
    ("0002_message_encoding", _m0002_message_encoding),
)
_KNOWN: Final = frozenset(name for name, _ in MIGRATIONS)


def _ensure_no_open_transaction(db: sqlite_utils.Database, path: Path, operation: str) -> None:
    # Guard in sqlite-utils' style: name the operation that refuses to run mid-transaction.
    if db.conn.in_transaction:
        raise StoreError(path, operation, "cannot run while a transaction is open")


def applied_migrations(db: sqlite_utils.Database) -> list[str]:
    return [row[0] for row in db.execute("SELECT name FROM _migrations ORDER BY rowid")]


def apply_migrations(
    db: sqlite_utils.Database,
    path: Path,
    clock_ms: int,
    migrations: Sequence[Migration] = MIGRATIONS,
) -> None:
    """Apply every migration not yet recorded in `_migrations`, each in its own transaction.

    `migrations` defaults to the segments' own; the topic store's registry has its list.
    """
    done = set(applied_migrations(db))
    for name, migration in migrations:
        if name in done:
            continue
        _ensure_no_open_transaction(db, path, f"migration {name}")
        db.conn.execute("BEGIN IMMEDIATE")
        try:
            migration(db)
            db.execute("INSERT INTO _migrations (name, applied_ms) VALUES (?, ?)", (name, clock_ms))
            db.conn.execute("COMMIT")
        except BaseException:
            if db.conn.in_transaction:
                db.conn.execute("ROLLBACK")
            raise


class Segment:
    """An open segment file and what the store keeps in memory about it."""

    __slots__ = (
        "base_seq",
        "conn",
        "created_ms",
        "db",
        "first_seq",
        "index",
        "last_seq",
        "live",
        "messages",
        "path",
        "sealed",
    )

    def __init__(self, path: Path, db: sqlite_utils.Database) -> None:
        self.path = path
        self.db = db
        # The hot path talks to the connection directly (explicit BEGIN IMMEDIATE/COMMIT);
        # sqlite_utils.Database serves schema work and migrations.
        self.conn: sqlite3.Connection = db.conn
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        self.index = int(meta["segment_index"])
        # The first seq this segment may hold: seqs continue across segments even when every
        # older segment was retired, so a restart never reuses a seq that settlement rows name.
        self.base_seq = int(meta["base_seq"])
        self.created_ms = int(meta["created_ms"])
        self.sealed = bool(meta.get("sealed", 0))
        first, last, count = db.execute(
            "SELECT MIN(seq), MAX(seq), COUNT(*) FROM messages"
        ).fetchone()
        self.first_seq: int | None = first
        self.last_seq: int | None = last
        self.messages: int = count
        # Seq and size of every message of this segment not settled yet (filled by the store).
        self.live = LiveSet()

    def size_bytes(self) -> int:
        """Logical database size (page_count x page_size). In WAL mode page_count includes
        committed frames still in the WAL, so this needs no checkpoint."""
        pages = self.conn.execute("PRAGMA page_count").fetchone()[0]
        page_size = self.conn.execute("PRAGMA page_size").fetchone()[0]
        return int(pages) * int(page_size)

    def rollback_quietly(self) -> None:
        # After a failed statement or COMMIT the transaction may or may not still be open
        # (SQLite rolls back by itself on some errors, e.g. SQLITE_FULL during COMMIT).
        with contextlib.suppress(sqlite3.Error):
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")

    def seal(self, *, checkpoint: bool = True) -> None:
        """Mark the segment sealed (committed) and checkpoint it into a self-contained file
        (`checkpoint` False: not for a segment about to be retired; on a full filesystem
        the checkpoint would need as much room as its WAL holds)."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('sealed', 1)")
            self.conn.execute("COMMIT")
        except BaseException:
            self.rollback_quietly()
            raise
        self.sealed = True
        if checkpoint:
            # So the Spark export can read a sealed file without its -wal.
            self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        self.conn.close()


def unreadable(path: Path, exc: sqlite3.DatabaseError) -> StoreError:
    """The error for a database file whose first read failed."""
    if is_disk_full(exc):
        # Reading a WAL database writes its shared-memory file: no room is not corruption,
        # and must not read like it.
        return StoreError(path, "open", f"{sqlite_detail(exc)}: is its filesystem full?")
    return StoreError(path, "open", f"not an SQLite database ({exc})")


def connect_database(path: Path) -> sqlite_utils.Database:
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        db = sqlite_utils.Database(conn, execute_plugins=False)
    except BaseException:
        conn.close()
        raise
    return db


def cache_size_pragma(cache_bytes: int) -> str:
    """The PRAGMA that bounds a connection's page cache (negative: KiB, not pages)."""
    return f"PRAGMA cache_size = -{max(1, cache_bytes // 1024)}"


def configure_database(
    db: sqlite_utils.Database, path: Path, synchronous: str, cache_bytes: int
) -> None:
    _ensure_no_open_transaction(db, path, "enable_wal()")
    db.execute(cache_size_pragma(cache_bytes))
    # (Only a file with no table yet takes a page size.)
    db.execute(f"PRAGMA page_size = {PAGE_BYTES}")
    db.enable_wal()
    db.execute(f"PRAGMA wal_autocheckpoint = {CHECKPOINT_PAGES}")
    # FULL in WAL mode fsyncs the WAL at every commit: nothing acknowledged is lost on power
    # loss. NORMAL fsyncs only at checkpoints: commits survive a process crash, not power loss.
    db.execute(f"PRAGMA synchronous={synchronous.upper()}")


def open_segment(path: Path, synchronous: str, now_ms: int, cache_bytes: int) -> Segment:
    """Open an existing segment file: check it is ours, migrate it, read its meta.

    Raises StoreError naming the file when it is not an SQLite database, not an mpbroker
    segment, or carries migrations this version does not know (a newer schema).
    """
    try:
        db = connect_database(path)
    except sqlite3.Error as exc:
        raise StoreError(path, "open", f"cannot open: {exc}") from exc
    try:
        try:
            tables = set(db.table_names())
        except sqlite3.DatabaseError as exc:
            raise unreadable(path, exc) from exc
        if "_migrations" not in tables:
            raise StoreError(path, "open", "not an mpbroker store segment (no _migrations table)")
        applied = applied_migrations(db)
        unknown = [name for name in applied if name not in _KNOWN]
        if unknown:
            raise StoreError(
                path,
                "open",
                f"segment schema is newer than this mpbroker: unknown migrations {unknown}",
            )
        if MIGRATIONS[0][0] not in applied:
            raise StoreError(path, "open", "not an mpbroker store segment (never initialised)")
        fmt = db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        if fmt is None or fmt[0] != SEGMENT_FORMAT:
            raise StoreError(
                path, "open", f"not an mpbroker store segment (format {fmt and fmt[0]!r})"
            )
        configure_database(db, path, synchronous, cache_bytes)
        # Schema upgrades of a sealed segment are the one change it may see; its data rows
        # are never written again.
        apply_migrations(db, path, now_ms)
        return Segment(path, db)
    except sqlite3.Error as exc:
        db.conn.close()
        raise StoreError(path, "open", str(exc)) from exc
    except BaseException:
        db.conn.close()
        raise


def create_segment(
    directory: Path, index: int, base_seq: int, synchronous: str, now_ms: int, cache_bytes: int
) -> Segment:
    """Create segment `index` completely under a temporary name, then rename it into place.

    A crash part-way leaves only a `*.tmp` file, which the next open removes: a file named
    seg-*.db is always a complete, initialised segment.
    """
    path = directory / segment_name(index)
    tmp = directory / (segment_name(index) + ".tmp")
    for leftover in (tmp, *(Path(f"{tmp}{s}") for s in SIDE_SUFFIXES)):
        leftover.unlink(missing_ok=True)
    try:
        db = connect_database(tmp)
        try:
            configure_database(db, tmp, synchronous, cache_bytes)
            db.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied_ms INTEGER)")
            apply_migrations(db, tmp, now_ms)
            meta: list[dict[str, object]] = [
                {"key": "format", "value": SEGMENT_FORMAT},
                {"key": "segment_index", "value": index},
                {"key": "base_seq", "value": base_seq},
                {"key": "created_ms", "value": now_ms},
                {"key": "sealed", "value": 0},
            ]
            with db.atomic():
                db.table("meta").insert_all(meta)
        finally:
            # Closing the last connection checkpoints and removes the -wal, so the rename
            # below moves one self-contained file.
            db.conn.close()
        os.replace(tmp, path)
        fsync_directory(directory)
    except (sqlite3.Error, OSError) as exc:
        raise StoreError(path, "create segment", str(exc)) from exc
    return open_segment(path, synchronous, now_ms, cache_bytes)
