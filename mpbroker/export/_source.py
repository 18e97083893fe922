"""Reading a broker's stores for the export: read-only, never blocking the broker.

Every segment file is opened read-only: ``mode=ro`` while its ``-wal`` file exists (the
broker has it open, or did not close it cleanly: the WAL holds committed rows), else
``immutable=1``, so the export of a stopped broker creates no side files in its directories.
A read transaction lasts one segment's snapshot; WAL readers never block the writer.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec

from mpbroker.compression import CorruptBody, decompress
from mpbroker.stores._segment import SEGMENT_FORMAT, segment_index
from mpbroker.stores._store import ARCHIVE_DIR, MARKER_NAME, MARKER_TEXT

from ._errors import ExportError
from ._schema import SourceMessage

__all__ = [
    "SegmentFile",
    "SegmentSnapshot",
    "StoreDir",
    "find_stores",
    "list_segments",
    "pending_counts",
    "read_outcomes",
    "read_segment",
]

_STORE_RE: Final = re.compile(r"^(p2p|pubsub)-(\d+)$")
# The export's reads (bench.exportrate's baseline runs the same ones without converting).
SETTLEMENTS_SQL: Final = "SELECT seq, outcome, at_ms FROM settlements"
DELIVERIES_SQL: Final = "SELECT seq, count FROM deliveries"
SEALED_SQL: Final = "SELECT value FROM meta WHERE key = 'sealed'"
MESSAGES_SQL: Final = (
    "SELECT seq, message_id, destination, headers, body, timestamp_ms, priority, expires_ms,"
    " size, encoding FROM messages WHERE seq > ? ORDER BY seq"
)
# For --no-body: the bodies are neither read from the file nor decompressed.
MESSAGES_NO_BODY_SQL: Final = MESSAGES_SQL.replace(" body,", " NULL,", 1)
PENDING_SQL: Final = "SELECT seq, COUNT(*) FROM pending WHERE seq BETWEEN ? AND ? GROUP BY seq"
_decode_headers = msgspec.msgpack.Decoder(dict[str, str]).decode


@dataclass(frozen=True, slots=True)
class StoreDir:
    name: str
    """e.g. ``p2p-0``."""
    path: Path
    registry: Path | None
    """A pubsub store's durable registry (``pubsub-N-durable.db``) when present."""


@dataclass(frozen=True, slots=True)
class SegmentFile:
    index: int
    path: Path
    archived: bool


@dataclass(frozen=True, slots=True)
class SegmentSnapshot:
    sealed: bool
    """Sealed when read: the segment holds every message it ever will."""
    messages: list[SourceMessage]
    """Rows above the asked seq, ascending."""


def find_stores(data_dir: Path) -> list[StoreDir]:
    """The stores in a data directory (``p2p-N``, ``pubsub-N`` with the store marker).

    ExportError naming the directory when it holds none, or a marker that is not ours.
    """
    if not data_dir.is_dir():
        raise ExportError(data_dir, "no such data directory")
    stores: list[StoreDir] = []
    for entry in sorted(data_dir.iterdir(), key=lambda p: p.name):
        m = _STORE_RE.match(entry.name)
        if m is None or not entry.is_dir():
            continue
        marker = entry / MARKER_NAME
        if not marker.exists():
            continue
        text = marker.read_text(errors="replace")
        if text != MARKER_TEXT:
            raise ExportError(marker, f"unknown store marker {text[:40]!r}")
        registry = data_dir / f"{entry.name}-durable.db" if m.group(1) == "pubsub" else None
        if registry is not None and not registry.exists():
            registry = None
        stores.append(StoreDir(entry.name, entry, registry))
    if not stores:
        raise ExportError(
            data_dir,
            f"not an mpbroker data directory (no p2p-N or pubsub-N store with a {MARKER_NAME}"
            " file)",
        )
    return stores


def list_segments(store: StoreDir) -> list[SegmentFile]:
    """Archived and present segment files, ascending index (a file moved to the archive
    while listing is listed once, archived)."""
    found: dict[int, SegmentFile] = {}
    for directory, archived in ((store.path, False), (store.path / ARCHIVE_DIR, True)):
        with contextlib.suppress(FileNotFoundError):
            for entry in directory.iterdir():
                index = segment_index(entry.name)
                if index is not None:
                    found[index] = SegmentFile(index, entry, archived)
    return [found[i] for i in sorted(found)]


def _connect(path: Path) -> sqlite3.Connection:
    wal = Path(f"{path}-wal")
    query = "mode=ro" if wal.exists() else "mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(
            f"{path.absolute().as_uri()}?{query}", uri=True, isolation_level=None
        )
        conn.execute("PRAGMA query_only=1")
        return conn
    except sqlite3.Error as exc:
        raise ExportError(path, f"cannot open read-only: {exc}") from exc


def _present(seg: SegmentFile) -> Path | None:
    """Where the segment is now: moved to the archive since it was listed, or None when it
    was retired without an archive (all its messages settled, its file deleted)."""
    if seg.path.exists():
        return seg.path
    moved = seg.path.parent / ARCHIVE_DIR / seg.path.name
    if not seg.archived and moved.exists():
        return moved
    return None


@contextlib.contextmanager
def open_segment(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to a segment file; ExportError naming the file when it is not
    an mpbroker segment."""
    conn = _connect(path)
    try:
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        except sqlite3.Error as exc:
            raise ExportError(path, f"not an mpbroker store segment ({exc})") from exc
        if row is None or row[0] != SEGMENT_FORMAT:
            raise ExportError(path, "not an mpbroker store segment (no format in meta)")
        yield conn
    finally:
        conn.close()


def read_outcomes(
    segments: list[SegmentFile],
) -> tuple[dict[int, tuple[str, int]], dict[int, int]]:
    """Every settlement (seq -> (outcome, at_ms)) and delivery count (seq -> count) recorded
    in `segments`: a message's settlement may sit in any later segment; the newest
    segment's delivery count wins."""
    settlements: dict[int, tuple[str, int]] = {}
    deliveries: dict[int, int] = {}
    for seg in segments:
        path = _present(seg)
        if path is None:
            continue
        try:
            with open_segment(path) as conn:
                for seq, outcome, at_ms in conn.execute(SETTLEMENTS_SQL):
                    # Ack compaction copies rows forward unchanged: the first one is as good.
                    settlements.setdefault(seq, (outcome, at_ms))
                deliveries.update(conn.execute(DELIVERIES_SQL))
        except sqlite3.Error as exc:
            raise ExportError(seg.path, f"cannot read: {exc}") from exc
    return settlements, deliveries


def read_segment(seg: SegmentFile, after: int, *, body: bool = True) -> SegmentSnapshot | None:
    """The segment's message rows with seq > `after`, in one read transaction (a consistent
    snapshot, whatever the broker appends meanwhile); None when the file was deleted since it
    was listed (retired without an archive). Without `body`, every body is empty."""
    path = _present(seg)
    if path is None:
        return None
    try:
        with open_segment(path) as conn:
            conn.execute("BEGIN")
            try:
                sealed_row = conn.execute(SEALED_SQL).fetchone()
                sql = MESSAGES_SQL if body else MESSAGES_NO_BODY_SQL
                rows = conn.execute(sql, (after,)).fetchall()
            finally:
                conn.execute("COMMIT")
    except sqlite3.Error as exc:
        raise ExportError(seg.path, f"cannot read: {exc}") from exc
    messages: list[SourceMessage] = []
    for seq, message_id, destination, headers, stored, ts, priority, expires, size, enc in rows:
        try:
            decoded = _decode_headers(headers)
            plain = b"" if stored is None else decompress(stored, enc)
        except (msgspec.DecodeError, CorruptBody) as exc:
            raise ExportError(seg.path, f"message seq {seq}: {exc}") from exc
        messages.append(
            SourceMessage(seq, message_id, destination, decoded, plain, ts, priority, expires, size)
        )
    sealed = bool(sealed_row and sealed_row[0]) or seg.archived
    return SegmentSnapshot(sealed, messages)


def pending_counts(registry: Path | None, first: int, last: int) -> dict[int, int]:
    """seq -> durable subscriptions still owing an ack, for seqs in [first, last]."""
    if registry is None:
        return {}
    conn = _connect(registry)
    try:
        return dict(conn.execute(PENDING_SQL, (first, last)).fetchall())
    except sqlite3.Error as exc:
        raise ExportError(registry, f"cannot read the durable registry: {exc}") from exc
    finally:
        conn.close()
