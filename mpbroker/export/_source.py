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
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import msgspec

from mpbroker.compression import CorruptBody, decompress
from mpbroker.storefiles import ARCHIVE_DIR, MARKER_NAME, MARKER_TEXT, SEGMENT_FORMAT, segment_index

from ._errors import ExportError
from ._schema import SourceMessage

__all__ = [
    "Batching",
    "Outcomes",
    "SegmentFile",
    "SegmentRead",
    "StoreDir",
    "StoreReader",
    "find_stores",
    "list_segments",
    "pending_counts",
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
        # Reads are one pass in key order: a page cache would hold what is never read again
        # (SQLite's default 2 MB per connection, times the connections open, was a quarter
        # of the export's memory).
        conn.execute(f"PRAGMA cache_size={_CACHE_KIB}")
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


# A message's settlement and delivery count sit in its own segment or a later one; these
# read them for a range of seqs (both tables are keyed by seq: an index range scan).
SETTLEMENTS_RANGE_SQL: Final = SETTLEMENTS_SQL + " WHERE seq BETWEEN ? AND ?"
DELIVERIES_RANGE_SQL: Final = DELIVERIES_SQL + " WHERE seq BETWEEN ? AND ?"
# Each connection's page cache (negative: KiB).
_CACHE_KIB: Final = -256
# Segment connections kept open at once while looking up outcomes (a long archive would
# otherwise hold three file descriptors per segment).
_OPEN_SEGMENTS: Final = 32


@dataclass(frozen=True, slots=True)
class Batching:
    """How much of a segment one step reads: at most `rows` messages and about `bytes` of
    them (body and headers as stored, plus `row_overhead` each for what a row costs in
    Python), so the export's memory does not grow with a segment's size. A batch is
    a row group of the file written."""

    rows: int = 20_000
    bytes: int = 16 << 20
    # Measured: a row's message, header dicts and row dict take about 3 KB in Python.
    row_overhead: int = 3_000


@dataclass(slots=True)
class Outcomes:
    """What the stores say of some seqs now: settlement (outcome, at_ms) and the newest
    delivery count."""

    settlements: dict[int, tuple[str, int]] = field(default_factory=dict)
    deliveries: dict[int, int] = field(default_factory=dict)


class StoreReader:
    """Read-only lookups in one store's segments (listed once, when the run starts), with a
    small cache of open connections. A segment retired meanwhile is found in the archive,
    or counts as gone."""

    def __init__(self, store: StoreDir, segments: list[SegmentFile]) -> None:
        self.store = store
        self.segments = segments
        self._open: OrderedDict[int, sqlite3.Connection] = OrderedDict()

    def _conn(self, seg: SegmentFile) -> sqlite3.Connection | None:
        conn = self._open.get(seg.index)
        if conn is not None:
            self._open.move_to_end(seg.index)
            return conn
        path = _present(seg)
        if path is None:
            return None
        conn = _connect(path)
        self._open[seg.index] = conn
        if len(self._open) > _OPEN_SEGMENTS:
            self._open.popitem(last=False)[1].close()
        return conn

    def present(self, index: int) -> bool:
        """The segment `index` is still there (in the store or its archive)."""
        return any(s.index == index and _present(s) is not None for s in self.segments)

    def outcomes(
        self, from_index: int, lo: int, hi: int, wanted: set[int] | None = None
    ) -> Outcomes:
        """Settlements and delivery counts of seqs in [lo, hi] (only those in `wanted`, when
        given: a few seqs spread over a long range keep only what they need in memory)
        recorded in segments from `from_index` on (where a message of segment `from_index`
        can have them)."""
        found = Outcomes()
        for seg in self.segments:
            if seg.index < from_index:
                continue
            conn = self._conn(seg)
            if conn is None:
                continue
            try:
                for seq, outcome, at_ms in conn.execute(SETTLEMENTS_RANGE_SQL, (lo, hi)):
                    if wanted is None or seq in wanted:
                        # Ack compaction copies rows forward unchanged: the first is as good.
                        found.settlements.setdefault(seq, (outcome, at_ms))
                # The newest segment's count wins (segments are listed oldest first).
                for seq, count in conn.execute(DELIVERIES_RANGE_SQL, (lo, hi)):
                    if wanted is None or seq in wanted:
                        found.deliveries[seq] = count
            except sqlite3.Error as exc:
                raise ExportError(seg.path, f"cannot read: {exc}") from exc
        return found

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].close()


@dataclass(slots=True)
class SegmentRead:
    """One segment read in one read transaction (a consistent snapshot, whatever the broker
    appends meanwhile): whether it was sealed then, and its message rows above the asked
    seq, ascending, in batches."""

    sealed: bool
    batches: Iterator[list[SourceMessage]]


@contextlib.contextmanager
def read_segment(
    seg: SegmentFile, after: int, batching: Batching, *, body: bool = True
) -> Iterator[SegmentRead | None]:
    """The segment's message rows with seq > `after`, read batch by batch while the context
    is open; None when the file was deleted since it was listed (retired without an
    archive). Without `body`, every body is empty and none is read."""
    path = _present(seg)
    if path is None:
        yield None
        return
    with open_segment(path) as conn:
        try:
            conn.execute("BEGIN")
            sealed_row = conn.execute(SEALED_SQL).fetchone()
            cursor = conn.execute(MESSAGES_SQL if body else MESSAGES_NO_BODY_SQL, (after,))
        except sqlite3.Error as exc:
            raise ExportError(seg.path, f"cannot read: {exc}") from exc
        sealed = bool(sealed_row and sealed_row[0]) or seg.archived
        try:
            yield SegmentRead(sealed, _batches(seg, cursor, batching))
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("COMMIT")


def _batches(
    seg: SegmentFile, cursor: sqlite3.Cursor, batching: Batching
) -> Iterator[list[SourceMessage]]:
    batch: list[SourceMessage] = []
    weight = 0
    while True:
        try:
            rows = cursor.fetchmany(256)
        except sqlite3.Error as exc:
            raise ExportError(seg.path, f"cannot read: {exc}") from exc
        if not rows:
            break
        for seq, message_id, destination, headers, stored, ts, prio, expires, size, enc in rows:
            try:
                decoded = _decode_headers(headers)
                plain = b"" if stored is None else decompress(stored, enc)
            except (msgspec.DecodeError, CorruptBody) as exc:
                raise ExportError(seg.path, f"message seq {seq}: {exc}") from exc
            batch.append(
                SourceMessage(seq, message_id, destination, decoded, plain, ts, prio, expires, size)
            )
            weight += len(plain) + len(headers) + batching.row_overhead
            if len(batch) >= batching.rows or weight >= batching.bytes:
                yield batch
                batch, weight = [], 0
    if batch:
        yield batch


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
