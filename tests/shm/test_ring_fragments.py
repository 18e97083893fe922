"""Payloads larger than a record (a quarter of the ring) travel as fragments, invisibly."""

from __future__ import annotations

import array
import random
import struct
import threading
import time
from collections.abc import Iterator

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpbroker.shm import (
    MIN_CAPACITY,
    RECORD_HEADER_BYTES,
    Ring,
    RingBrokenError,
    RingClosedError,
    RingReader,
    RingWriter,
    record_bytes,
    segment_name,
)

CAP = MIN_CAPACITY
MAX_RECORD = CAP // 4 - RECORD_HEADER_BYTES


@pytest.fixture
def ring_name(instance: str) -> str:
    return segment_name(instance, "ring")


@pytest.fixture
def ring(ring_name: str) -> Iterator[Ring]:
    r = Ring.create(ring_name, CAP)
    yield r
    r.close()
    r.unlink()


def payload_for(seq: int, size: int) -> bytes:
    return random.Random(seq).randbytes(size)


def fragments(size: int) -> int:
    """Fragment records a payload of ``size`` bytes takes (0: it goes as one record)."""
    return 0 if size <= MAX_RECORD else -(-size // MAX_RECORD)


def pump(
    w: RingWriter, r: RingReader, sent: list[tuple[int, bytes]], max_records: int = 1024
) -> list[tuple[int, bytes]]:
    """Write every record, reading whenever the ring is full (one thread, no waiting)."""
    got: list[tuple[int, bytes]] = []
    for kind, payload in sent:
        while not w.try_put(kind, payload):
            got += r.read_batch(max_records)
    while len(got) < len(sent):
        batch = r.read_batch(max_records)
        assert batch, "the reader ran dry before every record arrived"
        got += batch
    return got


@pytest.mark.parametrize(
    "size",
    [
        0,
        1,
        MAX_RECORD,
        MAX_RECORD + 1,
        CAP - RECORD_HEADER_BYTES,
        CAP,
        3 * CAP,
        3 * CAP + 5,
        40 * CAP + 1,
    ],
)
def test_any_size_round_trips(ring: Ring, size: int) -> None:
    w = ring.writer()
    r = ring.reader()
    sent = [(7, payload_for(size, size)), (8, b"after"), (9, payload_for(size + 1, size))]
    assert pump(w, r, sent) == sent
    stats = ring.statistics()
    assert stats.fragments_written == stats.fragments_read == 2 * fragments(size)
    assert stats.records_written == stats.records_read == 3
    assert stats.payloads_dropped == 0
    assert stats.used_bytes == 0
    assert stats.peak_used_bytes <= CAP


def test_many_mixed_sizes_at_every_alignment(ring: Ring) -> None:
    rng = random.Random(5)
    sizes = [rng.choice([0, 1, 7, 8, 100, MAX_RECORD, MAX_RECORD + 1]) for _ in range(200)]
    sizes += [rng.randrange(0, 5 * CAP) for _ in range(200)]
    rng.shuffle(sizes)
    sent = [(seq % 50 + 1, payload_for(seq, size)) for seq, size in enumerate(sizes)]
    for max_records in (1, 3, 1024):
        assert pump(ring.writer(), ring.reader(), sent, max_records) == sent


def test_fragment_headers_on_the_ring(ring: Ring) -> None:
    """The format: flag in the top two bits of the length word, the kind in every fragment."""
    w = ring.writer()
    payload = payload_for(1, 2 * MAX_RECORD + 3)
    assert w.try_put(0xABCDEF, payload)
    words = [struct.unpack_from("<II", ring._dmm, pos) for pos in (0, CAP // 4, CAP // 2)]
    assert words == [
        (1 << 30 | MAX_RECORD, 0xABCDEF),
        (2 << 30 | MAX_RECORD, 0xABCDEF),
        (3 << 30 | 3, 0xABCDEF),
    ]
    assert ring._dmm[8 : 8 + MAX_RECORD] == payload[:MAX_RECORD]
    assert ring.statistics().head == 2 * (CAP // 4) + record_bytes(3)


def test_stage_takes_the_fragments_that_fit_and_continues_with_the_same_payload(
    ring: Ring,
) -> None:
    w = ring.writer()
    r = ring.reader()
    assert w.stage(1, b"before")  # 16 bytes: three whole fragments fit after it
    big = payload_for(2, 10 * MAX_RECORD)
    assert not w.stage(2, big)
    assert w.staged_bytes == 16 + 3 * (CAP // 4)
    w.publish()
    assert r.read_batch() == [(1, b"before")]  # and three fragments consumed
    assert not r.has_data()
    assert ring.statistics().used_bytes == 0
    got: list[tuple[int, bytes]] = []
    calls = 0
    while not w.try_put(2, big):
        calls += 1
        got += r.read_batch()
    got += r.read_batch()
    assert got == [(2, big)]
    assert calls == 1  # 4 more fragments, then the last 3
    assert ring.statistics().records_written == 2


def test_another_record_abandons_a_payload_under_way(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    big = payload_for(1, 6 * MAX_RECORD)
    assert not w.try_put(1, big)
    assert r.read_batch() == []  # four fragments taken, nothing whole yet
    assert w.try_put(2, b"small")  # the writer gives the big one up
    assert r.read_batch() == [(2, b"small")]
    # The same payload again starts over (something else went in between), and the reader
    # drops the part it got.
    assert pump(w, r, [(1, big)]) == [(1, big)]
    assert ring.statistics().payloads_dropped == 1


def test_an_equal_but_other_payload_starts_over(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    big = payload_for(1, 6 * MAX_RECORD)
    assert not w.try_put(1, big)
    assert r.read_batch() == []
    copy = bytearray(big)
    assert pump(w, r, [(1, copy)]) == [(1, big)]
    assert ring.statistics().payloads_dropped == 1


def test_a_memoryview_of_another_format_is_continued(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    ints = array.array("I", range(3000))  # 12000 bytes; len() of its view says 3000
    view = memoryview(ints)
    assert pump(w, r, [(1, view), (2, memoryview(b"x" * 9000)[100:8100])]) == [
        (1, ints.tobytes()),
        (2, b"x" * 8000),
    ]
    assert ring.statistics().payloads_dropped == 0


def test_a_successor_reader_skips_the_rest_of_a_payload_begun_before_it(
    ring: Ring, ring_name: str
) -> None:
    w = ring.writer()
    first = ring.reader()
    big = payload_for(1, 8 * MAX_RECORD)
    assert w.try_put(1, b"a")
    assert not w.try_put(2, big)
    assert first.read_batch() == [(1, b"a")]  # and the first three fragments of big
    # The reader "dies"; a successor in another handle continues from the published tail.
    other = Ring.attach(ring_name)
    try:
        successor = other.reader()
        got: list[tuple[int, bytes]] = []
        while not w.try_put(2, big):
            got += successor.read_batch()
        sent = [(3, b"b"), (4, big), (5, b"c")]
        got += pump(w, successor, sent)
        assert got == sent
        stats = other.statistics()
        assert stats.payloads_dropped == 1
        assert stats.records_read == 3
    finally:
        other.close()


def test_a_reader_attached_at_a_middle_fragment_drops_it_even_without_its_last(
    ring: Ring,
) -> None:
    w = ring.writer()
    first = ring.reader()
    big = payload_for(1, 9 * MAX_RECORD)
    assert not w.try_put(1, big)
    assert first.read_batch(max_records=1) == []
    successor = ring.reader()
    assert not w.try_put(1, big)  # fragments 5 to 8: the successor sees middles only
    assert successor.read_batch() == []
    assert w.try_put(2, b"next")  # the writer gives it up, too
    assert successor.read_batch() == [(2, b"next")]
    assert pump(w, successor, [(3, big)]) == [(3, big)]


def test_closed_ring_mid_payload(ring_name: str) -> None:
    ring = Ring.create(ring_name, CAP)
    try:
        w = ring.writer()
        r = ring.reader()
        big = payload_for(1, 3 * CAP)
        assert not w.try_put(1, big)
        assert r.read_batch() == []  # the reader holds part of the payload
        assert not w.try_put(1, big)
        ring.close()
        with pytest.raises(RingClosedError):
            r.read_batch()
        with pytest.raises(RingClosedError):
            w.put_blocking(1, big, timeout=1)
        with pytest.raises(RingClosedError):
            w.stage(1, big)
    finally:
        ring.close()
        ring.unlink()


def test_put_blocking_times_out_between_fragments_and_can_go_on(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    big = payload_for(1, 6 * MAX_RECORD)
    t0 = time.monotonic()
    assert not w.put_blocking(1, big, timeout=0.05)
    assert time.monotonic() - t0 < 5
    assert ring.statistics().fragments_written == 4
    assert r.read_batch() == []
    assert w.put_blocking(1, big, timeout=0)  # the same payload goes on where it stopped
    assert r.read_batch() == [(1, big)]
    assert ring.statistics().payloads_dropped == 0


def test_corrupt_fragments_are_broken(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    big = payload_for(1, 3 * MAX_RECORD)
    assert w.try_put(5, big)
    ring._dmm[CAP // 4 + 4 : CAP // 4 + 8] = (6).to_bytes(4, "little")  # middle: other kind
    with pytest.raises(RingBrokenError, match="kind 6, its payload kind 5"):
        r.read_batch()


def test_a_fragment_longer_than_what_was_published_is_broken(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    assert not w.try_put(5, payload_for(1, 5 * MAX_RECORD))
    ring._dmm[0:4] = (1 << 30 | CAP).to_bytes(4, "little")
    with pytest.raises(RingBrokenError, match=f"length {CAP} kind 5 fragment flag 1"):
        r.read_batch()


def test_read_batch_limits_count_whole_payloads(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    big = payload_for(1, MAX_RECORD + 100)  # two fragments
    for kind in (1, 2, 3):
        assert w.try_put(kind, b"s" * 10)
    assert w.try_put(4, big)
    assert r.read_batch(max_records=2) == [(1, b"s" * 10), (2, b"s" * 10)]
    # max_bytes: a payload is not begun after records that already reach it.
    assert r.read_batch(max_bytes=20) == [(3, b"s" * 10)]
    assert r.read_batch(max_records=1) == [(4, big)]


async def test_async_put_of_a_payload_larger_than_the_ring(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    big = payload_for(1, 5 * CAP)
    got: list[tuple[int, bytes]] = []

    async def drain() -> None:
        while len(got) < 2:
            got.extend(r.read_batch())
            await trio.sleep(0.001)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        await w.put(1, big)
        await w.put(2, b"after")
    assert got == [(1, big), (2, b"after")]


async def test_async_put_cancelled_mid_payload_is_dropped_by_the_reader(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    big = payload_for(1, 5 * CAP)
    with trio.move_on_after(0.05) as scope:
        await w.put(1, big)
    assert scope.cancelled_caught
    assert r.read_batch() == []
    await w.put(2, b"next")
    assert r.read_batch() == [(2, b"next")]
    assert pump(w, r, [(3, b"z")]) == [(3, b"z")]
    assert ring.statistics().payloads_dropped == 0  # noticed at the next fragmented payload
    assert pump(w, r, [(4, big)]) == [(4, big)]
    assert ring.statistics().payloads_dropped == 1


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    sizes=st.lists(
        st.one_of(st.integers(0, 2 * MAX_RECORD), st.integers(0, 4 * CAP)),
        min_size=1,
        max_size=40,
    ),
    max_records=st.integers(1, 8),
    batch=st.integers(1, 6),
)
def test_writer_thread_and_reader_agree_on_bytes_and_order(
    ring: Ring, sizes: list[int], max_records: int, batch: int
) -> None:
    """A writer thread stages records in batches and waits for room with put_blocking; the
    reader takes what is there. Every payload arrives once, whole and in order."""
    w = ring.writer()
    r = ring.reader()
    base = ring.statistics()
    sent = [(seq % 1000 + 1, payload_for(seq, size)) for seq, size in enumerate(sizes)]
    failed: list[BaseException] = []

    def write() -> None:
        try:
            for i in range(0, len(sent), batch):
                for kind, payload in sent[i : i + batch]:
                    if not w.stage(kind, payload):
                        assert w.put_blocking(kind, payload, timeout=10)
                w.publish()
        except BaseException as e:  # reported by the main thread
            failed.append(e)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 30
    while len(got) < len(sent) and time.monotonic() < deadline and not failed:
        records = r.read_batch(max_records)
        if records:
            got += records
        else:
            time.sleep(0.0001)
    thread.join(10)
    assert not failed, failed
    assert not thread.is_alive()
    assert got == sent
    assert r.read_batch() == []
    stats = ring.statistics()
    assert stats.fragments_read - base.fragments_read == sum(fragments(s) for s in sizes)
    assert stats.payloads_dropped == 0
