"""TopicStore and TopicStoreReader on real SQLite files: ack accounting across durable
subscriptions, crash recovery, and a reader following a writer."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest
import sqlite_utils
from hypothesis import given, settings
from hypothesis import strategies as st

from mpbroker.compression import compress
from mpbroker.config import StoreSettings
from mpbroker.records import Message, message_size
from mpbroker.stores import (
    REGISTRY_MIGRATIONS,
    MessageStore,
    StoreError,
    TopicStore,
    TopicStoreReader,
)
from mpbroker.stores._segment import apply_migrations
from mpbroker.stores._topic import _PRIORITIES_AFTER, _SELECT_PENDING
from tests.factories import numbered_message

# Tiny segments so a few messages roll them; synchronous=normal: no fsync per test commit.
TINY = StoreSettings(segment_max_bytes=4096, segment_max_age_s=0, synchronous="normal")
BIG = 10**9


#: Message i of the store tests' topic.
tmsg = partial(numbered_message, prefix="t", destination="/topic/t")


ZERO = [0] * 10  # per-priority cursors before anything


def at(seq: int, priority: int = 4, base: list[int] | None = None) -> list[int]:
    """Cursors `base` (ZERO) with priority `priority`'s set to `seq`."""
    cursors = list(ZERO if base is None else base)
    cursors[priority] = seq
    return cursors


def paths(root: Path) -> tuple[Path, Path]:
    return root / "pubsub-0", root / "pubsub-0-durable.db"


def open_topic(root: Path, s: StoreSettings = TINY) -> TopicStore:
    return TopicStore(*paths(root), s)


def open_reader(root: Path) -> TopicStoreReader:
    return TopicStoreReader(*paths(root), StoreSettings().sqlite_cache_bytes)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TopicStore]:
    with open_topic(tmp_path) as s:
        for name in ("a", "b", "c"):
            s.subscribe(name, "/topic/t")
        yield s


def outcomes(directory: Path) -> dict[int, str]:
    """seq -> outcome, from the settlement rows of the segment files present."""
    found: dict[int, str] = {}
    for seg in sorted(directory.glob("seg-*.db")):
        conn = sqlite3.connect(f"{seg.absolute().as_uri()}?mode=ro", uri=True)
        try:
            found.update(conn.execute("SELECT seq, outcome FROM settlements"))
        finally:
            conn.close()
    return found


def pending(store: TopicStore) -> set[tuple[str, int]]:
    return set(store._conn.execute("SELECT sub, seq FROM pending"))  # white-box


def priorities(store: TopicStore) -> dict[tuple[str, int], int]:
    return dict(  # white-box
        ((sub, seq), p)
        for sub, seq, p in store._conn.execute("SELECT sub, seq, priority FROM pending")
    )


def batch(reader: TopicStoreReader, name: str, after: list[int] = ZERO, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "max_messages": 100,
        "max_bytes": BIG,
        "at_least_one": True,
        "now_ms": 0,
        "redeliver_below": 0,
    }
    args.update(kw)
    return reader.batch(name, after, **args)


# -- TopicStore ---------------------------------------------------------------------------------


def test_a_message_stays_until_every_subscriber_acked(store: TopicStore, tmp_path: Path) -> None:
    s1, s2, s3 = store.append([(tmsg(1), ["a", "b", "c"]), (tmsg(2), ["a", "b"]), (tmsg(3), ["c"])])
    assert (s1, s2, s3) == (1, 2, 3)
    assert [store.backlog(n) for n in "abc"] == [2, 2, 2]
    assert [store.last_seq(n) for n in "abc"] == [2, 2, 3]
    assert store.backlog("nobody") == 0 and store.last_seq("nobody") == 0
    store.ack([("a", s1), ("b", s1)], "acked", 10)
    assert store.messages.live_seqs() == [1, 2, 3]  # c still owes s1
    store.ack([("c", s1), ("c", s3), ("zzz", s2), ("a", 999)], "dead-lettered", 11)
    assert store.messages.live_seqs() == [2]
    store.ack([("a", s2)], "acked", 12)
    store.ack([("a", s2)], "acked", 12)  # twice: ignored
    assert store.messages.live_seqs() == [2]
    store.ack([("b", s2)], "acked", 13)
    assert store.messages.live_seqs() == []
    assert outcomes(tmp_path / "pubsub-0") == {1: "dead-lettered", 2: "acked", 3: "dead-lettered"}
    assert pending(store) == set()
    with pytest.raises(ValueError, match="outcome"):
        store.ack([("a", 1)], "lost", 0)


def test_segments_retire_once_every_subscriber_acked(store: TopicStore, tmp_path: Path) -> None:
    body = b"x" * 1500
    seqs = [store.append([(tmsg(i, body=body), ["a", "b"])])[0] for i in range(8)]
    first_segments = len(store.messages.segments())
    assert first_segments > 3
    store.ack([("a", s) for s in seqs], "acked", 1)
    assert len(store.messages.segments()) == first_segments  # b still owes all of them
    store.ack([("b", s) for s in seqs[:-1]], "acked", 2)
    infos = store.messages.segments()
    assert len(infos) < first_segments
    assert infos[0].first_seq == seqs[-1]  # only the segment still holding the last one left
    store.ack([("b", seqs[-1])], "acked", 3)
    store.append([(tmsg(99), ["a"])])  # rolls past the full active segment: all retirable
    assert len(store.messages.segments()) <= 2
    assert store.messages.statistics().retired_segments >= first_segments - 1


def test_unsubscribe_settles_only_what_nobody_else_needs(store: TopicStore, tmp_path: Path) -> None:
    s1, s2, s3 = store.append([(tmsg(1), ["a", "b"]), (tmsg(2), ["a"]), (tmsg(3), ["b", "c"])])
    assert store.unsubscribe("a", 50) == 2
    assert store.subscriptions() == {"b": "/topic/t", "c": "/topic/t"}
    assert store.messages.live_seqs() == [s1, s3]
    assert outcomes(tmp_path / "pubsub-0") == {s2: "unsubscribed"}
    assert pending(store) == {("b", s1), ("b", s3), ("c", s3)}
    assert store.unsubscribe("a", 51) == 0  # gone already
    assert store.unsubscribe("b", 52) == 2
    assert store.messages.live_seqs() == [s3]
    with pytest.raises(ValueError, match="'a' is not a durable subscription"):
        store.append([(tmsg(4), ["a"])])


def test_append_refuses_bad_entries_before_writing(store: TopicStore) -> None:
    with pytest.raises(ValueError, match="no durable subscription"):
        store.append([(tmsg(1), ["a"]), (tmsg(2), [])])
    with pytest.raises(ValueError, match="not a durable subscription"):
        store.append([(tmsg(1), ["a", "ghost"])])
    with pytest.raises(TypeError, match="not a str"):
        store.append([(tmsg(1), "a")])
    assert store.append([]) == []
    assert store.messages.live_seqs() == []
    assert store.append([(tmsg(1), ["a", "a", "b"])]) == [1]  # a name twice: one row
    assert pending(store) == {("a", 1), ("b", 1)}


class _FailingExecutemany:
    """Stands in for the registry connection; the pending insert fails like a full disk."""

    def __init__(self, real: sqlite3.Connection) -> None:
        self.real = real

    def executemany(self, sql: str, *args: Any) -> sqlite3.Cursor:
        raise sqlite3.OperationalError("database or disk is full")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_failed_pending_insert_refuses_and_settles_the_batch(
    store: TopicStore, tmp_path: Path
) -> None:
    store.append([(tmsg(1), ["a"])])
    real = store._conn  # white-box
    store._conn = _FailingExecutemany(real)  # type: ignore[assignment]
    with pytest.raises(StoreError, match="disk is full") as info:
        store.append([(tmsg(2), ["a"]), (tmsg(3), ["b"])])
    assert info.value.path == tmp_path / "pubsub-0-durable.db"
    assert info.value.operation == "append"
    assert not real.in_transaction
    store._conn = real
    assert store.messages.live_seqs() == [1]  # the refused batch is not left live
    assert outcomes(tmp_path / "pubsub-0") == {2: "unsubscribed", 3: "unsubscribed"}
    assert store.append([(tmsg(4), ["a"])]) == [4]
    assert pending(store) == {("a", 1), ("a", 4)}


def test_returned_counts_deliveries(store: TopicStore, tmp_path: Path) -> None:
    s1, s2 = store.append([(tmsg(1), ["a", "b"]), (tmsg(2), ["a"])])
    store.returned([("a", s1)])
    store.returned([("a", s1), ("a", s2), ("ghost", s1), ("b", 999)])
    store.returned([])
    with open_reader(tmp_path) as reader:
        got = {m.seq: m.deliveries for m in batch(reader, "a").messages}
        assert got == {s1: 2, s2: 1}
        (only,) = batch(reader, "b").messages
        assert only.deliveries == 0 and not only.redelivered
    # The messages' own counts (what the export reads), over every subscription's returns.
    counts = {}
    for seg in sorted((tmp_path / "pubsub-0").glob("seg-*.db")):
        with contextlib.closing(sqlite3.connect(seg)) as conn:
            counts.update(conn.execute("SELECT seq, count FROM deliveries"))
    assert counts == {s1: 2, s2: 1}


class _FailingUpdates(_FailingExecutemany):
    """The registry connection, whose UPDATEs fail like a full disk."""

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql.startswith("UPDATE"):
            raise sqlite3.OperationalError("database or disk is full")
        return self.real.execute(sql, *args)


def test_returned_counts_the_disk_did_not_take_are_written_later(
    store: TopicStore, tmp_path: Path
) -> None:
    s1, s2 = store.append([(tmsg(1), ["a"]), (tmsg(2), ["a"])])
    real = store._conn  # white-box
    store._conn = _FailingUpdates(real)  # type: ignore[assignment]
    with pytest.raises(StoreError, match="disk is full"):
        store.returned([("a", s1)])
    with pytest.raises(StoreError, match="disk is full"):
        store.returned([("a", s1), ("a", s2)])
    assert store.unwritten_deliveries == 2  # (sub, seq) pairs kept in memory
    store._conn = real
    store.write_delivery_counts()
    assert store.unwritten_deliveries == 0
    with open_reader(tmp_path) as reader:
        got = {m.seq: (m.deliveries, m.redelivered) for m in batch(reader, "a").messages}
    assert got == {s1: (2, True), s2: (1, True)}


def test_expire(store: TopicStore, tmp_path: Path) -> None:
    s1, s2, s3 = store.append(
        [
            (tmsg(1, expires_ms=100), ["a", "b"]),
            (tmsg(2), ["a"]),
            (tmsg(3, expires_ms=500), ["c"]),
        ]
    )
    assert store.expired(now_ms=200, limit=10) == [s1]
    store.expire([s1], 200)
    store.expire([], 200)
    assert store.messages.live_seqs() == [s2, s3]
    assert pending(store) == {("a", s2), ("c", s3)}
    assert outcomes(tmp_path / "pubsub-0") == {s1: "expired"}
    assert store.expired(now_ms=1_000, limit=10) == [s3]


def test_reopen_keeps_subscriptions_and_pending_rows(tmp_path: Path) -> None:
    with open_topic(tmp_path) as store:
        store.subscribe("a", "/topic/t")
        store.subscribe("b", "/topic/u")
        store.subscribe("idle", "/topic/t")  # survives with an empty backlog
        store.append([(tmsg(1), ["a", "b"]), (tmsg(2), ["a"])])
        store.returned([("a", 2)])
        store.ack([("b", 1)], "acked", 5)
    with open_topic(tmp_path) as store:
        assert store.recover(10) == 0
        assert store.subscriptions() == {"a": "/topic/t", "b": "/topic/u", "idle": "/topic/t"}
        assert pending(store) == {("a", 1), ("a", 2)}
        assert store.messages.live_seqs() == [1, 2]
        assert store.append([(tmsg(3), ["idle"])]) == [3]
    with open_reader(tmp_path) as reader:
        assert [(m.seq, m.deliveries) for m in batch(reader, "a").messages] == [(1, 0), (2, 1)]


def test_recover_settles_orphans_and_drops_stale_rows(store: TopicStore, tmp_path: Path) -> None:
    s1, s2, s3 = store.append([(tmsg(1), ["a", "b"]), (tmsg(2), ["a"]), (tmsg(3), ["b"])])
    # A crash between the two commits of an append: messages without pending rows.
    (o4, o5) = store.messages.append([tmsg(4), tmsg(5)])
    # A crash between an ack's delete and its settle.
    store._conn.execute("DELETE FROM pending WHERE seq = ?", (s2,))
    # Pending rows for a settled message and for a subscription that no longer exists.
    store.messages.settle([s3], "acked", 1)
    store._conn.execute("INSERT INTO pending (sub, seq) VALUES ('ghost', ?)", (s1,))
    store._conn.execute("INSERT INTO pending (sub, seq) VALUES ('a', 777)")
    assert store.recover(20) == 3
    assert store.messages.live_seqs() == [s1]
    assert pending(store) == {("a", s1), ("b", s1)}
    assert outcomes(tmp_path / "pubsub-0") == {
        s2: "unsubscribed",
        s3: "acked",
        o4: "unsubscribed",
        o5: "unsubscribed",
    }
    assert store.recover(21) == 0


def test_reads_a_registry_file_from_before_the_pending_table(tmp_path: Path) -> None:
    _, registry = paths(tmp_path)
    # As the first release wrote it: only the subscriptions table, no migrations table.
    old = sqlite3.connect(registry)
    old.execute(
        "CREATE TABLE subscriptions (name TEXT PRIMARY KEY, destination TEXT, created_ms INTEGER)"
    )
    old.execute("INSERT INTO subscriptions VALUES ('client/sub', '/topic/t', 1)")
    old.commit()
    old.close()
    with open_topic(tmp_path) as store:
        assert store.subscriptions() == {"client/sub": "/topic/t"}
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL, as TINY
        store.subscribe("client/two", "/topic/u")
    conn = sqlite3.connect(registry)
    try:
        applied = [r[0] for r in conn.execute("SELECT name FROM _migrations ORDER BY rowid")]
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()
    assert applied == [name for name, _ in REGISTRY_MIGRATIONS]


def test_migrates_pending_rows_written_without_a_priority(tmp_path: Path) -> None:
    directory, registry = paths(tmp_path)
    # As the release before 0003 wrote it: pending rows without a priority column.
    old = sqlite_utils.Database(registry)
    old.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied_ms INTEGER)")
    apply_migrations(old, registry, 1, REGISTRY_MIGRATIONS[:2])
    assert "priority" not in old["pending"].columns_dict
    with MessageStore.open(directory, TINY) as messages:
        s1, s2, s3 = messages.append([tmsg(1, priority=9), tmsg(2), tmsg(3, priority=0)])
    old.execute("INSERT INTO subscriptions VALUES ('a', '/topic/t', 1), ('b', '/topic/t', 1)")
    old.conn.executemany(
        "INSERT INTO pending (sub, seq, deliveries) VALUES (?, ?, ?)",
        [("a", s1, 0), ("a", s2, 1), ("a", s3, 0), ("b", s2, 0)],
    )
    old.conn.commit()
    old.close()
    with open_topic(tmp_path) as store:
        assert store.recover(10) == 0
        # Their messages' priorities are in another database: the rows get the default one.
        assert priorities(store) == {("a", s1): 4, ("a", s2): 4, ("a", s3): 4, ("b", s2): 4}
        (s4,) = store.append([(tmsg(4, priority=9), ["a"])])
        assert priorities(store)[("a", s4)] == 9
        assert store.pending_after("a", at(s3)) and not store.pending_after("a", at(s4, 9, at(s3)))
    conn = sqlite3.connect(registry)
    try:
        applied = [r[0] for r in conn.execute("SELECT name FROM _migrations ORDER BY rowid")]
    finally:
        conn.close()
    assert applied == [name for name, _ in REGISTRY_MIGRATIONS]
    assert applied[-1] == "0005_subscription_owner"
    with open_reader(tmp_path) as reader:
        got = batch(reader, "a")
        assert [(m.seq, m.deliveries) for m in got.messages] == [(s4, 0), (s1, 0), (s2, 1), (s3, 0)]
        assert got.scanned_upto == at(s4, 9, at(s3)) and not got.more
    with open_topic(tmp_path) as store:
        # Subscriptions made before selectors existed select everything, and those made
        # before users existed belong to nobody.
        assert store.selectors() == {}
        assert store.owners() == {}


def test_a_subscription_keeps_its_selector_across_restarts(tmp_path: Path) -> None:
    with open_topic(tmp_path) as store:
        store.subscribe("a", "/topic/t", "color = 'red'")
        store.subscribe("b", "/topic/t")
        store.subscribe("c", "/topic/t", "x > 1")
        store.subscribe("c", "/topic/t")  # replaced without one
    with open_topic(tmp_path) as store:
        assert store.selectors() == {"a": "color = 'red'"}
        assert store.subscriptions() == {"a": "/topic/t", "b": "/topic/t", "c": "/topic/t"}
        store.unsubscribe("a", 10)
        assert store.selectors() == {}


def test_foreign_or_newer_registry_refused(tmp_path: Path) -> None:
    _, registry = paths(tmp_path)
    conn = sqlite3.connect(registry)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="not an mpbroker durable registry") as info:
        open_topic(tmp_path)
    assert info.value.path == registry
    registry.unlink()
    open_topic(tmp_path).close()
    conn = sqlite3.connect(registry)
    conn.execute("INSERT INTO _migrations (name, applied_ms) VALUES ('9999_future', 0)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match=r"newer.*9999_future"):
        open_topic(tmp_path)


def test_closed_store_refuses(tmp_path: Path) -> None:
    store = open_topic(tmp_path)
    store.subscribe("a", "/topic/t")
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.append([(tmsg(1), ["a"])])
    with pytest.raises(StoreError, match="closed"):
        store.backlog("a")


# -- TopicStoreReader ---------------------------------------------------------------------------


def test_reader_gives_a_subscription_its_backlog_in_order(
    store: TopicStore, tmp_path: Path
) -> None:
    entries = [(tmsg(i, body=b"x" * 700), ["a"] if i % 3 else ["a", "b"]) for i in range(20)]
    seqs: list[int] = []
    for k in range(0, 20, 5):
        seqs += store.append(entries[k : k + 5])
    assert len(store.messages.segments()) == 4
    store.ack([("a", seqs[4])], "acked", 1)
    with open_reader(tmp_path) as reader:
        got = batch(reader, "a")
        assert [m.seq for m in got.messages] == [s for s in seqs if s != seqs[4]]
        assert got.scanned_upto == at(seqs[-1]) and not got.more and got.expired == []
        first = got.messages[0]
        assert first == Message(
            message_id="t0",
            destination="/topic/t",
            headers={"n": "0"},
            body=b"x" * 700,
            timestamp_ms=1_000,
            persistent=True,
            size=message_size(entries[0][0]),
            seq=seqs[0],
        )
        assert got.bytes == sum(m.size for m in got.messages)
        assert [m.seq for m in batch(reader, "b").messages] == seqs[::3]
        tail = batch(reader, "a", after=at(seqs[15]))
        assert [m.seq for m in tail.messages] == seqs[16:]
        done = batch(reader, "a", after=at(seqs[-1]))
        assert (done.messages, done.more, done.scanned_upto) == ([], False, at(seqs[-1]))
        nobody = batch(reader, "nobody")
        assert (nobody.messages, nobody.more, nobody.scanned_upto) == ([], False, ZERO)


def test_reader_limits(store: TopicStore, tmp_path: Path) -> None:
    sizes = [100, 100, 5000, 100, 100]
    seqs = store.append([(tmsg(i, body=b"y" * n), ["a"]) for i, n in enumerate(sizes)])
    size = [message_size(tmsg(i, body=b"y" * n)) for i, n in enumerate(sizes)]
    with open_reader(tmp_path) as reader:
        got = batch(reader, "a", max_messages=2)
        assert [m.seq for m in got.messages] == seqs[:2]
        assert got.more and got.scanned_upto == at(seqs[1]) and got.bytes == size[0] + size[1]
        # Stops before the message that would exceed max_bytes.
        got = batch(reader, "a", max_bytes=size[0] + size[1] + 10)
        assert [m.seq for m in got.messages] == seqs[:2] and got.more
        # A message larger than every limit still goes alone with at_least_one...
        got = batch(reader, "a", after=at(seqs[1]), max_bytes=1000)
        assert [m.seq for m in got.messages] == [seqs[2]]
        assert got.more and got.scanned_upto == at(seqs[2]) and got.bytes == size[2]
        # ...and not at all without it.
        got = batch(reader, "a", after=at(seqs[1]), max_bytes=1000, at_least_one=False)
        assert got.messages == [] and got.more and got.scanned_upto == at(seqs[1])
        # Exactly max_messages left: no more.
        got = batch(reader, "a", after=at(seqs[2]), max_messages=2)
        assert [m.seq for m in got.messages] == seqs[3:] and not got.more
        with pytest.raises(ValueError, match="max_messages"):
            batch(reader, "a", max_messages=0)
        with pytest.raises(ValueError, match="one per priority"):
            batch(reader, "a", after=[0] * 9)


def test_reader_reports_expired_outside_the_limits(store: TopicStore, tmp_path: Path) -> None:
    seqs = store.append(
        [
            (tmsg(0, expires_ms=100), ["a"]),
            (tmsg(1), ["a"]),
            (tmsg(2, expires_ms=100), ["a"]),
            (tmsg(3, expires_ms=100), ["a"]),
            (tmsg(4, expires_ms=900), ["a"]),
            (tmsg(5), ["a"]),
        ]
    )
    with open_reader(tmp_path) as reader:
        got = batch(reader, "a", max_messages=2, now_ms=500)
        assert [m.seq for m in got.messages] == [seqs[1], seqs[4]]
        assert got.expired == [seqs[0], seqs[2], seqs[3]]
        assert got.more and got.scanned_upto == at(seqs[4])
        got = batch(reader, "a", now_ms=100)  # expires_ms <= now_ms is expired
        assert got.expired == [seqs[0], seqs[2], seqs[3]] and len(got.messages) == 3
        # Only expired rows left: nothing to deliver, and nothing more.
        store.ack([("a", s) for s in (seqs[1], seqs[4], seqs[5])], "acked", 1)
        got = batch(reader, "a", now_ms=500)
        assert got.messages == [] and got.expired == [seqs[0], seqs[2], seqs[3]]
        assert not got.more and got.scanned_upto == at(seqs[3]) and got.bytes == 0


# -- priorities ----------------------------------------------------------------------------------


def read_all(reader: TopicStoreReader, name: str, **kw: Any) -> tuple[list[list[int]], list[int]]:
    """Every batch's seqs, following the cursors until no more; and the last cursors."""
    seen: list[list[int]] = []
    after = ZERO
    while True:
        got = batch(reader, name, after=after, **kw)
        seen.append([m.seq for m in got.messages])
        assert len(got.scanned_upto) == 10
        assert all(new >= old for new, old in zip(got.scanned_upto, after, strict=True))
        after = got.scanned_upto
        if not got.more:
            return seen, after


def test_append_writes_each_message_priority(store: TopicStore) -> None:
    s1, s2 = store.append([(tmsg(1, priority=9), ["a", "b"]), (tmsg(2, priority=0), ["a"])])
    assert priorities(store) == {("a", s1): 9, ("b", s1): 9, ("a", s2): 0}
    with pytest.raises(ValueError, match="priority 10 not in 0-9"):
        store.append([(tmsg(3), ["a"]), (tmsg(4, priority=10), ["a"])])
    with pytest.raises(ValueError, match="priority -1"):
        store.append([(tmsg(5, priority=-1), ["a"])])
    assert store.messages.live_seqs() == [s1, s2]  # refused before any write


def test_reader_gives_the_highest_priority_first_across_batches(
    store: TopicStore, tmp_path: Path
) -> None:
    fours = store.append([(tmsg(i), ["a"]) for i in range(300)])
    nines = store.append([(tmsg(300 + i, priority=9), ["a"]) for i in range(5)])
    with open_reader(tmp_path) as reader:
        got = batch(reader, "a")
        assert [m.seq for m in got.messages] == nines + fours[:95]
        assert [m.priority for m in got.messages[:6]] == [9] * 5 + [4]
        assert got.more and got.scanned_upto == at(fours[94], 4, at(nines[-1], 9))
        seen, last = read_all(reader, "a")
        assert [seq for seqs in seen for seq in seqs] == nines + fours
        assert [len(b) for b in seen] == [100, 100, 100, 5]
        assert last == at(fours[-1], 4, at(nines[-1], 9))


def test_reader_is_fifo_within_each_priority(store: TopicStore, tmp_path: Path) -> None:
    prios = [(i * 7) % 10 for i in range(40)] + [3, 3, 9, 0, 9]
    seqs = store.append([(tmsg(i, priority=p), ["a"]) for i, p in enumerate(prios)])
    expected = [s for s, _ in sorted(zip(seqs, prios, strict=True), key=lambda sp: -sp[1])]
    with open_reader(tmp_path) as reader:
        assert [m.seq for m in batch(reader, "a").messages] == expected
        seen, last = read_all(reader, "a", max_messages=4)
        assert [seq for seqs in seen for seq in seqs] == expected
        assert last == [
            max(s for s, p in zip(seqs, prios, strict=True) if p == q) for q in range(10)
        ]


def test_reader_keeps_a_cursor_per_priority(store: TopicStore, tmp_path: Path) -> None:
    fours = store.append([(tmsg(i), ["a"]) for i in range(20)])
    (nine,) = store.append([(tmsg(20, priority=9), ["a"])])
    with open_reader(tmp_path) as reader:
        got = batch(reader, "a", max_messages=5)
        assert [m.seq for m in got.messages] == [nine, *fours[:4]]
        after = got.scanned_upto
        assert after == at(fours[3], 4, at(nine, 9))
        # Appended after the reader passed priority 9 (and with a seq above every four):
        # seq > after[9], so the next batch starts with it, then the fours go on.
        late = store.append([(tmsg(21, priority=9), ["a"]), (tmsg(22, priority=7), ["a"])])
        got = batch(reader, "a", after=after, max_messages=5)
        assert [m.seq for m in got.messages] == [late[0], late[1], *fours[4:7]]
        assert got.scanned_upto == at(fours[6], 4, at(late[1], 7, at(late[0], 9)))
        # A cursor past a row means it was delivered: not read again, though still pending.
        assert store.backlog("a") == 23
        got = batch(reader, "a", after=got.scanned_upto)
        assert [m.seq for m in got.messages] == fours[7:] and not got.more
        assert store.pending_after("a", at(fours[6], 4, got.scanned_upto))
        assert not store.pending_after("a", got.scanned_upto)


def test_reader_stops_at_a_priority_and_keeps_the_lower_cursors(
    store: TopicStore, tmp_path: Path
) -> None:
    fours = store.append([(tmsg(i), ["a"]) for i in range(3)])
    nines = store.append([(tmsg(3 + i, priority=9), ["a"]) for i in range(3)])
    with open_reader(tmp_path) as reader:
        got = batch(reader, "a", max_messages=2)
        assert [m.seq for m in got.messages] == nines[:2]
        assert got.more and got.scanned_upto == at(nines[1], 9)  # priority 4 not looked at
        # Exactly the nines left: the batch is full but the fours are still to read.
        got = batch(reader, "a", after=at(nines[1], 9), max_messages=1)
        assert [m.seq for m in got.messages] == nines[2:] and got.more
        assert got.scanned_upto == at(nines[2], 9)
        # The bytes limit stops the same way at the next priority.
        got = batch(reader, "a", after=at(nines[1], 9), max_bytes=1, at_least_one=True)
        assert [m.seq for m in got.messages] == nines[2:] and got.more
        got = batch(reader, "a", after=at(nines[2], 9), max_messages=3)
        assert [m.seq for m in got.messages] == fours and not got.more
        assert got.scanned_upto == at(fours[-1], 4, at(nines[2], 9))


def test_scan_limit_across_priorities(tmp_path: Path) -> None:
    with open_topic(tmp_path, StoreSettings(synchronous="off")) as store:
        store.subscribe("a", "/topic/t")
        (four,) = store.append([(tmsg(0), ["a"])])
        dead = store.append([(tmsg(1 + i, priority=9, expires_ms=5), ["a"]) for i in range(1030)])
        with open_reader(tmp_path) as reader:
            got = batch(reader, "a", max_messages=1, now_ms=10)
            assert got.messages == [] and got.expired == dead[:1024] and got.more
            assert got.scanned_upto == at(dead[1023], 9)
            got = batch(reader, "a", after=got.scanned_upto, max_messages=1, now_ms=10)
            assert [m.seq for m in got.messages] == [four] and got.expired == dead[1024:]
            assert not got.more and got.scanned_upto == at(four, 4, at(dead[-1], 9))


def test_pending_after(store: TopicStore) -> None:
    assert not store.pending_after("a", ZERO)
    s1, s2, s3 = store.append(
        [(tmsg(1), ["a"]), (tmsg(2, priority=9), ["a", "b"]), (tmsg(3, priority=0), ["a"])]
    )
    assert store.pending_after("a", ZERO) and store.pending_after("b", ZERO)
    assert not store.pending_after("nobody", ZERO)
    done = [s3, 0, 0, 0, s1, 0, 0, 0, 0, s2]
    assert not store.pending_after("a", done)
    for p in (0, 4, 9):  # one row left behind its own priority's cursor
        assert store.pending_after("a", at(done[p] - 1, p, done))
    # Cursors are per priority: past s3 at priority 4 says nothing of priority 9's row s2.
    assert store.pending_after("b", at(s3, 4)) and not store.pending_after("b", at(s2, 9))
    store.ack([("a", s2)], "acked", 1)
    assert not store.pending_after("a", at(0, 9, done))
    for wrong in ([0] * 9, [0] * 11, []):
        with pytest.raises(ValueError, match="one per priority"):
            store.pending_after("a", wrong)


def test_backlog_queries_use_the_priority_index(store: TopicStore) -> None:
    for sql, args in (
        (_SELECT_PENDING, ("a", 4, 0, 100)),
        (_PRIORITIES_AFTER, ("a", *ZERO)),
        (_PRIORITIES_AFTER + " LIMIT 1", ("a", *ZERO)),
    ):
        plan = [row[-1] for row in store._conn.execute(f"EXPLAIN QUERY PLAN {sql}", args)]
        searches = [step for step in plan if "pending" in step]
        assert searches and all(
            "pending_sub_priority (sub=? AND priority=? AND seq>?)" in step for step in searches
        ), plan


def test_reader_redeliver_below(store: TopicStore, tmp_path: Path) -> None:
    seqs = store.append([(tmsg(i), ["a"]) for i in range(4)])
    store.returned([("a", seqs[3])])
    with open_reader(tmp_path) as reader:
        got = batch(reader, "a", redeliver_below=seqs[2])
        assert [(m.deliveries, m.redelivered) for m in got.messages] == [
            (1, True),
            (1, True),
            (0, False),
            (1, True),
        ]


def test_reader_sees_writes_made_after_it_opened(store: TopicStore, tmp_path: Path) -> None:
    with open_reader(tmp_path) as reader:
        assert batch(reader, "a").messages == []
        body = b"z" * 1500
        seqs: list[int] = []
        for i in range(6):  # new segments appear while the reader is open
            seqs += store.append([(tmsg(i, body=body), ["a"])])
            got = batch(reader, "a")
            assert [m.seq for m in got.messages] == seqs
        assert len(store.messages.segments()) > 2
        store.ack([("a", seqs[0])], "acked", 1)
        assert [m.seq for m in batch(reader, "a").messages] == seqs[1:]


def test_reader_skips_retired_segments_and_never_recreates_them(
    store: TopicStore, tmp_path: Path
) -> None:
    body = b"r" * 1500
    seqs = [store.append([(tmsg(i, body=body), ["a", "b"])])[0] for i in range(6)]
    first = store.messages.segments()[0].path
    with open_reader(tmp_path) as reader:
        assert [m.seq for m in batch(reader, "b").messages] == seqs  # opens every segment
        store.ack([("a", s) for s in seqs[:2]], "acked", 1)
        store.ack([("b", s) for s in seqs[:2]], "acked", 1)
        assert not first.exists()  # retired
        # Behind the writer's back, pending rows for the retired messages come back (as if
        # read just before the ack): their messages cannot be found and are skipped.
        conn = sqlite3.connect(tmp_path / "pubsub-0-durable.db")
        conn.execute("INSERT INTO pending (sub, seq) VALUES ('a', ?), ('a', ?)", seqs[:2])
        conn.commit()
        conn.close()
        got = batch(reader, "a", max_messages=3)
        assert [m.seq for m in got.messages] == seqs[2:5]
        assert got.more and got.expired == []
        assert reader._known and all(f.path.exists() for f in reader._known.values())
    assert not first.exists()
    assert not [p for p in (tmp_path / "pubsub-0").iterdir() if p.name.startswith(first.name)]


def test_reader_while_a_writer_appends_and_acks(tmp_path: Path) -> None:
    """A writer thread (its own connections) appends; "b" acks at once, "a" 20 messages
    behind, so segments roll and retire under the reader that follows "a": its batches are
    ascending, every message it gives is whole, and it gets the ones never acked."""
    rolling = StoreSettings(segment_max_bytes=48 * 1024, segment_max_age_s=0, synchronous="normal")
    with open_topic(tmp_path, rolling) as store:
        store.subscribe("a", "/topic/t")
        store.subscribe("b", "/topic/t")
    total, lag = 300, 20
    errors: list[BaseException] = []
    retired: list[int] = []

    def write() -> None:
        try:
            with open_topic(tmp_path, rolling) as writer:
                for i in range(total):
                    body = bytes([i % 256]) * 400
                    (seq,) = writer.append([(tmsg(i, body=body), ["a", "b"])])
                    writer.ack([("b", seq)], "acked", i)
                    if seq > lag:
                        writer.ack([("a", seq - lag)], "acked", i)
                retired.append(writer.messages.statistics().retired_segments)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    seen: list[int] = []
    after = ZERO
    with open_reader(tmp_path) as reader:
        while True:
            alive = thread.is_alive()
            got = batch(reader, "a", after=after, max_messages=16)
            for m in got.messages:
                i = int(m.message_id[1:])
                assert m.seq == i + 1 and m.body == bytes([i % 256]) * 400
            seen += [m.seq for m in got.messages]
            after = got.scanned_upto
            if not alive and not got.more:
                break
    thread.join()
    assert errors == []
    assert retired[0] > 3
    assert seen == sorted(set(seen))
    assert seen[-lag:] == list(range(total - lag + 1, total + 1))


def test_reader_errors_name_the_file(tmp_path: Path) -> None:
    directory, registry = paths(tmp_path)
    with pytest.raises(StoreError) as info:
        TopicStoreReader(directory, registry, StoreSettings().sqlite_cache_bytes)
    assert info.value.path == registry
    assert not registry.exists()  # mode=rw: never creates a database
    open_topic(tmp_path).close()
    with open_reader(tmp_path) as reader:
        reader.close()
        with pytest.raises(StoreError, match="closed"):
            batch(reader, "a")


# -- property: the two databases agree ----------------------------------------------------------

NAMES = ("a", "b", "c")
op = st.one_of(
    st.tuples(
        st.just("append"),
        st.lists(
            st.tuples(st.sets(st.sampled_from(NAMES), min_size=1), st.sampled_from((0, 4, 4, 9))),
            max_size=4,
        ),
    ),
    st.tuples(st.just("ack"), st.lists(st.tuples(st.sampled_from(NAMES), st.integers(1, 40)))),
    st.tuples(st.just("expire"), st.lists(st.integers(1, 40), max_size=3)),
    st.tuples(st.just("unsubscribe"), st.sampled_from(NAMES)),
    st.tuples(st.just("reopen"), st.none()),
)


@settings(max_examples=40)
@given(ops=st.lists(op, max_size=25))
def test_live_messages_are_exactly_those_someone_owes(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, Any]]
) -> None:
    root = tmp_path_factory.mktemp("prop")
    model: dict[int, set[str]] = {}  # seq -> subscriptions that owe it
    priority: dict[int, int] = {}  # seq -> its message's priority
    store = open_topic(root)
    try:
        for name in NAMES:
            store.subscribe(name, "/topic/t")
        for kind, arg in ops:
            if kind == "append" and arg:
                present = set(store.subscriptions())
                entries = [
                    (tmsg(i, body=b"p" * 600, priority=p), sorted(s & present))
                    for i, (s, p) in enumerate(arg)
                ]
                entries = [(m, names) for m, names in entries if names]
                for seq, (m, names) in zip(store.append(entries), entries, strict=True):
                    model[seq] = set(names)
                    priority[seq] = m.priority
            elif kind == "ack":
                store.ack(arg, "acked", 1)
                for name, seq in arg:
                    model.get(seq, set()).discard(name)
            elif kind == "expire":
                store.expire(arg, 2)
                for seq in arg:
                    model.pop(seq, None)
            elif kind == "unsubscribe":
                store.unsubscribe(arg, 3)
                for owed in model.values():
                    owed.discard(arg)
                store.subscribe(arg, "/topic/t")
            elif kind == "reopen":
                store.close()
                store = open_topic(root)
                assert store.recover(4) == 0
            model = {seq: owed for seq, owed in model.items() if owed}
            live = store.messages.live_seqs()
            assert live == sorted(model)
            assert live == sorted({seq for _, seq in pending(store)})
            assert pending(store) == {(n, s) for s, owed in model.items() for n in owed}
    finally:
        store.close()
    with open_reader(root) as reader:
        for name in NAMES:
            # Highest priority first, FIFO within a priority; in one batch or following the
            # cursors over small ones.
            expected = sorted(
                (s for s, o in model.items() if name in o), key=lambda s: -priority[s]
            )
            assert [m.seq for m in batch(reader, name).messages] == expected
            seen, _ = read_all(reader, name, max_messages=2)
            assert [seq for seqs in seen for seq in seqs] == expected


def test_reader_returns_the_encoding_of_compressed_bodies(
    store: TopicStore, tmp_path: Path
) -> None:
    packed, encoding = compress(b'{"price": 1.25, "symbol": "ACME"}\n' * 60, "zlib")
    compressed = msgspec.structs.replace(tmsg(1, body=packed), encoding=encoding)
    seqs = store.append([(compressed, ["a"]), (tmsg(2), ["a"])])
    with open_reader(tmp_path) as reader:
        got = batch(reader, "a")
    assert [(m.seq, m.encoding, m.body) for m in got.messages] == [
        (seqs[0], "zlib", packed),
        (seqs[1], "", b"body 2"),
    ]
    assert got.messages[0].size == message_size(compressed)


def test_a_subscription_belongs_to_its_owner_across_restarts(tmp_path: Path) -> None:
    with open_topic(tmp_path) as store:
        store.subscribe("app/a", "/topic/t", owner="alice")
        store.subscribe("app/b", "/topic/t")
        assert store.owners() == {"app/a": "alice"}
        store.claim("app/b", "bob")
    with open_topic(tmp_path) as store:
        assert store.owners() == {"app/a": "alice", "app/b": "bob"}
        store.unsubscribe("app/a", 1)
        assert store.owners() == {"app/b": "bob"}
