"""TopicStore: the persistent store of one pubsub partition's durable topic subscriptions.

A persistent message published to a topic with durable subscriptions is stored ONCE, in the
partition's :class:`MessageStore` (``data_dir/pubsub-0``), however many durable subscriptions
it goes to. Who still owes an ack for it is kept apart, in the registry file
(``data_dir/pubsub-0-durable.db``)::

    subscriptions(name PK, destination, created_ms,    durable name -> topic, its JMS
                  selector, owner)                     selector ('' = none) and the user
                                                       it belongs to ('' = nobody)
    pending(sub, seq, deliveries, priority)            one row per (subscription, message)
        PK (sub, seq); index (sub, priority, seq)      a backlog in delivery order

A message is settled in the MessageStore once no pending row references it any more (acked by
every durable subscription it went to, expired, or its subscriptions removed), so segments are
retired exactly as for queues. TopicStore keeps nothing per message in memory: an inactive
subscription's backlog stays on disk and is read back in batches, by :class:`TopicStoreReader`
in a replay worker process while the owner keeps writing: in JMS priority order (highest
first, FIFO within a priority), as a queue delivers, with one cursor per priority.

Two databases cannot commit together; the write ORDER makes a crash between them harmless:

- append: the message rows commit before their pending rows. A crash in between leaves
  messages without pending rows (orphans), whose sender never got a receipt; `recover()`
  settles them at the next start.
- ack, unsubscribe, expire: the pending deletes commit before the settle. A crash in between
  leaves orphans too, settled the same way. The reverse order could leave pending rows for
  settled messages, i.e. deliveries promised for messages that may be gone.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar

import sqlite_utils

from mpbroker.config import StoreSettings
from mpbroker.records import Message

from ._errors import StoreError, sqlite_detail
from ._reserve import DiskReserve
from ._segment import (
    Migration,
    applied_migrations,
    apply_migrations,
    cache_size_pragma,
    configure_database,
    connect_database,
    segment_index,
    segment_name,
    unreadable,
)
from ._store import OUTCOMES, MessageRow, MessageStore, message_from_row

__all__ = [
    "PENDING_OVERHEAD_BYTES",
    "REGISTRY_MIGRATIONS",
    "BacklogBatch",
    "TopicStore",
    "TopicStoreReader",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# -- the registry's schema ----------------------------------------------------------------------
# Named migrations, as for segments: each runs in its own transaction with its `_migrations`
# row. Append new ones at the end; never edit or reorder one that has shipped.


def _m0001_subscriptions(db: sqlite_utils.Database) -> None:
    # IF NOT EXISTS: a file written by the first release, before the registry had
    # migrations, already has this very table (the same columns), and its rows are kept.
    db.execute(
        "CREATE TABLE IF NOT EXISTS subscriptions"
        " ([name] TEXT PRIMARY KEY, [destination] TEXT, [created_ms] INTEGER)"
    )


def _m0002_pending(db: sqlite_utils.Database) -> None:
    # WITHOUT ROWID: the rows are their key (plus a small counter), and a subscription's
    # backlog is read in seq order straight off the primary key.
    db.execute(
        "CREATE TABLE pending (sub TEXT NOT NULL, seq INTEGER NOT NULL,"
        " deliveries INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (sub, seq)) WITHOUT ROWID"
    )
    # "Does anyone still owe an ack for seq?" after every ack, and the start-up orphan check.
    db.execute("CREATE INDEX pending_seq ON pending(seq)")


def _m0003_pending_priority(db: sqlite_utils.Database) -> None:
    # The message's JMS priority, so a backlog is replayed highest priority first. Rows
    # written before this migration get the default priority (their messages' own priority
    # is in another database).
    db.execute("ALTER TABLE pending ADD COLUMN priority INTEGER NOT NULL DEFAULT 4")
    # A backlog in delivery order: one range per priority, FIFO (seq) within it.
    # `deliveries` included: the replay's page query then reads the index alone (about a
    # third faster); the index changes only when a delivery comes back, which is rare.
    db.execute("CREATE INDEX pending_sub_priority ON pending(sub, priority, seq, deliveries)")


def _m0004_subscription_selector(db: sqlite_utils.Database) -> None:
    # A durable subscription's selector is part of it: only what it selects is stored for
    # it, across restarts. Subscriptions made before selectors existed select everything.
    db.execute("ALTER TABLE subscriptions ADD COLUMN selector TEXT NOT NULL DEFAULT ''")


def _m0005_subscription_owner(db: sqlite_utils.Database) -> None:
    # The user who created a durable subscription: another user may not take it over.
    # Subscriptions made before users existed belong to nobody until a user subscribes.
    db.execute("ALTER TABLE subscriptions ADD COLUMN owner TEXT NOT NULL DEFAULT ''")


REGISTRY_MIGRATIONS: Final[tuple[Migration, ...]] = (
    ("0001_subscriptions", _m0001_subscriptions),
    ("0002_pending", _m0002_pending),
    ("0003_pending_priority", _m0003_pending_priority),
    ("0004_subscription_selector", _m0004_subscription_selector),
    ("0005_subscription_owner", _m0005_subscription_owner),
)
_KNOWN: Final = frozenset(name for name, _ in REGISTRY_MIGRATIONS)

_INSERT_PENDING: Final = (
    "INSERT OR REPLACE INTO pending (sub, seq, priority, deliveries) VALUES (?, ?, ?, 0)"
)
_DELETE_PENDING: Final = "DELETE FROM pending WHERE sub = ? AND seq = ?"
# A pending row is an entry in three B-trees (the table, pending_seq, pending_sub_priority),
# each with the name: what one takes besides three times its name's bytes.
_PENDING_FIXED_BYTES: Final = 64
# ...and with a name of up to 64 bytes: what the configuration's bound on an append
# (flow.append_margin) counts a pending row. Longer names are counted as they are.
PENDING_OVERHEAD_BYTES: Final = _PENDING_FIXED_BYTES + 3 * 64
_ANY_PENDING: Final = "SELECT 1 FROM pending WHERE seq = ? LIMIT 1"
# JMS priorities 0-9: a backlog has one read cursor per priority, indexed by it.
PRIORITIES: Final = 10
# The priorities with a pending row after their cursor, highest first (parameters: ?1 the
# subscription, ?(p + 2) the cursor of priority p): one statement, one probe of the
# (sub, priority, seq) index per priority.
_PRIORITIES_AFTER: Final = " UNION ALL ".join(
    f"SELECT {p} WHERE EXISTS"
    f" (SELECT 1 FROM pending WHERE sub = ?1 AND priority = {p} AND seq > ?{p + 2})"
    for p in range(PRIORITIES - 1, -1, -1)
)
_COUNT_RETURNS: Final = "UPDATE pending SET deliveries = deliveries + ? WHERE sub = ? AND seq = ?"
# MessageStore.settle() is one transaction per call; a huge unsubscribe is settled in slices
# so no single transaction (nor its in-memory statement list) grows without bound.
_SETTLE_SLICE: Final = 10_000


def _open_registry(
    path: Path, synchronous: str, now_ms: int, cache_bytes: int
) -> sqlite_utils.Database:
    """Open (or create) the registry file and bring its schema up to date."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = connect_database(path)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(path, "open", f"cannot open: {exc}") from exc
    try:
        try:
            tables = set(db.table_names())
        except sqlite3.DatabaseError as exc:
            raise unreadable(path, exc) from exc
        if tables and not tables & {"_migrations", "subscriptions"}:
            raise StoreError(
                path, "open", f"not an mpbroker durable registry (tables {sorted(tables)[:5]})"
            )
        configure_database(db, path, synchronous, cache_bytes)
        db.execute(
            "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_ms INTEGER)"
        )
        unknown = [name for name in applied_migrations(db) if name not in _KNOWN]
        if unknown:
            raise StoreError(
                path,
                "open",
                f"registry schema is newer than this mpbroker: unknown migrations {unknown}",
            )
        apply_migrations(db, path, now_ms, REGISTRY_MIGRATIONS)
        return db
    except sqlite3.Error as exc:
        db.conn.close()
        raise StoreError(path, "open", sqlite_detail(exc)) from exc
    except BaseException:
        db.conn.close()
        raise


def _cursors(after: Sequence[int]) -> list[int]:
    """The per-priority cursors `after` as a list; ValueError unless one per priority."""
    cursors = list(after)
    if len(cursors) != PRIORITIES:
        raise ValueError(f"after has {len(cursors)} entries: must have one per priority (10)")
    return cursors


def _slices(seqs: Sequence[int], size: int) -> Iterable[Sequence[int]]:
    for start in range(0, len(seqs), size):
        yield seqs[start : start + size]


class TopicStore:
    """One pubsub partition's durable-subscription messages and who still owes acks for them.

    Used by one thread of one process (the partition's pipeline worker), the only writer of
    both the store directory and the registry file. Call `recover()` once after opening.
    """

    def __init__(
        self,
        directory: Path,
        registry_path: Path,
        settings: StoreSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = Path(directory)
        self.registry_path = Path(registry_path)
        self._clock = clock
        self._closed = False
        # Returned deliveries the filesystem did not take yet, (subscription, seq) -> how
        # many: written with the next ones (`returned`, `write_delivery_counts`).
        self._unwritten_returns: dict[tuple[str, int], int] = {}
        try:
            db = self._open_registry(settings)
        except StoreError as exc:
            # On a full filesystem the message store's reserve (beside the registry) makes
            # room for opening it, as for the store itself (MessageStore.open).
            reserve = DiskReserve(self.directory, settings.disk_reserve_bytes)
            if not (exc.disk_full and reserve.release()):
                raise
            db = self._open_registry(settings)
        self._conn: sqlite3.Connection = db.conn
        try:
            # Subscriptions only (a handful), never anything per message.
            rows = self._conn.execute(
                "SELECT name, destination, selector, owner FROM subscriptions"
            ).fetchall()
            self._subscriptions: dict[str, str] = {name: topic for name, topic, _, _ in rows}
            self._selectors: dict[str, str] = {name: text for name, _, text, _ in rows if text}
            self._owners: dict[str, str] = {name: owner for name, _, _, owner in rows if owner}
            self.messages: MessageStore = MessageStore.open(self.directory, settings, clock=clock)
            """The messages themselves, one row each (settled when no pending row is left)."""
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            if isinstance(exc, sqlite3.Error):
                raise StoreError(self.registry_path, "open", sqlite_detail(exc)) from exc
            raise

    def _open_registry(self, settings: StoreSettings) -> sqlite_utils.Database:
        return _open_registry(
            self.registry_path, settings.synchronous, self._now_ms(), settings.sqlite_cache_bytes
        )

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- helpers ------------------------------------------------------------------------------

    def _ensure_open(self, operation: str) -> None:
        if self._closed:
            raise StoreError(self.registry_path, operation, "the store is closed")

    def _write(
        self, operation: str, work: Callable[[sqlite3.Connection], _T], *, reserve: bool = True
    ) -> _T:
        """Run `work` in one registry transaction; StoreError (rolled back) on SQLite errors.
        `reserve`: a write that lets space be freed (acks, expiry, removals), for which a
        full filesystem gives up the message store's disk reserve (the registry lives
        beside the store, on the same filesystem)."""
        self._ensure_open(operation)
        conn = self._conn

        def transaction() -> _T:
            try:
                conn.execute("BEGIN IMMEDIATE")
                result = work(conn)
                conn.execute("COMMIT")
            except BaseException as exc:
                # The transaction may already be gone (SQLite rolls back by itself on some
                # errors).
                with contextlib.suppress(sqlite3.Error):
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(self.registry_path, operation, sqlite_detail(exc)) from exc
                raise
            return result

        try:
            return transaction()
        except StoreError as exc:
            if not (reserve and exc.disk_full and self.messages.reserve.release()):
                raise
        return transaction()

    def _query(self, operation: str, sql: str, params: Sequence[object]) -> list[tuple[int, ...]]:
        self._ensure_open(operation)
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(self.registry_path, operation, sqlite_detail(exc)) from exc

    def _settle(self, seqs: Sequence[int], outcome: str, at_ms: int) -> None:
        for part in _slices(seqs, _SETTLE_SLICE):
            self.messages.settle(part, outcome, at_ms)

    # -- subscriptions ------------------------------------------------------------------------

    def subscriptions(self) -> dict[str, str]:
        """Durable subscription name -> its topic destination."""
        return dict(self._subscriptions)

    def selectors(self) -> dict[str, str]:
        """Durable subscription name -> its JMS selector, for those that have one."""
        return dict(self._selectors)

    def owners(self) -> dict[str, str]:
        """Durable subscription name -> the user it belongs to, for those that belong to one."""
        return dict(self._owners)

    def subscribe(self, name: str, destination: str, selector: str = "", owner: str = "") -> None:
        """Create or replace the durable subscription `name` (it survives restarts, even with
        an empty backlog) on `destination`, selecting what `selector` selects ('': all),
        belonging to `owner` ('': nobody). Replacing keeps its pending rows: remove it
        first to drop them."""
        self._write(
            "subscribe",
            lambda conn: conn.execute(
                "INSERT OR REPLACE INTO subscriptions"
                " (name, destination, created_ms, selector, owner) VALUES (?, ?, ?, ?, ?)",
                (name, destination, self._now_ms(), selector, owner),
            ),
            reserve=False,
        )
        self._subscriptions[name] = destination
        for known, value in ((self._selectors, selector), (self._owners, owner)):
            if value:
                known[name] = value
            else:
                known.pop(name, None)

    def claim(self, name: str, owner: str) -> None:
        """The durable subscription `name`, which belonged to nobody, now belongs to `owner`."""
        self._write(
            "claim",
            lambda conn: conn.execute(
                "UPDATE subscriptions SET owner = ? WHERE name = ?", (owner, name)
            ),
            reserve=False,
        )
        self._owners[name] = owner

    def unsubscribe(self, name: str, at_ms: int) -> int:
        """Remove the durable subscription `name` with its backlog; the number of pending rows
        removed. Messages no other subscription needs are settled as `unsubscribed`."""

        def work(conn: sqlite3.Connection) -> tuple[list[int], int]:
            orphans = [
                seq
                for (seq,) in conn.execute(
                    "SELECT p.seq FROM pending AS p WHERE p.sub = ? AND NOT EXISTS"
                    " (SELECT 1 FROM pending AS q WHERE q.seq = p.seq AND q.sub <> ?)"
                    " ORDER BY p.seq",
                    (name, name),
                ).fetchall()
            ]
            removed = conn.execute("DELETE FROM pending WHERE sub = ?", (name,)).rowcount
            conn.execute("DELETE FROM subscriptions WHERE name = ?", (name,))
            return orphans, removed

        orphans, removed = self._write("unsubscribe", work)
        self._subscriptions.pop(name, None)
        self._selectors.pop(name, None)
        self._owners.pop(name, None)
        self._settle(orphans, "unsubscribed", at_ms)
        return removed

    # -- messages -----------------------------------------------------------------------------

    def append(self, entries: Sequence[tuple[Message, Sequence[str]]]) -> list[int]:
        """Store each message once, owed to the durable subscriptions named with it; their
        seqs, in order.

        One MessageStore transaction (the group-commit unit), then one registry transaction
        for the pending rows. On StoreError nothing of the batch is owed to anyone (refuse
        the sends): messages stored before the pending insert failed are settled here at
        best, or by `recover()` at the next start. ValueError for a message without
        subscriptions, a name that is not a durable subscription or a priority outside 0-9,
        before any write. Each pending row carries its message's priority (replay order).
        """
        self._ensure_open("append()")
        if not entries:
            return []
        for message, names in entries:
            if isinstance(names, str):
                raise TypeError(f"message {message.message_id!r}: names must be a list, not a str")
            if not names:
                raise ValueError(f"message {message.message_id!r}: no durable subscription")
            if not 0 <= message.priority < PRIORITIES:
                raise ValueError(
                    f"message {message.message_id!r}: priority {message.priority} not in 0-9"
                )
            for name in names:
                if name not in self._subscriptions:
                    raise ValueError(f"{name!r} is not a durable subscription")
        # The disk guard hears of the pending rows too: their sizes, and the places they
        # go in the B-trees (two ordered by name, one by seq).
        owed = [dict.fromkeys(names) for _, names in entries]
        pending = [_PENDING_FIXED_BYTES + 3 * len(name.encode()) for o in owed for name in o]
        places = 2 * len({name for o in owed for name in o}) + 1
        seqs = self.messages.append(
            [message for message, _ in entries], also_writes=[(pending, places)]
        )
        rows = [
            (name, seq, message.priority)
            for seq, (message, names) in zip(seqs, entries, strict=True)
            for name in dict.fromkeys(names)
        ]
        try:
            self._write(
                "append", lambda conn: conn.executemany(_INSERT_PENDING, rows), reserve=False
            )
        except StoreError:
            # Not owed to anyone: do not leave them live until the next start.
            with contextlib.suppress(StoreError):
                self._settle(seqs, "unsubscribed", self._now_ms())
            raise
        return seqs

    def last_seq(self, name: str) -> int:
        """The highest seq subscription `name` still owes an ack for; 0 when none."""
        rows = self._query("last_seq", "SELECT MAX(seq) FROM pending WHERE sub = ?", (name,))
        return rows[0][0] or 0

    def pending_after(self, name: str, after: Sequence[int]) -> bool:
        """Whether subscription `name` owes an ack for any message past the per-priority
        cursors `after` (10 entries, index = priority 0-9): a pending row of priority p with
        seq > after[p]. ValueError unless `after` has 10 entries."""
        cursors = _cursors(after)
        return bool(self._query("pending_after", _PRIORITIES_AFTER + " LIMIT 1", (name, *cursors)))

    def backlog(self, name: str) -> int:
        """How many messages subscription `name` still owes an ack for."""
        rows = self._query("backlog", "SELECT COUNT(*) FROM pending WHERE sub = ?", (name,))
        return rows[0][0]

    def ack(self, pairs: Sequence[tuple[str, int]], outcome: str, at_ms: int) -> None:
        """The (subscription, seq) pairs are done with (`outcome` as in MessageStore.settle):
        their pending rows go, in one transaction; then every seq among them nobody owes any
        more is settled with `outcome`. Unknown pairs are ignored."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome {outcome!r}: must be one of {sorted(OUTCOMES)}")
        if not pairs:
            return

        def work(conn: sqlite3.Connection) -> list[int]:
            conn.executemany(_DELETE_PENDING, pairs)
            return [
                seq
                for seq in sorted({seq for _, seq in pairs})
                if conn.execute(_ANY_PENDING, (seq,)).fetchone() is None
            ]

        self._settle(self._write("ack", work), outcome, at_ms)

    def returned(self, pairs: Sequence[tuple[str, int]]) -> None:
        """A delivery of each (subscription, seq) came back (NACK, subscriber gone): count it,
        so the next delivery is flagged redelivered. Unknown pairs are ignored.

        Counts the filesystem cannot take (StoreError) are kept in memory and written with
        the next ones or by `write_delivery_counts`, so `redelivered` survives a full disk."""
        unwritten = self._unwritten_returns
        for pair in pairs:
            unwritten[pair] = unwritten.get(pair, 0) + 1
        if not unwritten:
            return
        rows = [(count, sub, seq) for (sub, seq), count in unwritten.items()]

        def work(conn: sqlite3.Connection) -> list[int]:
            counted: list[int] = []
            for row in rows:
                if conn.execute(_COUNT_RETURNS, row).rowcount:
                    counted.extend([row[2]] * row[0])
            return counted

        counted = self._write("returned", work)
        unwritten.clear()
        # The message's own count too, over all its subscriptions, for what reads the
        # segments (the export's `redeliveries`): a pending row's count goes with its ack.
        # (Kept by the message store if it cannot be written now.)
        self.messages.record_delivery(counted)

    @property
    def unwritten_deliveries(self) -> int:
        """Returned deliveries kept in memory that the filesystem has not taken yet."""
        return len(self._unwritten_returns) + self.messages.unwritten_deliveries

    def write_delivery_counts(self) -> None:
        """Write the returned deliveries not written yet (StoreError if it still cannot)."""
        self.returned(())
        if self.messages.unwritten_deliveries:
            self.messages.write_delivery_counts()

    def expire(self, seqs: Sequence[int], at_ms: int) -> None:
        """Drop the messages `seqs` for every subscription and settle them as `expired`."""
        if not seqs:
            return
        self._write(
            "expire",
            lambda conn: conn.executemany(
                "DELETE FROM pending WHERE seq = ?", [(seq,) for seq in seqs]
            ),
        )
        self._settle(seqs, "expired", at_ms)

    def expired(self, now_ms: int, limit: int) -> list[int]:
        """Seqs of stored messages past their expiry (see MessageStore.expired)."""
        return self.messages.expired(now_ms, limit)

    def recover(self, at_ms: int) -> int:
        """Make the two databases agree after a crash; the number of orphans settled.

        Settles (as `unsubscribed`) every live message nobody owes an ack for: a crash came
        between an append's two commits, or between an ack's delete and its settle. Deletes
        the pending rows of settled messages and of removed subscriptions.
        """
        live = self.messages.live_seqs()

        def work(conn: sqlite3.Connection) -> tuple[list[int], list[int]]:
            gone_subs = conn.execute(
                "DELETE FROM pending WHERE sub NOT IN (SELECT name FROM subscriptions)"
            ).rowcount
            if gone_subs:
                log.info(
                    "topic store %s: %d pending rows of removed subscriptions",
                    self.registry_path,
                    gone_subs,
                )
            # Merge two ascending streams: live seqs and seqs with pending rows.
            orphans: list[int] = []
            stale: list[int] = []
            i = 0
            cursor = conn.execute("SELECT DISTINCT seq FROM pending ORDER BY seq")
            while rows := cursor.fetchmany(self.messages.settings.cleanup_batch):
                for (seq,) in rows:
                    while i < len(live) and live[i] < seq:
                        orphans.append(live[i])
                        i += 1
                    if i < len(live) and live[i] == seq:
                        i += 1
                    else:
                        stale.append(seq)
            orphans.extend(live[i:])
            conn.executemany("DELETE FROM pending WHERE seq = ?", [(seq,) for seq in stale])
            return orphans, stale

        orphans, stale = self._write("recover", work)
        if orphans or stale:
            log.info(
                "topic store %s: settled %d messages owed to nobody, dropped pending rows of %d"
                " settled messages",
                self.directory,
                len(orphans),
                len(stale),
            )
        self._settle(orphans, "unsubscribed", at_ms)
        return len(orphans)

    # -- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the registry and the message store (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()
        self.messages.close()

    def __enter__(self) -> TopicStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# -- reading the backlog from another process ---------------------------------------------------


_SELECT_FULL: Final = (
    "SELECT seq, message_id, destination, headers, body, timestamp_ms, priority, expires_ms,"
    " size, encoding FROM messages WHERE seq IN "
)
_SELECT_LIGHT: Final = "SELECT seq, expires_ms, size FROM messages WHERE seq IN "
# One priority's rows of a backlog after its cursor, off the (sub, priority, seq) index.
# INDEXED BY: left to itself the planner prefers the primary key (sub, seq), which is in
# seq order and holds `deliveries`, and would filter a whole backlog for an empty priority.
_SELECT_PENDING: Final = (
    "SELECT seq, deliveries FROM pending INDEXED BY pending_sub_priority"
    " WHERE sub = ? AND priority = ? AND seq > ? ORDER BY seq LIMIT ?"
)
# Seqs per IN (...) list: well below SQLite's limit on bound parameters.
_IN_SLICE: Final = 500
# Pending rows fetched beyond max_messages per query, for expired or settled rows met.
_PAGE_SLACK: Final = 32
# Segment files kept open by a reader; a batch touches one or two, a catch-up moves forward.
_MAX_OPEN_SEGMENTS: Final = 8


@dataclass(frozen=True, slots=True)
class BacklogBatch:
    """What `TopicStoreReader.batch()` found for one subscription."""

    messages: list[Message]
    """In delivery order: highest priority first, seq order within a priority; `persistent`,
    `seq`, `size` and `deliveries` set, `redelivered` is `deliveries > 0`."""
    expired: list[int]
    """Seqs met on the way whose expiry has passed (not in `messages`): expire them."""
    scanned_upto: list[int]
    """Per priority (10 entries, index = priority 0-9): every pending row of the subscription
    of priority p with seq <= scanned_upto[p] was looked at (delivered, expired, or settled
    meanwhile): ask for the next batch after these cursors."""
    more: bool
    """True when the batch stopped at a limit with rows possibly left (at the priority it
    stopped at or a lower one); False when every priority was read to its end (rows appended
    meanwhile may be past the cursors all the same: `TopicStore.pending_after` tells)."""
    bytes: int
    """Sum of the sizes of `messages`."""


@dataclass(slots=True)
class _SegmentFile:
    index: int
    path: Path
    inode: int
    base_seq: int


def _uri(path: Path) -> str:
    # mode=rw: never create a database. A plain connect to the path of a segment retired
    # meanwhile would leave an empty database file there.
    return path.absolute().as_uri() + "?mode=rw"


class TopicStoreReader:
    """Reads durable subscriptions' backlogs from a TopicStore's files while its owner, in
    another process, writes them.

    Read-only (`query_only`) connections opened with ``mode=rw``; no read transaction is
    held between calls (every statement sees the latest commit and never holds back the
    writer's checkpoints). The pending rows are the truth: a message whose row or segment is
    gone by the time it is read was settled meanwhile and is skipped.
    """

    def __init__(self, directory: Path, registry_path: Path, cache_bytes: int) -> None:
        self.directory = Path(directory)
        self.registry_path = Path(registry_path)
        self.cache_bytes = cache_bytes
        self._closed = False
        self._registry = self._connect(self.registry_path)
        self._known: dict[int, _SegmentFile] = {}  # segment index -> file present
        self._order: list[_SegmentFile] = []  # ascending base_seq
        self._bases: list[int] = []
        self._conns: OrderedDict[int, sqlite3.Connection] = OrderedDict()  # LRU by index
        if not self.directory.is_dir():
            self._registry.close()
            raise StoreError(self.directory, "open", "no such store directory")

    def _connect(self, path: Path) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(_uri(path), uri=True, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreError(path, "open", f"cannot open: {sqlite_detail(exc)}") from exc
        try:
            conn.execute("PRAGMA query_only=1")
            conn.execute(cache_size_pragma(self.cache_bytes))
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(path, "open", sqlite_detail(exc)) from exc
        return conn

    # -- segment files ------------------------------------------------------------------------

    def _refresh(self) -> None:
        """Sync the known segment files with the directory: a listing is cheap next to the
        queries of a batch, and an unlinked file still answers through an open connection,
        so only the listing tells that it was retired."""
        try:
            listed = {
                index: entry.inode()
                for entry in os.scandir(self.directory)
                if (index := segment_index(entry.name)) is not None
            }
        except OSError as exc:
            raise StoreError(self.directory, "list segments", str(exc)) from exc
        for index, known in list(self._known.items()):
            if listed.get(index) != known.inode:
                del self._known[index]
                self._drop(index)
        for index, inode in listed.items():
            if index in self._known:
                continue
            path = self.directory / segment_name(index)
            conn = self._open_segment(index, path)
            if conn is None:
                continue
            try:
                # fetchall: a cursor left mid-way would keep a read transaction open.
                rows = conn.execute("SELECT value FROM meta WHERE key = 'base_seq'").fetchall()
            except sqlite3.Error as exc:
                self._drop(index)
                raise StoreError(path, "read", sqlite_detail(exc)) from exc
            if not rows:
                self._drop(index)
                raise StoreError(path, "read", "not an mpbroker store segment (no base_seq)")
            self._known[index] = _SegmentFile(index, path, inode, int(rows[0][0]))
        self._order = sorted(self._known.values(), key=lambda f: f.base_seq)
        self._bases = [f.base_seq for f in self._order]
        for index in [i for i in self._conns if i not in self._known]:
            self._drop(index)

    def _open_segment(self, index: int, path: Path) -> sqlite3.Connection | None:
        """A connection to segment `index`, most recently used; None when the file is gone."""
        conn = self._conns.get(index)
        if conn is not None:
            self._conns.move_to_end(index)
            return conn
        try:
            conn = self._connect(path)
        except StoreError:
            if not path.exists():
                return None  # retired since it was listed
            raise
        self._conns[index] = conn
        while len(self._conns) > _MAX_OPEN_SEGMENTS:
            _, oldest = self._conns.popitem(last=False)
            with contextlib.suppress(sqlite3.Error):
                oldest.close()
        return conn

    def _drop(self, index: int) -> None:
        conn = self._conns.pop(index, None)
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _by_segment(self, seqs: Iterable[int]) -> dict[int, list[int]]:
        """Segment index -> the seqs it would hold (a seq whose segment is gone maps to an
        older one, where it is simply not found)."""
        grouped: dict[int, list[int]] = {}
        for seq in seqs:
            i = bisect.bisect_right(self._bases, seq) - 1
            if i >= 0:
                grouped.setdefault(self._order[i].index, []).append(seq)
        return grouped

    def _select(self, sql: str, seqs: Iterable[int]) -> list[Any]:
        """Rows of `sql` + "(seq, ...)" for the seqs found, from whichever segments hold them."""
        rows: list[Any] = []
        for index, part in self._by_segment(seqs).items():
            path = self._known[index].path
            conn = self._open_segment(index, path)
            if conn is None:
                continue
            try:
                for chunk in _slices(part, _IN_SLICE):
                    marks = ",".join("?" * len(chunk))
                    rows.extend(conn.execute(f"{sql}({marks})", chunk).fetchall())
            except sqlite3.Error as exc:
                raise StoreError(path, "read", sqlite_detail(exc)) from exc
        return rows

    # -- batches ------------------------------------------------------------------------------

    def backlogs(self) -> dict[str, int]:
        """How many messages each durable subscription with any still owes an ack for:
        one pass over every pending row (the replay worker asks every few seconds, off the
        owner's loop)."""
        if self._closed:
            raise StoreError(self.registry_path, "backlogs", "the reader is closed")
        try:
            rows = self._registry.execute("SELECT sub, COUNT(*) FROM pending GROUP BY sub")
            return dict(rows.fetchall())
        except sqlite3.Error as exc:
            raise StoreError(self.registry_path, "backlogs", sqlite_detail(exc)) from exc

    def batch(
        self,
        name: str,
        after: Sequence[int],
        *,
        max_messages: int,
        max_bytes: int,
        at_least_one: bool,
        now_ms: int,
        redeliver_below: int,
    ) -> BacklogBatch:
        """The next messages subscription `name` owes acks for, after the per-priority cursors
        `after` (10 entries, index = priority 0-9): highest priority first, seq order within
        a priority, only rows of priority p with seq > after[p]. A message appended with a
        higher priority than the rows the batches reached is thus read by the next batch.

        Stops before a message that would take the batch past `max_bytes` (unless the batch
        is empty and `at_least_one`: a message larger than every limit still goes, alone)
        and at `max_messages`. Expired rows do not count toward the limits but a batch looks
        at no more than max(1024, 4 x max_messages) rows, so a long run of them is reported
        over several batches. Messages with seq < `redeliver_below` count one delivery more
        (they were in flight when their subscriber went away, say).

        `scanned_upto` starts from `after`; a priority read to its end in this batch gets the
        last seq looked at, one below where the batch stopped keeps its cursor.
        """
        if self._closed:
            raise StoreError(self.registry_path, "batch", "the reader is closed")
        if max_messages < 1:
            raise ValueError(f"max_messages = {max_messages}: must be >= 1")
        scanned_upto = _cursors(after)
        page = max_messages + _PAGE_SLACK
        scan_limit = max(1024, 4 * max_messages)
        chosen: list[tuple[int, int]] = []  # (seq, deliveries)
        expired: list[int] = []
        scanned = 0
        total = 0
        more = False
        try:
            # One statement finds the priorities with rows to read (usually one, 4).
            found_priorities = self._registry.execute(
                _PRIORITIES_AFTER, (name, *scanned_upto)
            ).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(self.registry_path, "batch", sqlite_detail(exc)) from exc
        # Then one range of the (sub, priority, seq) index per such priority, highest first.
        for priority in sorted((p for (p,) in found_priorities), reverse=True):
            cursor_seq = scanned_upto[priority]
            while True:
                try:
                    rows: list[tuple[int, int]] = self._registry.execute(
                        _SELECT_PENDING, (name, priority, cursor_seq, page)
                    ).fetchall()
                except sqlite3.Error as exc:
                    raise StoreError(self.registry_path, "batch", sqlite_detail(exc)) from exc
                if not rows:
                    break
                # After the pending rows: their messages committed earlier, so their segment
                # files are listed now unless retired since (settled meanwhile).
                self._refresh()
                light: dict[int, tuple[int, int]] = {
                    seq: (expires_ms, size)
                    for seq, expires_ms, size in self._select(_SELECT_LIGHT, (s for s, _ in rows))
                }
                for seq, deliveries in rows:
                    if scanned >= scan_limit:
                        more = True
                        break
                    found = light.get(seq)
                    if found is not None:
                        expires_ms, size = found
                        if 0 < expires_ms <= now_ms:
                            expired.append(seq)
                        else:
                            fits = total + size <= max_bytes or (at_least_one and not chosen)
                            if len(chosen) >= max_messages or not fits:
                                more = True
                                break
                            chosen.append((seq, deliveries))
                            total += size
                    scanned_upto[priority] = seq
                    scanned += 1
                if more or len(rows) < page:
                    break
                cursor_seq = rows[-1][0]
            if more:
                break
        messages = self._messages(chosen, redeliver_below)
        return BacklogBatch(
            messages=messages,
            expired=expired,
            scanned_upto=scanned_upto,
            more=more,
            bytes=sum(m.size for m in messages),
        )

    def _messages(self, chosen: list[tuple[int, int]], redeliver_below: int) -> list[Message]:
        if not chosen:
            return []
        full: dict[int, MessageRow] = {
            row[0]: row for row in self._select(_SELECT_FULL, (seq for seq, _ in chosen))
        }
        messages: list[Message] = []
        for seq, pending_deliveries in chosen:
            row = full.get(seq)
            if row is None:
                continue  # its segment was retired between the two reads: settled meanwhile
            deliveries = pending_deliveries + (1 if seq < redeliver_below else 0)
            messages.append(message_from_row(row, deliveries))
        return messages

    def close(self) -> None:
        """Close every connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for index in list(self._conns):
            self._drop(index)
        with contextlib.suppress(sqlite3.Error):
            self._registry.close()

    def __enter__(self) -> TopicStoreReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
