"""MessageStore on real SQLite files: round trips, ordering, settling, retirement, rolling."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mpbroker.compression import compress
from mpbroker.config import StoreSettings
from mpbroker.records import message_size
from mpbroker.stores import MessageStore, StoreError

from .helpers import Clock, msg

TINY = StoreSettings(segment_max_bytes=4096, segment_max_age_s=0)
DEFAULT = StoreSettings()


def open_store(path: Path, settings: StoreSettings = DEFAULT, **kw: Any) -> MessageStore:
    return MessageStore.open(path, settings, **kw)


def test_append_live_round_trip(tmp_path: Path) -> None:
    body = bytes(range(256)) * 3
    headers = {"type": "order", "ünï": "cödé", "empty": "", "colon:key": "a\nb"}
    sent = [msg(1, body=body, headers=headers, expires_ms=99_999), msg(2, body=b"")]
    with open_store(tmp_path) as store:
        assert store.append(sent) == [1, 2]
        assert store.append([]) == []
    with open_store(tmp_path) as store:
        got = store.live()
        assert [g.seq for g in got] == [1, 2]
        first = got[0].message
        assert first.body == body and first.headers == headers
        assert first.expires_ms == 99_999 and first.message_id == "m1"
        assert first.timestamp_ms == 1_001 and first.destination == "/queue/a"
        assert first.persistent and not first.redelivered
        assert first.size == message_size(sent[0])
        assert first.seq == 1 and got[0].deliveries == 0
        assert got[1].message.body == b""
        assert store.read(2).message.message_id == "m2"
        assert store.append([msg(3)]) == [3]  # seqs continue after a reopen


def test_read_ahead_gives_the_live_messages_from_a_seq_on_within_its_limits(
    tmp_path: Path,
) -> None:
    with open_store(tmp_path) as store:
        seqs = store.append([msg(i, body=b"x" * 100) for i in range(10)])
        store.settle([seqs[2], seqs[3]], "acked", at_ms=10)
        got = store.read_ahead(seqs[1], 5, 10_000)
        # Settled ones are skipped; the range is the seqs from the first (5 of them).
        assert [g.seq for g in got] == [seqs[1], seqs[4], seqs[5]]
        assert got == [store.read(g.seq) for g in got]
        # Past the first, only while the bodies fit: the first always comes.
        assert [g.seq for g in store.read_ahead(seqs[4], 10, 250)] == [seqs[4], seqs[5]]
        assert [g.seq for g in store.read_ahead(seqs[4], 10, 0)] == [seqs[4]]
        with pytest.raises(KeyError):
            store.read_ahead(seqs[2], 5, 10_000)


def test_read_ahead_stays_in_the_segment_of_its_seq(tmp_path: Path) -> None:
    with open_store(tmp_path, TINY) as store:
        seqs = [store.append([msg(i, body=b"x" * 1500)])[0] for i in range(6)]
        assert len(store.segments()) > 2
        got = store.read_ahead(seqs[0], 64, 1 << 20)
        assert [g.seq for g in got] == seqs[: len(got)] and len(got) < len(seqs)


def test_live_orders_by_priority_then_seq(tmp_path: Path) -> None:
    with open_store(tmp_path, TINY) as store:
        prios = [4, 9, 0, 4, 9, 7, 0, 4]
        for i, p in enumerate(prios):  # one per append, across several segments
            store.append([msg(i, priority=p, body=b"x" * 1500)])
        assert len(store.segments()) > 2
        order = [(m.message.priority, m.seq) for m in store.live()]
    expected = sorted(((p, i + 1) for i, p in enumerate(prios)), key=lambda t: (-t[0], t[1]))
    assert order == expected


def test_settle_removes_and_is_idempotent(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        seqs = store.append([msg(i) for i in range(5)])
        store.settle(seqs[:2], "acked", at_ms=10)
        store.settle([seqs[0], 999, -1], "expired", at_ms=11)  # settled / unknown: no-op
        store.settle([], "acked", at_ms=12)
        assert [m.seq for m in store.live()] == seqs[2:]
        stats = store.statistics()
        assert stats.settles == 2 and stats.live_messages == 3
        with pytest.raises(KeyError):
            store.read(seqs[0])
        with pytest.raises(ValueError, match="outcome"):
            store.settle(seqs, "lost", at_ms=0)
    with open_store(tmp_path) as store:
        assert [m.seq for m in store.live()] == seqs[2:]


def test_record_delivery_counts_survive_reopen(tmp_path: Path) -> None:
    with open_store(tmp_path, TINY) as store:
        a, b = store.append([msg(1), msg(2)])
        store.record_delivery([a])
        store.record_delivery([a, b, 12345])
        store.roll()  # the counts now live in an older segment; newer rows must win
        store.record_delivery([a])
        assert {m.seq: m.deliveries for m in store.live()} == {a: 3, b: 1}
    with open_store(tmp_path, TINY) as store:
        live = {m.seq: m for m in store.live()}
        assert live[a].deliveries == 3 and live[b].deliveries == 1
        assert live[a].message.redelivered and live[a].message.deliveries == 3
        store.settle([b], "acked", 0)
        store.record_delivery([b])  # settled: ignored
    with open_store(tmp_path, TINY) as store:
        assert {m.seq: m.deliveries for m in store.live()} == {a: 3}


def test_expired(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        seqs = store.append(
            [
                msg(0, expires_ms=0),  # never expires
                msg(1, expires_ms=500),
                msg(2, expires_ms=100),
                msg(3, expires_ms=2_000),
                msg(4, expires_ms=1_000),
            ]
        )
        assert store.expired(now_ms=50, limit=10) == []
        assert store.expired(now_ms=1_000, limit=10) == [seqs[2], seqs[1], seqs[4]]
        assert store.expired(now_ms=1_000, limit=2) == [seqs[2], seqs[1]]
        store.settle([seqs[2]], "expired", at_ms=1_000)
        assert store.expired(now_ms=1_000, limit=10) == [seqs[1], seqs[4]]


def test_roll_by_bytes(tmp_path: Path) -> None:
    settings = StoreSettings(segment_max_bytes=64 * 1024, segment_max_age_s=0)
    with open_store(tmp_path, settings) as store:
        for i in range(60):
            store.append([msg(i, body=b"x" * 4000)])
        infos = store.segments()
        assert len(infos) >= 3
        assert all(s.sealed for s in infos[:-1]) and not infos[-1].sealed
        # Sealed segments stop shortly past the limit (a roll happens before the next append).
        for s in infos[:-1]:
            assert s.path.stat().st_size <= 64 * 1024 + 8 * 4096
        # seqs are contiguous across segments
        ranges = [(s.first_seq, s.last_seq) for s in infos]
        for (_, last), (first, _) in itertools.pairwise(ranges):
            assert last is not None and first == last + 1
    with open_store(tmp_path, settings) as store:
        assert len(store.live()) == 60
        assert [s.sealed for s in store.segments()] == [s.sealed for s in infos]


def test_roll_by_age(tmp_path: Path) -> None:
    clock = Clock()
    settings = StoreSettings(segment_max_age_s=10.0)
    with open_store(tmp_path, settings, clock=clock) as store:
        store.append([msg(1)])
        clock.now += 9.9
        store.append([msg(2)])
        assert len(store.segments()) == 1
        clock.now += 0.1
        store.append([msg(3)])
        assert [(s.first_seq, s.last_seq) for s in store.segments()] == [(1, 2), (3, 3)]
        clock.now += 100  # an active segment without messages is not rolled by age
    with open_store(tmp_path, settings, clock=clock) as store:
        # The age is persistent: the second segment is 100 s old after the reopen.
        store.append([msg(4)])
        assert [(s.first_seq, s.last_seq) for s in store.segments()] == [(1, 2), (3, 3), (4, 4)]


@pytest.mark.parametrize("archive", [False, True], ids=["delete", "archive"])
def test_fully_settled_sealed_segment_is_retired(tmp_path: Path, archive: bool) -> None:
    settings = StoreSettings(segment_max_age_s=0, archive=archive)
    with open_store(tmp_path, settings) as store:
        first = store.append([msg(1), msg(2)])
        store.roll()
        second = store.append([msg(3)])
        store.settle(first[:1], "acked", 1)
        assert len(store.segments()) == 2
        store.settle(first[1:], "acked", 2)
        infos = store.segments()
        assert [s.index for s in infos] == [2]
        assert store.statistics().retired_segments == 1
        store.roll()  # the active one is never retired; roll it while it is still live
        assert [s.index for s in store.segments()] == [2, 3]
        store.settle(second, "dead-lettered", 3)
        assert [s.index for s in store.segments()] == [3]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "seg-00000001.db" not in names and "seg-00000002.db" not in names
    archived = tmp_path / "archive"
    if archive:
        assert sorted(p.name for p in archived.iterdir()) == ["seg-00000001.db", "seg-00000002.db"]
        # The archived file is self-contained and still holds its messages.
        conn = sqlite3.connect(archived / "seg-00000001.db")
        try:
            assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2
        finally:
            conn.close()
    else:
        assert not archived.exists()
    with open_store(tmp_path, settings) as store:
        assert store.live() == []
        assert store.append([msg(9)]) == [4]  # seqs never restart, even with all retired


def test_ack_compaction_never_resurrects(tmp_path: Path) -> None:
    """Segment 1 holds a stuck live message; segment 2's messages are settled by rows in
    segments 2 and 3; segment 2 is retired; its settlement rows for segment 1 must survive."""
    settings = StoreSettings(segment_max_age_s=0)
    with open_store(tmp_path, settings) as store:
        stuck, s1_done = store.append([msg(1), msg(2)])
        store.roll()
        s2 = store.append([msg(3), msg(4)])
        # In segment 2: settle one of its own and one of segment 1, record a delivery of stuck.
        store.settle([s2[0], s1_done], "acked", 10)
        store.record_delivery([stuck])
        store.roll()
        store.append([msg(5)])
        assert [s.index for s in store.segments()] == [1, 2, 3]
        store.settle([s2[1]], "acked", 11)  # row in segment 3 -> segment 2 all settled
        assert [s.index for s in store.segments()] == [1, 3]
    assert not (tmp_path / "seg-00000002.db").exists()
    with open_store(tmp_path, settings) as store:
        live = store.live()
        assert [m.seq for m in live] == [stuck, 5]
        assert live[0].deliveries == 1
        assert [s.live for s in store.segments()] == [1, 1]
        # And the carried rows keep working when the stuck message finally settles.
        store.settle([stuck], "acked", 12)
        assert [s.index for s in store.segments()] == [3]
    with open_store(tmp_path, settings) as store:
        assert [m.seq for m in store.live()] == [5]


def test_statistics_and_segments(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        store.append([msg(1, body=b"12345", headers={"k": "v"})])
        store.append([msg(2, body=b"1", headers={})])
        store.settle([2], "acked", 0)
        st = store.statistics()
        assert st.segments == 1 and st.live_messages == 1 and st.live_bytes == 7
        assert st.appends == 2 and st.append_transactions == 2 and st.settles == 1
        assert st.active_segment == tmp_path / "seg-00000001.db"
        assert st.active_segment_bytes > 0
        (info,) = store.segments()
        assert (info.first_seq, info.last_seq, info.messages, info.live) == (1, 2, 2, 1)
    with pytest.raises(StoreError, match="closed"):
        store.append([msg(3)])


def test_live_counts_survive_reopen_with_settled_holes(tmp_path: Path) -> None:
    sent = [msg(i, body=b"x" * i) for i in range(1, 9)]
    with open_store(tmp_path) as store:
        seqs = store.append(sent)
        store.settle([seqs[0], seqs[3], seqs[4], seqs[7]], "acked", 0)
        before = store.statistics()
        assert before.live_messages == 4
        assert before.live_bytes == sum(message_size(sent[i]) for i in (1, 2, 5, 6))
    with open_store(tmp_path) as store:
        after = store.statistics()
        assert (after.live_messages, after.live_bytes) == (4, before.live_bytes)
        assert store.live_seqs() == [seqs[i] for i in (1, 2, 5, 6)]
        assert store.append([msg(9)]) == [9]  # the active segment's LiveSet carries on
        store.settle([seqs[1], seqs[2], seqs[5], seqs[6]], "acked", 0)
        assert store.live_seqs() == [9]
        assert store.statistics().live_bytes == message_size(msg(9))


def test_negative_preset_size_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        bad = msgspec.structs.replace(msg(2), size=-1)
        with pytest.raises(ValueError, match="negative"):
            store.append([msg(1), bad])
        assert store.live_seqs() == [] and store.statistics().appends == 0
        assert store.append([msg(3)]) == [1]


class _FailingCommit:
    """Stands in for the segment's sqlite3 connection; COMMIT fails like a full disk."""

    def __init__(self, real: sqlite3.Connection) -> None:
        self.real = real

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "COMMIT":
            raise sqlite3.OperationalError("database or disk is full")
        return self.real.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_delivery_counts_the_disk_did_not_take_are_kept_and_written_later(
    tmp_path: Path,
) -> None:
    with open_store(tmp_path) as store:
        a, b, c = store.append([msg(1), msg(2), msg(3)])
        seg = store._segments[-1]  # white-box: swap the connection for a failing one
        real = seg.conn
        seg.conn = _FailingCommit(real)  # type: ignore[assignment]
        with pytest.raises(StoreError, match="record_delivery"):
            store.record_delivery([a, a])
        with pytest.raises(StoreError, match="record_delivery"):
            store.record_delivery([b], counted=False)  # flagged only: a row counting 0
        # Kept in memory: what is read back now already has them.
        assert store.unwritten_deliveries == 2
        assert {m.seq: (m.deliveries, m.message.redelivered) for m in store.live()} == {
            a: (2, True),
            b: (0, True),
            c: (0, False),
        }
        with pytest.raises(StoreError):
            store.mark_clean_stop()  # never marked clean while counts are missing
        seg.conn = real
        store.write_delivery_counts()
        assert store.unwritten_deliveries == 0
        store.mark_clean_stop()
    with open_store(tmp_path) as store:
        assert store.stopped_cleanly
        assert {m.seq: (m.deliveries, m.message.redelivered) for m in store.live()} == {
            a: (2, True),
            b: (0, True),
            c: (0, False),
        }
        # Settled meanwhile: nothing left to write.
        seg = store._segments[-1]
        real = seg.conn
        seg.conn = _FailingCommit(real)  # type: ignore[assignment]
        with pytest.raises(StoreError):
            store.record_delivery([c])
        seg.conn = real
        store.settle([c], "acked", 0)
        assert store.unwritten_deliveries == 0


def test_commit_failure_leaves_nothing_half_written(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        store.append([msg(1)])
        seg = store._segments[-1]  # white-box: swap the connection for a failing one
        real = seg.conn
        seg.conn = _FailingCommit(real)  # type: ignore[assignment]
        with pytest.raises(StoreError) as info:
            store.append([msg(2), msg(3), msg(4)])
        assert info.value.path == tmp_path / "seg-00000001.db"
        assert "disk is full" in str(info.value) and info.value.operation == "append"
        assert not real.in_transaction
        with pytest.raises(StoreError, match="settle"):
            store.settle([1], "acked", 0)
        seg.conn = real
        assert [m.seq for m in store.live()] == [1]
        assert store.append([msg(5)]) == [2]  # the failed batch used no seqs
    with open_store(tmp_path) as store:
        assert [m.message.message_id for m in store.live()] == ["m1", "m5"]


def test_real_disk_full_mid_batch(tmp_path: Path) -> None:
    # SQLite's own SQLITE_FULL, from a page limit on the connection (we are root here, so a
    # read-only directory would not stop us).
    with open_store(tmp_path) as store:
        store.append([msg(1)])
        conn = store._segments[-1].conn
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages + 2}")
        with pytest.raises(StoreError, match="full"):
            store.append([msg(i, body=b"x" * 2000) for i in range(2, 12)])
        assert [m.seq for m in store.live()] == [1]
    with open_store(tmp_path) as store:
        assert [m.seq for m in store.live()] == [1]
        assert store.append([msg(2)]) == [2]


def test_live_seqs_from_memory(tmp_path: Path) -> None:
    with open_store(tmp_path, TINY) as store:
        assert store.live_seqs() == []
        for i in range(6):  # across segments
            store.append([msg(i, priority=9 - i, body=b"x" * 1500)])
        assert len(store.segments()) > 2
        store.settle([2, 5], "acked", 0)
        assert store.live_seqs() == [1, 3, 4, 6]  # ascending, not delivery order
    with open_store(tmp_path, TINY) as store:
        assert store.live_seqs() == [1, 3, 4, 6]


class _RecordingConnection:
    """Stands in for a segment's connection and records the SQL it runs."""

    def __init__(self, real: sqlite3.Connection, log: list[str]) -> None:
        self.real = real
        self.log = log

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        self.log.append(sql)
        return self.real.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_live_full_pages_all_but_the_first_n(tmp_path: Path) -> None:
    prios = [4, 9, 0, 4, 9, 7, 0, 4]
    with open_store(tmp_path, TINY) as store:
        for i, p in enumerate(prios):
            store.append([msg(i, priority=p, body=b"x" * 1500, expires_ms=50_000 + i)])
        store.record_delivery([4])
        store.settle([1], "acked", 0)
    with open_store(tmp_path, TINY) as store:
        whole = store.live()
        sql: list[str] = []
        for seg in store._segments:  # white-box: see which columns are read
            seg.conn = _RecordingConnection(seg.conn, sql)  # type: ignore[assignment]
        got = store.live(full=3)
        assert [m.seq for m in got] == [m.seq for m in whole]  # same delivery order
        assert got[:3] == whole[:3]  # whole, including headers and body
        for paged, full in zip(got[3:], whole[3:], strict=True):
            pm, fm = paged.message, full.message
            assert pm.paged and not fm.paged
            # The body stays on disk; the headers come with the index entry (selectors).
            assert pm.body == b"" and pm.headers == fm.headers
            # Everything else is the index entry: same as the whole message.
            assert msgspec.structs.replace(pm, body=fm.body, paged=False) == fm
            assert paged.deliveries == full.deliveries
        assert {m.seq: m.deliveries for m in got} == {m.seq: m.deliveries for m in whole}
        scans = [s for s in sql if "FROM messages" in s and "WHERE" not in s]
        assert scans and all("body" not in s for s in scans)
        assert sum(1 for s in sql if "WHERE seq = ?" in s) == 3  # the first 3, read back
        # A paged one reads back whole.
        assert store.read(got[5].seq) == whole[5]
        assert all(m.message.paged for m in store.live(full=0))
        assert store.live(full=100) == whole
        with pytest.raises(ValueError, match="full"):
            store.live(full=-1)


def test_encoding_round_trips_through_every_read_path(tmp_path: Path) -> None:
    packed, encoding = compress(b'{"order": 1, "status": "shipped"}\n' * 100, "zstd")
    compressed = msgspec.structs.replace(msg(1, body=packed), encoding=encoding)
    with open_store(tmp_path) as store:
        store.append([compressed, msg(2), compressed])
        assert store.statistics().live_bytes == 2 * message_size(compressed) + message_size(msg(2))
    with open_store(tmp_path) as store:
        whole = store.live()
        assert [(m.message.encoding, m.message.body) for m in whole] == [
            ("zstd", packed),
            ("", b"body 2"),
            ("zstd", packed),
        ]
        assert whole[0].message.size == message_size(compressed)  # stored bytes
        assert store.read(3).message.encoding == "zstd"
        assert store.read(2).message.encoding == ""
        # Paged index entries keep it too (what the queue engine's own paging keeps).
        assert [m.message.encoding for m in store.live(full=1)] == ["zstd", "", "zstd"]
        assert store.live(full=3) == whole


def test_on_settled_names_the_destination_and_size_of_each_message_it_settles(
    tmp_path: Path,
) -> None:
    told: list[tuple[str, int]] = []
    first = msgspec.structs.replace(msg(1), destination="/topic/a")
    second = msgspec.structs.replace(msg(2), destination="/topic/b")
    with open_store(tmp_path) as store:
        store.on_settled = told.extend
        seqs = store.append([first, second])
        store.settle([seqs[1], 999], "acked", 5)
        store.settle([seqs[1]], "acked", 6)  # already settled: not told again
        assert told == [("/topic/b", message_size(second))]


def test_a_clean_stop_mark_is_seen_once_by_the_next_open(tmp_path: Path) -> None:
    with open_store(tmp_path / "s") as store:
        assert not store.stopped_cleanly
        store.mark_clean_stop()
    with open_store(tmp_path / "s") as store:
        assert store.stopped_cleanly
        # Taken at open: a crash of this run is never mistaken for a clean stop.
        assert not (tmp_path / "s" / "clean-stop").exists()
    with open_store(tmp_path / "s") as store:
        assert not store.stopped_cleanly
