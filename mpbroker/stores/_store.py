"""MessageStore: one partition's persistent messages as a sequence of SQLite segment files.

Layout of a store directory (one per partition, e.g. ``data_dir/p2p-0``)::

    mpbroker-store          marker: refuses to adopt a directory that is not a store
    seg-00000001.db         sealed segments (never written again) ...
    seg-00000007.db         ... and the active segment, the only one written
    archive/seg-*.db        retired segments when settings.archive is true

Messages are appended to the active segment; settlements (acked, expired, dead-lettered) and
delivery counts are appended to the active segment too, whichever segment holds the message.
A sealed segment whose messages are all settled is retired as a whole (unlinked or moved to
the archive) instead of deleting rows one by one. Before a segment is retired, its settlement
and delivery rows for messages of OLDER segments still present are carried forward into the
active segment (ack compaction), so a restart never resurrects a settled message.

In memory the store keeps, per segment, the seq and size of every unsettled message (a
LiveSet: a few bytes a message, so a backlog nobody consumes does not pin memory) and, per
redelivered unsettled message, its delivery count: retirement, settle and statistics need no
scan. A delivery row is what says a message was delivered before (`redelivered`); its count
says how many of those deliveries count against `max_redeliveries`, so a message returned
only through the broker's own failure has a row with count 0 (`record_delivery(counted=
False)`). A count the filesystem could not take stays in memory, marked unwritten, and is
written with the next delivery rows, by `write_delivery_counts`, or before a clean stop.
The store is used by one thread of one process (the partition's pipeline worker), the only
writer of its directory.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, TypeVar

import msgspec

from mpbroker.config import StoreSettings
from mpbroker.records import Message, message_size
from mpbroker.storefiles import ARCHIVE_DIR, MARKER_NAME, MARKER_TEXT, OUTCOMES

from ._errors import StoreError, sqlite_detail
from ._live import LiveSet
from ._reserve import DiskReserve
from ._segment import (
    SIDE_SUFFIXES,
    Segment,
    create_segment,
    fsync_directory,
    open_segment,
    segment_index,
    segment_name,
)

__all__ = [
    "MESSAGE_OVERHEAD_BYTES",
    "OUTCOMES",
    "MessageStore",
    "RowWrites",
    "SegmentInfo",
    "StoreStatistics",
    "StoredMessage",
]

log = logging.getLogger(__name__)

# "unsubscribed": a durable topic subscription was removed with its backlog (TopicStore).
# Written by `mark_clean_stop` as the owner stops in order; taken (removed) by the next open.
CLEAN_STOP_NAME: Final = "clean-stop"

_encode_headers = msgspec.msgpack.Encoder().encode
_decode_headers = msgspec.msgpack.Decoder(dict[str, str]).decode

_INSERT_MESSAGE: Final = (
    "INSERT INTO messages (seq, message_id, destination, headers, body, timestamp_ms,"
    " priority, expires_ms, size, encoding) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_SELECT_MESSAGE: Final = (
    "SELECT seq, message_id, destination, headers, body, timestamp_ms, priority, expires_ms,"
    " size, encoding FROM messages"
)
# Everything but the body: the index entry of a paged message (see live(full=)). The
# headers come too: selectors read them without reading the body back.
_SELECT_INDEX: Final = (
    "SELECT seq, message_id, destination, headers, timestamp_ms, priority, expires_ms, size,"
    " encoding FROM messages"
)
_INSERT_SETTLEMENT: Final = (
    "INSERT OR IGNORE INTO settlements (seq, outcome, at_ms) VALUES (?, ?, ?)"
)
_UPSERT_DELIVERY: Final = (
    "INSERT INTO deliveries (seq, count) VALUES (?, ?)"
    " ON CONFLICT(seq) DO UPDATE SET count = excluded.count"
)


MessageRow = tuple[int, str, str, bytes, bytes, int, int, int, int, str]

# What a message row takes besides its text and blob columns: its integer columns, SQLite's
# record and cell headers and cell pointer, its entry in the expiry index.
ROW_FIXED_BYTES: Final = 96
# ...and with a message id and destination of up to about 150 bytes together and msgpack's
# few bytes a header: what the configuration's bound on an append (flow.append_margin)
# counts a message beyond its counted size. An append of longer ones is checked by its own
# rows (`MessageStore.disk_guard`).
MESSAGE_OVERHEAD_BYTES: Final = 256
# The B-trees of a segment an append inserts into: the messages table and its expiry index.
_SEGMENT_PLACES: Final = 2

# One transaction's rows for `MessageStore.disk_guard`: their sizes as stored, and at how
# many places of its database's B-trees they go.
RowWrites = tuple[list[int], int]


def message_from_row(row: MessageRow, deliveries: int, redelivered: bool | None = None) -> Message:
    """A stored message (a row of `_SELECT_MESSAGE`) as the broker keeps it; `redelivered`
    defaults to `deliveries > 0`."""
    (
        seq,
        message_id,
        destination,
        headers,
        body,
        timestamp_ms,
        priority,
        expires_ms,
        size,
        encoding,
    ) = row
    return Message(
        message_id=message_id,
        destination=destination,
        headers=_decode_headers(headers),
        body=body,
        timestamp_ms=timestamp_ms,
        persistent=True,
        priority=priority,
        expires_ms=expires_ms,
        redelivered=deliveries > 0 if redelivered is None else redelivered,
        size=size,
        seq=seq,
        deliveries=deliveries,
        encoding=encoding,
    )


IndexRow = tuple[int, str, str, bytes, int, int, int, int, str]
_Row = TypeVar("_Row", MessageRow, IndexRow)
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as the store gives it back."""

    seq: int
    """Store-assigned reference, strictly increasing across segments."""
    message: Message
    """The message; `persistent` is True, `redelivered` says whether it was delivered
    before (a delivery row), and its own `seq` and `deliveries` fields are filled in too."""
    deliveries: int
    """Delivery attempts that came back (NACK, consumer gone); survives restarts."""


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment file present in the store directory (archived ones are not listed)."""

    path: Path
    """The segment file."""
    index: int
    """Its number in the sequence (seg-<index>.db)."""
    first_seq: int | None
    """Lowest seq of a message in it; None when it holds no messages."""
    last_seq: int | None
    """Highest seq of a message in it; None when it holds no messages."""
    sealed: bool
    """True once it is no longer the active segment: the file is immutable."""
    messages: int
    """Messages stored in it (settled or not)."""
    live: int
    """Messages in it not settled yet; a sealed segment is retired when this reaches 0."""


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    """A snapshot of a store's counters (the admin API shows them)."""

    segments: int
    """Segment files present, the active one included (archived ones not counted)."""
    active_segment: Path
    """The segment appends go to."""
    active_segment_bytes: int
    """Logical size of the active segment; it rolls past `segment_max_bytes`."""
    live_messages: int
    """Messages stored and not settled."""
    live_bytes: int
    """Sum of `message_size()` of the live messages."""
    retired_segments: int
    """Segments retired (deleted or archived) since this store was opened."""
    appends: int
    """Messages appended since open."""
    append_transactions: int
    """Committed append transactions since open (appends / this = group-commit batch size)."""
    settles: int
    """Messages settled since open (settling an unknown or settled seq does not count)."""


class MessageStore:
    """One partition's persistent messages. Create with :meth:`open`."""

    def __init__(
        self,
        directory: Path,
        settings: StoreSettings,
        segments: list[Segment],
        clock: Callable[[], float],
    ) -> None:
        self.directory = directory
        self.settings = settings
        self._segments = segments  # ascending index; the last one is the active segment
        self._bases = [s.base_seq for s in segments]  # for bisect: seq -> owning segment
        self._clock = clock
        self._closed = False
        # Live seq -> counted deliveries; present (even at 0) = delivered before.
        self._deliveries: dict[int, int] = {}
        # Seqs whose entry in _deliveries the filesystem has not taken yet.
        self._unwritten: set[int] = set()
        self._next_seq = 1
        self._active_bytes = 0
        self._retired = 0
        self._appends = 0
        self._append_transactions = 0
        self._settles = 0
        # Told (destination, size) of every message it settles: flow control's counts of
        # what a topic store holds per destination.
        self.on_settled: Callable[[list[tuple[str, int]]], None] | None = None
        # Whether the last owner stopped in order (`mark_clean_stop`): then the delivery
        # counts are complete, and a message never counted was never delivered. After a
        # crash any live message may have reached a client.
        self.stopped_cleanly = False
        # Given back to the filesystem when a write that frees space finds it full.
        self.reserve = DiskReserve(directory, settings.disk_reserve_bytes)
        # Set by the owner while producers are stopped for store.disk_free_limit_bytes: an
        # active segment whose messages are all settled is then rolled at once, so that
        # draining frees its file (otherwise it waits for its size or age).
        self.low_on_disk = False
        # Set by the owner (pipeline.DiskWatch, store.disk_free_limit_bytes): told before
        # every append what it writes, per database (this store's segment first); raises
        # StoreError (DiskLimitReached) to refuse the append before anything is written,
        # its segment roll and WAL checkpoint included.
        self.disk_guard: Callable[[list[RowWrites]], None] | None = None

    # -- opening ------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path,
        settings: StoreSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> MessageStore:
        """Open the store in `directory`, creating it (and its first segment) if needed.

        `clock` (seconds since the epoch) dates segments for `segment_max_age_s`; tests pass
        their own. Raises StoreError naming the file when the directory is not a store, or a
        segment is foreign or has a newer schema.
        """
        directory = Path(directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            _check_marker(directory)
            _remove_leftovers(directory)
            stopped_cleanly = _take_clean_stop(directory)
        except OSError as exc:
            raise StoreError(directory, "open", str(exc)) from exc
        reserve = DiskReserve(directory, settings.disk_reserve_bytes)
        try:
            store = cls._open_segments(directory, settings, clock)
        except StoreError as exc:
            # Opening writes too (the WAL's shared-memory file, a new active segment): on a
            # full filesystem the reserve makes room for it.
            if not (exc.disk_full and reserve.release()):
                raise
            store = cls._open_segments(directory, settings, clock)
        store.stopped_cleanly = stopped_cleanly
        store.reserve.ensure()
        return store

    @classmethod
    def _open_segments(
        cls, directory: Path, settings: StoreSettings, clock: Callable[[], float]
    ) -> MessageStore:
        now_ms = int(clock() * 1000)
        indexes = sorted(
            i for i in (segment_index(p.name) for p in directory.iterdir()) if i is not None
        )
        segments: list[Segment] = []
        try:
            for i in indexes:
                segments.append(
                    open_segment(
                        directory / segment_name(i),
                        settings.synchronous,
                        now_ms,
                        settings.sqlite_cache_bytes,
                    )
                )
            store = cls(directory, settings, segments, clock)
            store._rebuild()
            store._ensure_active()
            store._retire_settled()
        except BaseException:
            for seg in segments:
                seg.close()
            raise
        return store

    def _rebuild(self) -> None:
        """Rebuild the in-memory state from the segment files (start-up, after a crash too)."""
        settled: set[int] = set()
        for seg in self._segments:
            settled.update(row[0] for row in seg.conn.execute("SELECT seq FROM settlements"))
        next_seq = 1
        for seg in self._segments:
            rows = seg.conn.execute("SELECT seq, size FROM messages ORDER BY seq")
            seg.live = LiveSet.from_items(row for row in rows if row[0] not in settled)
            # Older segments first, so the newest segment's count wins.
            self._deliveries.update(seg.conn.execute("SELECT seq, count FROM deliveries"))
            next_seq = max(next_seq, seg.base_seq, (seg.last_seq or 0) + 1)
            # Only the last segment can be unsealed; an older unsealed one (a crash between
            # a roll's creating the next segment and sealing this one) is treated as sealed
            # and never written.
        self._deliveries = {s: c for s, c in self._deliveries.items() if self._is_live(s)}
        self._next_seq = next_seq
        for seg in self._segments[:-1]:
            seg.sealed = True
        if self._segments and not self._segments[-1].sealed:
            self._active_bytes = self._segments[-1].size_bytes()

    # -- guards -------------------------------------------------------------------------------

    def _ensure_open(self, operation: str) -> None:
        if self._closed:
            raise StoreError(self.directory, operation, "the store is closed")

    def _ensure_active(self, *, reserve: bool = True) -> Segment:
        """The active segment, creating one when there is none or the last one is sealed
        (first open, or a roll interrupted by a crash or an error after sealing).
        `reserve`: a full filesystem may have the disk reserve (never for appends)."""
        if self._segments and not self._segments[-1].sealed:
            return self._segments[-1]
        return self._adopt(self._create_next(reserve=reserve))

    def _create_next(self, *, reserve: bool) -> Segment:
        """A new empty segment after the last one, not yet the active one (`_adopt`)."""
        index = self._segments[-1].index + 1 if self._segments else 1
        return self._spending_reserve(
            reserve,
            lambda: create_segment(
                self.directory,
                index,
                self._next_seq,
                self.settings.synchronous,
                int(self._clock() * 1000),
                self.settings.sqlite_cache_bytes,
            ),
        )

    def _adopt(self, seg: Segment) -> Segment:
        """`seg` becomes the active segment."""
        self._segments.append(seg)
        self._bases.append(seg.base_seq)
        self._active_bytes = seg.size_bytes()
        return seg

    # -- writing ------------------------------------------------------------------------------

    def append(
        self, messages: Sequence[Message], *, also_writes: Sequence[RowWrites] = ()
    ) -> list[int]:
        """Store `messages` in ONE transaction (the group-commit unit); their seqs, in order.

        Rolls to a new segment first when the active one is past `segment_max_bytes` or
        `segment_max_age_s`. When this returns the messages are durable per `synchronous`.
        On failure raises StoreError and nothing of the batch is stored (ValueError for a
        message whose preset `size` is negative). `also_writes`: what the caller writes
        right after to other databases of the same filesystem, for the `disk_guard`.
        """
        self._ensure_open("append()")
        if not messages:
            return []
        first = self._next_seq
        rows: list[MessageRow] = []
        sizes: list[int] = []
        guard = self.disk_guard
        # For the guard: what each row takes in the segment, at most.
        stored: list[int] = []
        for offset, m in enumerate(messages):
            size = m.size or message_size(m)
            if size < 0:
                # Refused before the commit: the in-memory LiveSet would refuse it after.
                raise ValueError(f"message {m.message_id!r}: size {size} is negative")
            sizes.append(size)
            headers = _encode_headers(m.headers)
            rows.append(
                (
                    first + offset,
                    m.message_id,
                    m.destination,
                    headers,
                    m.body,
                    m.timestamp_ms,
                    m.priority,
                    m.expires_ms,
                    size,
                    m.encoding,
                )
            )
            if guard is not None:
                destination = m.destination
                stored.append(
                    len(m.body)
                    + len(headers)
                    + len(m.message_id)
                    + (len(destination) if destination.isascii() else len(destination.encode()))
                    + len(m.encoding)
                    + ROW_FIXED_BYTES
                )
        if guard is not None:
            guard([(stored, _SEGMENT_PLACES), *also_writes])
        self._roll_if_due()
        seg = self._ensure_active(reserve=False)
        conn = seg.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(_INSERT_MESSAGE, rows)
            conn.execute("COMMIT")
        except BaseException as exc:
            seg.rollback_quietly()
            if isinstance(exc, sqlite3.Error):
                raise StoreError(seg.path, "append", sqlite_detail(exc)) from exc
            raise
        seqs = list(range(first, first + len(rows)))
        self._next_seq = first + len(rows)
        seg.live.extend(first, sizes)
        if seg.first_seq is None:
            seg.first_seq = first
        seg.last_seq = seqs[-1]
        seg.messages += len(rows)
        self._appends += len(rows)
        self._append_transactions += 1
        with contextlib.suppress(sqlite3.Error):  # only a statistic and the roll trigger
            self._active_bytes = seg.size_bytes()
        return seqs

    def settle(self, seqs: Sequence[int], outcome: str, at_ms: int) -> None:
        """Record that messages are done with (`acked`, `expired`, `dead-lettered` or
        `unsubscribed`).

        One transaction, appended to the active segment. Unknown or already settled seqs
        are ignored. Sealed segments left with no live message are retired afterwards.
        """
        self._ensure_open("settle()")
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome {outcome!r}: must be one of {sorted(OUTCOMES)}")
        owned: dict[int, Segment] = {}
        for seq in seqs:
            seg = self._owner(seq)
            if seg is not None and seq in seg.live:
                owned[seq] = seg
        if not owned:
            return
        settled = self._describe(owned) if self.on_settled is not None else []
        active = self._ensure_active()
        self._write(active, "settle", [(_INSERT_SETTLEMENT, [(s, outcome, at_ms) for s in owned])])
        if self.on_settled is not None:
            self.on_settled(settled)
        for seq, seg in owned.items():
            seg.live.discard(seq)
            self._deliveries.pop(seq, None)
            self._unwritten.discard(seq)
        self._settles += len(owned)
        if self.low_on_disk and active.messages and not active.live:
            # Drained while space is short: seal it now so that its file goes (unchecked:
            # it is retired at once).
            try:
                self._roll(reserve=True, checkpoint=False)
            except StoreError as exc:
                log.warning("store: cannot roll the drained segment %s yet: %s", active.path, exc)
        self._retire_settled()

    def _describe(self, owned: dict[int, Segment]) -> list[tuple[str, int]]:
        """(destination, size) of messages about to be settled, for `on_settled`."""
        by_segment: dict[Segment, list[int]] = {}
        for seq, seg in owned.items():
            by_segment.setdefault(seg, []).append(seq)
        found: list[tuple[str, int]] = []
        for seg, seqs in by_segment.items():
            for start in range(0, len(seqs), 500):
                part = seqs[start : start + 500]
                marks = ",".join("?" * len(part))
                try:
                    rows = seg.conn.execute(
                        f"SELECT destination, size FROM messages WHERE seq IN ({marks})", part
                    ).fetchall()
                except sqlite3.Error as exc:
                    raise StoreError(seg.path, "settle", sqlite_detail(exc)) from exc
                found += rows
        return found

    def record_delivery(self, seqs: Sequence[int], *, counted: bool = True) -> None:
        """Record, persistently, that a delivery of each live seq came back: counted (one
        more against `max_redeliveries`), or only flagged (`counted=False`: the broker's
        own failure brought it back; the message is marked delivered before).

        The counts are kept in memory first: if the filesystem cannot take them (StoreError
        is raised), they are written with the next ones, by `write_delivery_counts`, or
        before a clean stop, so `redelivered` survives a full disk."""
        self._ensure_open("record_delivery()")
        counts: dict[int, int] = {}
        for seq in seqs:
            seg = self._owner(seq)
            if seg is None or seq not in seg.live:
                continue
            known = counts.get(seq, self._deliveries.get(seq))
            if counted:
                counts[seq] = (known or 0) + 1
            elif known is None:
                counts[seq] = 0
        if not counts:
            return
        self._deliveries.update(counts)
        self._unwritten.update(counts)
        self.write_delivery_counts()

    @property
    def unwritten_deliveries(self) -> int:
        """Delivery counts kept in memory that the filesystem has not taken yet."""
        return len(self._unwritten)

    def write_delivery_counts(self) -> None:
        """Write the delivery counts not written yet (StoreError if it still cannot)."""
        self._ensure_open("write_delivery_counts()")
        rows = [(seq, self._deliveries[seq]) for seq in self._unwritten if seq in self._deliveries]
        if rows:
            active = self._ensure_active()
            self._write(active, "record_delivery", [(_UPSERT_DELIVERY, rows)])
        self._unwritten.clear()

    def roll(self) -> None:
        """Seal the active segment and start a new one (no-op if the active one is empty of
        messages and settlement rows would be all it carries). Retires what became retirable."""
        self._roll(reserve=True)

    def _roll(self, *, reserve: bool, checkpoint: bool = True) -> None:
        self._ensure_open("roll()")
        active = self._ensure_active(reserve=reserve)
        if active.messages == 0:
            return

        def seal() -> None:
            try:
                active.seal(checkpoint=checkpoint)
            except sqlite3.Error as exc:
                raise StoreError(active.path, "seal", sqlite_detail(exc)) from exc

        # The successor first: sealing with no room left for it would leave the store no
        # segment to write settlements to (every ACK refused until there is room).
        successor = self._create_next(reserve=reserve)
        try:
            self._spending_reserve(reserve, seal)
        except BaseException:
            successor.close()
            for f in _files_of(successor):
                f.unlink(missing_ok=True)
            raise
        self._adopt(successor)
        self._retire_settled()

    def _roll_if_due(self) -> None:
        active = self._ensure_active(reserve=False)
        if active.messages == 0:
            # Rolling an empty segment would only make an empty sealed one to retire.
            return
        max_age_s = self.settings.segment_max_age_s
        too_old = max_age_s > 0 and self._clock() * 1000 - active.created_ms >= max_age_s * 1000
        if too_old or self._active_bytes >= self.settings.segment_max_bytes:
            self._roll(reserve=False)

    def _write(
        self,
        seg: Segment,
        operation: str,
        statements: Sequence[tuple[str, Sequence[Sequence[object]]]],
    ) -> None:
        """One transaction of bookkeeping (settlements, delivery counts): writes that let
        space be freed, so a full filesystem may have the disk reserve for them."""

        def write() -> None:
            conn = seg.conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                for sql, rows in statements:
                    conn.executemany(sql, rows)
                conn.execute("COMMIT")
            except BaseException as exc:
                seg.rollback_quietly()
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(seg.path, operation, sqlite_detail(exc)) from exc
                raise

        self._spending_reserve(True, write)

    def _spending_reserve(self, allowed: bool, work: Callable[[], _T]) -> _T:
        """`work`, and once more if it found the filesystem full and the disk reserve could
        be given back (`allowed`: never for appends, which would only fill it again)."""
        try:
            return work()
        except StoreError as exc:
            if not (allowed and exc.disk_full and self.reserve.release()):
                raise
        return work()

    # -- retirement ---------------------------------------------------------------------------

    def _owner(self, seq: int) -> Segment | None:
        """The present segment holding message `seq`, or None (never stored, or retired)."""
        i = bisect.bisect_right(self._bases, seq) - 1
        if i < 0:
            return None
        seg = self._segments[i]
        # Seqs of a segment are contiguous from its first message to its last, so a seq past
        # last_seq belongs to a segment that was retired (or is not stored at all).
        if (
            seg.first_seq is None
            or seg.last_seq is None
            or not seg.first_seq <= seq <= seg.last_seq
        ):
            return None
        return seg

    def _is_live(self, seq: int) -> bool:
        seg = self._owner(seq)
        return seg is not None and seq in seg.live

    def _retire_settled(self) -> None:
        """Retire every sealed segment with no live message, oldest first."""
        for seg in list(self._segments[:-1]):
            if seg.sealed and not seg.live:
                try:
                    self._retire(seg)
                except (StoreError, OSError, sqlite3.Error) as exc:
                    # The settlement that made it retirable is committed; retiring is retried
                    # at the next settle or open, so report it and carry on.
                    log.warning("store: cannot retire %s yet: %s", seg.path, exc)
                    return

    def _retire(self, seg: Segment) -> None:
        active = self._segments[-1]
        # Ack compaction: rows here about messages of older segments still present must
        # outlive this file, or a restart would resurrect those settled messages.
        carried_settlements: list[tuple[int, str, int]] = []
        for seq, outcome, at_ms in seg.conn.execute(
            "SELECT seq, outcome, at_ms FROM settlements WHERE seq < ?", (seg.base_seq,)
        ):
            owner = self._owner(seq)
            if owner is not None and owner is not seg:
                carried_settlements.append((seq, outcome, at_ms))
        carried_deliveries = [
            (seq, self._deliveries[seq])
            for (seq,) in seg.conn.execute(
                "SELECT seq FROM deliveries WHERE seq < ?", (seg.base_seq,)
            )
            if seq in self._deliveries
        ]
        if carried_settlements or carried_deliveries:
            self._write(
                active,
                "carry settlements forward",
                [(_INSERT_SETTLEMENT, carried_settlements), (_UPSERT_DELIVERY, carried_deliveries)],
            )
        with contextlib.suppress(sqlite3.Error):
            seg.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        seg.close()
        files = _files_of(seg)
        if self.settings.archive:
            archive = self.directory / ARCHIVE_DIR
            archive.mkdir(exist_ok=True)
            # Side files first: the main file's presence in the store directory is what says
            # "not retired yet" to a restart.
            for f in reversed(files):
                if f.exists():
                    os.replace(f, archive / f.name)
            fsync_directory(archive)
        else:
            for f in reversed(files):
                f.unlink(missing_ok=True)
        fsync_directory(self.directory)
        i = self._segments.index(seg)
        del self._segments[i]
        del self._bases[i]
        self._retired += 1

    # -- reading ------------------------------------------------------------------------------

    def live(self, *, full: int | None = None) -> list[StoredMessage]:
        """Every unsettled message in delivery order: priority DESC, then seq ASC.

        With `full=N` only the first N come whole; the others come paged (`paged=True`,
        empty body, headers kept for selectors) and their bodies are never read, so a restart
        with a huge backlog holds only index entries in memory, plus the N bodies the queue
        engine keeps cached (`index_cache_entries`). Read a paged one back with `read()`.
        """
        self._ensure_open("live()")
        if full is None:
            result = self._scan_live(_SELECT_MESSAGE, self._stored)
        else:
            if full < 0:
                raise ValueError(f"full = {full}: must be >= 0")
            result = self._scan_live(_SELECT_INDEX, self._paged)
        result.sort(key=lambda m: (-m.message.priority, m.seq))
        if full is not None:
            for i in range(min(full, len(result))):
                result[i] = self.read(result[i].seq)
        return result

    def _scan_live(self, sql: str, build: Callable[[_Row], StoredMessage]) -> list[StoredMessage]:
        result: list[StoredMessage] = []
        for seg in self._segments:
            if not seg.live:
                continue
            keep = seg.live
            try:
                for row in seg.conn.execute(sql):
                    if row[0] in keep:
                        result.append(build(row))
            except sqlite3.Error as exc:
                raise StoreError(seg.path, "live", sqlite_detail(exc)) from exc
        return result

    def live_seqs(self) -> list[int]:
        """The seqs of every unsettled message, ascending (from memory: no I/O)."""
        self._ensure_open("live_seqs()")
        # Segments hold ascending, disjoint seq ranges.
        return [seq for seg in self._segments for seq in seg.live]

    def read(self, seq: int) -> StoredMessage:
        """One live message; KeyError when `seq` is unknown or settled."""
        seg = self._live_segment(seq, "read()")
        try:
            row = seg.conn.execute(_SELECT_MESSAGE + " WHERE seq = ?", (seq,)).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(seg.path, "read", sqlite_detail(exc)) from exc
        return self._stored(row)

    def read_ahead(self, seq: int, max_messages: int, max_bytes: int) -> list[StoredMessage]:
        """Live message `seq` and the live ones after it in its segment, in seq order: at
        most `max_messages`, and past the first only while their bodies stay within
        `max_bytes` together. One query where `read` would make one per message (a queue
        draining its paged backlog reads its messages in this order). KeyError when `seq`
        is unknown or settled."""
        seg = self._live_segment(seq, "read_ahead()")
        live = seg.live
        found: list[StoredMessage] = []
        total = 0
        try:
            # Seqs are the table's key: a range of them is one index walk.
            cursor = seg.conn.execute(
                _SELECT_MESSAGE + " WHERE seq >= ? AND seq < ? ORDER BY seq",
                (seq, seq + max_messages),
            )
            for row in cursor:
                if row[0] not in live:
                    continue  # settled, its row not yet deleted
                total += len(row[4])
                if found and total > max_bytes:
                    break
                found.append(self._stored(row))
        except sqlite3.Error as exc:
            raise StoreError(seg.path, "read", sqlite_detail(exc)) from exc
        return found

    def _live_segment(self, seq: int, operation: str) -> Segment:
        """The segment holding live message `seq`; KeyError when it is unknown or settled."""
        self._ensure_open(operation)
        seg = self._owner(seq)
        if seg is None or seq not in seg.live:
            raise KeyError(seq)
        return seg

    def expired(self, now_ms: int, limit: int) -> list[int]:
        """Seqs of live messages with 0 < expires_ms <= now_ms (at most `limit`), oldest
        segment first."""
        self._ensure_open("expired()")
        found: list[int] = []
        for seg in self._segments:
            if len(found) >= limit:
                break
            if not seg.live:
                continue
            cursor = seg.conn.execute(
                "SELECT seq FROM messages WHERE expires_ms > 0 AND expires_ms <= ?"
                " ORDER BY expires_ms, seq",
                (now_ms,),
            )
            for (seq,) in cursor:
                if seq in seg.live:
                    found.append(seq)
                    if len(found) >= limit:
                        break
            cursor.close()
        return found

    def _stored(self, row: MessageRow) -> StoredMessage:
        counted = self._deliveries.get(row[0])
        deliveries = counted or 0
        message = message_from_row(row, deliveries, redelivered=counted is not None)
        return StoredMessage(row[0], message, deliveries)

    def _paged(self, row: IndexRow) -> StoredMessage:
        (
            seq,
            message_id,
            destination,
            headers,
            timestamp_ms,
            priority,
            expires_ms,
            size,
            encoding,
        ) = row
        counted = self._deliveries.get(seq)
        deliveries = counted or 0
        message = Message(
            message_id=message_id,
            destination=destination,
            headers=_decode_headers(headers),
            body=b"",
            timestamp_ms=timestamp_ms,
            persistent=True,
            priority=priority,
            expires_ms=expires_ms,
            redelivered=counted is not None,
            size=size,
            seq=seq,
            deliveries=deliveries,
            paged=True,
            encoding=encoding,
        )
        return StoredMessage(seq, message, deliveries)

    # -- reporting ----------------------------------------------------------------------------

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            segments=len(self._segments),
            active_segment=self._segments[-1].path,
            active_segment_bytes=self._active_bytes,
            live_messages=sum(len(s.live) for s in self._segments),
            live_bytes=sum(s.live.total_size for s in self._segments),
            retired_segments=self._retired,
            appends=self._appends,
            append_transactions=self._append_transactions,
            settles=self._settles,
        )

    def segments(self) -> list[SegmentInfo]:
        """The segment files present, oldest first; the last one is the active segment."""
        return [
            SegmentInfo(
                path=s.path,
                index=s.index,
                first_seq=s.first_seq,
                last_seq=s.last_seq,
                sealed=s.sealed,
                messages=s.messages,
                live=len(s.live),
            )
            for s in self._segments
        ]

    def mark_clean_stop(self) -> None:
        """Say that every delivery that may have reached a client is counted in the store
        (the owner counted those still in consumers' windows with `record_delivery`), so
        the next open may trust the counts (`stopped_cleanly`). Call it last, just before
        `close()`: a write after it would not be covered. Counts not written yet are
        written first; if they cannot be, StoreError, and the store is not marked."""
        self._ensure_open("mark_clean_stop()")
        self.write_delivery_counts()
        path = self.directory / CLEAN_STOP_NAME
        try:
            with open(path, "w") as fh:
                fh.write("stopped in order\n")
                fh.flush()
                os.fsync(fh.fileno())
            fsync_directory(self.directory)
        except OSError as exc:
            raise StoreError(path, "mark_clean_stop", str(exc)) from exc

    def close(self) -> None:
        """Close every segment (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for seg in self._segments:
            with contextlib.suppress(sqlite3.Error):
                seg.close()

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _files_of(seg: Segment) -> list[Path]:
    """A segment's file and its side files (WAL, shared memory)."""
    return [seg.path, *(Path(f"{seg.path}{s}") for s in SIDE_SUFFIXES)]


def _check_marker(directory: Path) -> None:
    """Adopt an empty directory (writing the marker); refuse one that is not a store."""
    marker = directory / MARKER_NAME
    if marker.exists():
        text = marker.read_text(errors="replace")
        if text != MARKER_TEXT:
            raise StoreError(marker, "open", f"unknown store marker {text[:40]!r}")
        return
    entries = sorted(p.name for p in directory.iterdir())
    if entries:
        raise StoreError(
            directory,
            "open",
            f"not an mpbroker store (no {MARKER_NAME} file; contains {entries[:5]})",
        )
    tmp = directory / (MARKER_NAME + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(MARKER_TEXT)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, marker)
    fsync_directory(directory)


def _take_clean_stop(directory: Path) -> bool:
    """Whether the last owner stopped in order; the mark is removed at once (made durable
    before anything is written), so a crash of this run is never taken for a clean stop."""
    path = directory / CLEAN_STOP_NAME
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    fsync_directory(directory)
    return True


def _remove_leftovers(directory: Path) -> None:
    # A segment still under its temporary name was being created when the process died;
    # it holds nothing (messages only go into a segment after its rename).
    for p in directory.iterdir():
        if ".db.tmp" in p.name:
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
