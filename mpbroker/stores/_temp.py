"""The temp store: bodies of non-persistent messages paged out of memory (flow-to-disk).

Non-persistent messages do not survive a restart, so nothing here has to either: the files
are SQLite with `synchronous=OFF` and no rollback journal, and whatever a previous run left
is deleted when the store opens.

Space is taken and given back in allocation units (`segment_bytes`): bodies are appended to
the active segment file until it holds a unit's worth, then a new file is started; a file is
deleted as soon as every body in it has been read back or dropped (rows are never deleted one
by one: a file goes whole). The store's usage is what its files hold, counted in units, and
`limit_bytes` bounds it; a limit below one unit could never hold anything, so the config
refuses it (ActiveMQ's temp store, limited below its 32 MB journal file size, blocked its
producers forever). A long-lived body pins its file: a few such bodies can make the store
"full" with little live data in it; their files go when they are consumed.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from mpbroker.config import TempStoreSettings

from ._errors import StoreError, sqlite_detail
from ._segment import cache_size_pragma

__all__ = ["TempStatistics", "TempStore"]

log = logging.getLogger("mpbroker.store")

_PREFIX = "tmp-"
_SUFFIX = ".db"


@dataclass(eq=False, slots=True)
class _Segment:
    index: int
    first_key: int
    db: sqlite3.Connection
    path: Path
    written: int = 0  # body bytes appended
    live: int = 0  # bodies not yet read back or dropped


@dataclass(frozen=True, slots=True)
class TempStatistics:
    usage_bytes: int  # disk the store's files take, in allocation units
    limit_bytes: int
    held_messages: int  # pages waiting to be read back
    segments: int
    full: bool


class TempStore:
    """Append-only body pages of one p2p worker. Keys are positive, increasing integers."""

    def __init__(self, directory: Path, settings: TempStoreSettings, cache_bytes: int) -> None:
        self.directory = directory
        self.cache_bytes = cache_bytes  # SQLite page cache per file
        self.limit_bytes = settings.limit_bytes
        self.unit_bytes = settings.segment_bytes
        self._segments: list[_Segment] = []  # in key order
        self._first_keys: list[int] = []
        self._next_key = 1
        self._next_index = 1
        self.held_messages = 0
        self.full = False
        self.paged_out = 0  # bodies written since start
        self.paged_in = 0  # bodies read back since start

    @classmethod
    def open(cls, directory: Path, settings: TempStoreSettings, cache_bytes: int) -> TempStore:
        """The temp store in `directory`, emptied of what an earlier run left."""
        directory.mkdir(parents=True, exist_ok=True)
        for leftover in directory.glob(f"{_PREFIX}*"):
            leftover.unlink(missing_ok=True)
        return cls(directory, settings, cache_bytes)

    # -- paging -------------------------------------------------------------------------

    def put(self, body: bytes) -> int | None:
        """Store `body`; its key, or None when the limit leaves no room (then `full`)."""
        segment = self._segments[-1] if self._segments else None
        if segment is None or (segment.written and segment.written + len(body) > self.unit_bytes):
            try:
                segment = self._new_segment()
            except StoreError as exc:
                log.error("%s", exc)
                segment = None
            if segment is None:
                self.full = True
                return None
        key = self._next_key
        try:
            segment.db.execute("INSERT INTO pages (key, body) VALUES (?, ?)", (key, body))
        except sqlite3.Error as exc:  # disk full, I/O error: the body stays in memory
            log.error("%s: page out: %s", segment.path, sqlite_detail(exc))
            self.full = True
            return None
        self._next_key += 1
        segment.written += len(body)
        segment.live += 1
        self.held_messages += 1
        self.paged_out += 1
        return key

    def take(self, key: int) -> bytes:
        """Read a body back; its key is then forgotten."""
        body = self.read(key)
        self._forget(self._segment_of(key))
        return body

    def read(self, key: int) -> bytes:
        """Read a body back and keep it (a topic message several subscribers wait for)."""
        segment = self._segment_of(key)
        try:
            row = segment.db.execute("SELECT body FROM pages WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(segment.path, "page in", sqlite_detail(exc)) from exc
        if row is None:
            raise StoreError(segment.path, "page in", f"no body with key {key}")
        self.paged_in += 1
        return bytes(row[0])

    def drop(self, key: int) -> None:
        """A paged message left without being delivered (expired, purged)."""
        self._forget(self._segment_of(key))

    def commit(self) -> None:
        """End of a worker batch: let SQLite hand the pages to the OS cache."""
        for segment in self._segments:
            if segment.db.in_transaction:
                segment.db.commit()

    def statistics(self) -> TempStatistics:
        return TempStatistics(
            usage_bytes=self.usage_bytes,
            limit_bytes=self.limit_bytes,
            held_messages=self.held_messages,
            segments=len(self._segments),
            full=self.full,
        )

    @property
    def usage_bytes(self) -> int:
        return sum(max(s.written, self.unit_bytes) for s in self._segments)

    def close(self) -> None:
        for segment in self._segments:
            segment.db.close()
            segment.path.unlink(missing_ok=True)
        self._segments.clear()
        self._first_keys.clear()

    # -- segments -----------------------------------------------------------------------

    def _new_segment(self) -> _Segment | None:
        if self.usage_bytes + self.unit_bytes > self.limit_bytes:
            return None
        path = self.directory / f"{_PREFIX}{self._next_index:08d}{_SUFFIX}"
        self._next_index += 1
        try:
            db = sqlite3.connect(path, isolation_level="DEFERRED", check_same_thread=False)
            db.execute(cache_size_pragma(self.cache_bytes))
            db.execute("PRAGMA journal_mode = OFF")
            db.execute("PRAGMA synchronous = OFF")
            db.execute("CREATE TABLE pages (key INTEGER PRIMARY KEY, body BLOB NOT NULL)")
            db.commit()
        except sqlite3.Error as exc:
            with contextlib.suppress(OSError):
                path.unlink()
            raise StoreError(path, "create temp segment", sqlite_detail(exc)) from exc
        segment = _Segment(self._next_index - 1, self._next_key, db, path)
        self._segments.append(segment)
        self._first_keys.append(segment.first_key)
        return segment

    def _segment_of(self, key: int) -> _Segment:
        i = bisect.bisect_right(self._first_keys, key) - 1
        if i < 0 or key >= self._next_key:
            raise StoreError(self.directory, "page in", f"no body with key {key}")
        return self._segments[i]

    def _forget(self, segment: _Segment) -> None:
        self.held_messages -= 1
        segment.live -= 1
        if segment.live == 0:
            # Empty: the file goes whole (the active one too; the next put starts another).
            i = self._segments.index(segment)
            del self._segments[i]
            del self._first_keys[i]
            segment.db.close()
            segment.path.unlink(missing_ok=True)
            self.full = False
