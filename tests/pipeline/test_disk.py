"""DiskWatch: a store's free space read before every append it makes and once a second;
an append that could take the filesystem below `store.disk_free_limit_bytes` is refused
before anything is written, and its senders hear the limit's name; producers stop with the
margin of every store of the data dir left; the store hears whether space is short."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpbroker.config import Config, config_from_mapping, replace_settings
from mpbroker.flow import append_margin, append_need, commit_pages
from mpbroker.pipeline import P2PPipeline, PubSubPipeline
from mpbroker.pipeline._disk import STORE_FILES, DiskWatch, data_dir_margin
from mpbroker.records import ACK_CLIENT, FlowState, Receipt, Record, Refuse, Send, Subscribe
from mpbroker.routing import Topology
from mpbroker.stores import (
    NEW_SEGMENT_PAGES,
    DiskLimitReached,
    MessageStore,
    RowWrites,
    TopicStore,
)
from mpbroker.stores._segment import create_segment
from tests.factories import make_message
from tests.filesystems import small_tmpfs

MiB = 1024 * 1024
TOTAL = 1024 * MiB
LIMIT = 64 * MiB


class Disk:
    """A filesystem's free space as the test says, and how often it was read."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.reads = 0

    def __call__(self, directory: Path) -> tuple[int, int]:
        self.reads += 1
        return self.free, TOTAL


def limited(**store: object) -> Config:
    return config_from_mapping(
        {"store": {"commit_max_delay_ms": 0, "disk_free_limit_bytes": "64MiB", **store}}
    )


def test_the_free_space_is_read_before_every_append_and_else_once_a_second(
    tmp_path: Path,
) -> None:
    config = limited()
    disk = Disk(500 * MiB)
    with MessageStore.open(tmp_path / "s", config.store) as store:
        watch = DiskWatch(store, config, disk)
        assert watch.check(0.0) is None
        assert watch.check(0.5) is None and disk.reads == 1  # plenty: once a second
        store.append([make_message("m1", persistent=True)])
        store.append([make_message("m2", persistent=True)])
        assert disk.reads == 3
        # An append finds the stop; the next check tells it, without reading again.
        disk.free = LIMIT + watch.free.margin - 1
        store.append([make_message("m3", persistent=True)])
        assert watch.stopped and store.low_on_disk
        assert watch.check(0.6) == f"disk_free_limit {LIMIT}" and disk.reads == 4
        assert watch.check(0.7) is None
        # Only a tenth of the limit more lets producers go.
        disk.free = LIMIT + watch.free.margin + LIMIT // 10
        assert watch.check(1.0) == "" and disk.reads == 5
        assert (watch.stopped, store.low_on_disk) == (False, False)


def test_producers_stop_with_the_margins_of_every_store_of_the_data_dir_left(
    tmp_path: Path,
) -> None:
    config = replace_settings(limited(), "broker", p2p_workers=2, pubsub_workers=3)
    queue = append_margin(config, STORE_FILES, topic=False)
    topic = append_margin(config, STORE_FILES, topic=True)
    assert data_dir_margin(config) == (2 * queue + 3 * topic, queue, topic)
    with MessageStore.open(tmp_path / "s", config.store) as store:
        watch = DiskWatch(store, config, Disk(LIMIT + 2 * queue + 3 * topic))
        assert watch.check(0.0) is None and not watch.stopped
        assert watch.free.reserved == queue + 3 * topic
        # The disk reserve is made only where it leaves the stop point free.
        assert store.reserve.keep_free == LIMIT + 2 * queue + 3 * topic
        topics = DiskWatch(store, config, Disk(LIMIT), topic=True)
        assert topics.free.reserved == 2 * queue + 2 * topic


def need_of(writes: list[RowWrites]) -> int:
    pages = (commit_pages(rows, places, STORE_FILES.page_bytes) for rows, places in writes)
    return append_need(pages, STORE_FILES)


def test_an_append_that_could_pass_the_limit_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    config = limited()
    disk = Disk(TOTAL)
    with MessageStore.open(tmp_path / "s", config.store) as store:
        watch = DiskWatch(store, config, disk)
        asked: list[list[RowWrites]] = []
        guard = store.disk_guard
        assert guard is not None

        def recording(writes: list[RowWrites]) -> None:
            asked.append(writes)
            guard(writes)

        store.disk_guard = recording
        batch = [make_message(f"m{n}", persistent=True, body=bytes(3000)) for n in range(3)]
        store.append(batch)
        [[(rows, places)]] = asked
        assert places == 2 and len(rows) == 3 and all(3000 < size < 3200 for size in rows)
        need = need_of(asked[0])
        # Exactly enough room after it, with what the other (topic) store may write.
        disk.free = LIMIT + watch.free.reserved + need
        store.append(batch)
        disk.free -= 1
        with pytest.raises(DiskLimitReached) as refused:
            store.append(batch)
        assert refused.value.limit == LIMIT
        assert f"below disk_free_limit {LIMIT}" in str(refused.value)
        assert len(store.live_seqs()) == 6


def turn(pipeline: P2PPipeline | PubSubPipeline, *records: Record) -> dict[int, list[Record]]:
    for record in records:
        pipeline.receive(0, record)
    pipeline.step(memwatch_level=0)
    return pipeline.take_output()


def test_a_queue_batch_refused_for_the_limit_is_refused_by_its_name(tmp_path: Path) -> None:
    config = limited()
    store = MessageStore.open(tmp_path / "p2p-0", config.store)
    pipeline = P2PPipeline(0, 0, 1, config, Topology(1, 1), store, None)
    try:
        assert pipeline.disk is not None
        disk = Disk(TOTAL)
        pipeline.disk.read = disk
        send = Send(1, make_message("m1", persistent=True), "r1")
        assert turn(pipeline, send)[0] == [Receipt(1, "r1")]
        disk.free = LIMIT + pipeline.disk.free.reserved
        out = turn(pipeline, Send(1, make_message("m2", persistent=True), "r2"))[0]
        assert out == [
            Refuse(
                1,
                f"ResourceAllocation: /queue/q disk_free_limit {LIMIT} reached",
                "The message was not stored: it could have taken its store's filesystem "
                "below store.disk_free_limit_bytes.",
                "r2",
            ),
            FlowState(0, "disk", "", f"disk_free_limit {LIMIT}"),
        ]
        assert store.live_seqs() == [1]
    finally:
        pipeline.close()


def test_a_topic_batch_refused_for_the_limit_is_refused_by_its_name(tmp_path: Path) -> None:
    config = limited()
    store = TopicStore(tmp_path / "pubsub-1", tmp_path / "registry.db", config.store)
    pipeline = PubSubPipeline(1, 0, 1, config, store, None)
    try:
        assert pipeline.disk is not None
        disk = Disk(TOTAL)
        pipeline.disk.read = disk
        durable = Subscribe(2, 1, "d", "/topic/t", ACK_CLIENT, 100, durable="app/d")
        turn(pipeline, durable)
        disk.free = LIMIT + pipeline.disk.free.reserved
        send = Send(1, make_message("m1", "/topic/t", persistent=True), "r1")
        refusals = [r for r in turn(pipeline, send)[0] if isinstance(r, Refuse)]
        assert [(r.message, r.receipt) for r in refusals] == [
            (f"ResourceAllocation: /topic/t disk_free_limit {LIMIT} reached", "r1")
        ]
        assert store.backlog("app/d") == 0
    finally:
        pipeline.close()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "fs", "256m") as mount:
        yield mount


class Lowest:
    """The lowest free space of a filesystem since `reset`, read as often as a thread can
    (SQLite lets go of the GIL while it writes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lowest = self.read()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def read(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def reset(self) -> int:
        free = self.read()
        self.lowest = free
        return free

    def _run(self) -> None:
        while not self._stop.is_set():
            self.lowest = min(self.lowest, self.read())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.slow
def test_no_append_takes_more_than_the_arithmetic_says_on_a_real_filesystem(
    tmpfs: Path,
) -> None:
    # Segments a little larger than a WAL checkpoint (4 MB), so that appends set off
    # checkpoints and roll segments; batches of small, half-page, page-sized and 1 MiB
    # rows; topic appends owed to a few subscriptions. The free space is read throughout
    # each append: its lowest point counts, not what is left after it.
    config = limited(segment_max_bytes="6MiB", disk_reserve_bytes=0)
    lowest = Lowest(tmpfs)
    # Per append: what the arithmetic says it may take, and what it took.
    worst: list[tuple[int, int]] = []

    def guard(writes: list[RowWrites]) -> None:
        worst.append((need_of(writes), lowest.reset()))

    def appended() -> None:
        need, before = worst[-1]
        worst[-1] = (need, before - lowest.lowest)
        assert before - lowest.lowest <= need, (need, before - lowest.lowest)

    batches = [
        [bytes(100)] * 256,
        [bytes(2100)] * 62,
        [bytes(4000)] * 32,
        [os.urandom(MiB)],
        [bytes(500)] * 200 + [os.urandom(MiB)],
    ]
    try:
        with MessageStore.open(tmpfs / "p2p-0", config.store) as store:
            store.disk_guard = guard
            for n in range(120):
                bodies = batches[n % len(batches)]
                store.append([make_message(f"m{n}", persistent=True, body=b) for b in bodies])
                appended()
        names = [f"client-{n}/subscription-{n}" for n in range(5)]
        store_dir, registry = tmpfs / "pubsub-1", tmpfs / "pubsub-1-durable.db"
        with TopicStore(store_dir, registry, config.store) as topics:
            for name in names:
                topics.subscribe(name, "/topic/t")
            topics.messages.disk_guard = guard
            for n in range(120):
                bodies = batches[n % len(batches)]
                entries = [
                    (make_message(f"t{n}", "/topic/t", persistent=True, body=b), names)
                    for b in bodies
                ]
                topics.append(entries)
                appended()
    finally:
        lowest.close()
    # The bound is not loose beyond reason either: the checkpoints came.
    assert max(taken for _, taken in worst) > 3 * MiB


def test_a_new_segment_is_within_its_page_count(tmp_path: Path) -> None:
    segment = create_segment(tmp_path, 1, 1, "full", 0, 256 * 1024)
    try:
        pages = segment.conn.execute("PRAGMA page_count").fetchone()[0]
        assert pages <= NEW_SEGMENT_PAGES
        assert segment.conn.execute("PRAGMA page_size").fetchone()[0] == STORE_FILES.page_bytes
        checkpoint = segment.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        assert checkpoint == STORE_FILES.checkpoint_pages
    finally:
        segment.close()
