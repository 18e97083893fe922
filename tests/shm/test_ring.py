"""Ring unit tests in one process: records, wrap-around, limits, accounting, errors."""

from __future__ import annotations

import array
import errno
import os
import stat
from collections import deque
from collections.abc import Iterator

import posix_ipc
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpbroker.shm import (
    MAX_CAPACITY,
    MIN_CAPACITY,
    RECORD_HEADER_BYTES,
    Ring,
    RingBrokenError,
    RingClosedError,
    RingStatistics,
    SegmentExistsError,
    SegmentNotFoundError,
    ShmSpaceError,
    _segment,
    record_bytes,
    segment_name,
    shm_path,
)
from mpbroker.shm._segment import shm_free_bytes


@pytest.fixture
def ring_name(instance: str) -> str:
    return segment_name(instance, "ring")


@pytest.fixture
def ring(ring_name: str) -> Iterator[Ring]:
    r = Ring.create(ring_name, MIN_CAPACITY)
    yield r
    r.close()
    r.unlink()


def payload_for(seq: int, size: int) -> bytes:
    """Deterministic bytes that differ per record and per offset."""
    return bytes((seq * 31 + i * 7 + (i >> 8)) & 0xFF for i in range(size))


def test_round_trip(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    assert r.read_batch() == []
    assert not r.has_data()
    assert w.stage(7, b"hello")
    assert w.staged_bytes == record_bytes(5) == 16
    # Staged is not published: the reader sees nothing yet.
    assert not r.has_data()
    assert r.read_batch() == []
    w.publish()
    assert w.staged_bytes == 0
    assert r.has_data()
    assert r.read_batch() == [(7, b"hello")]
    assert not r.has_data()
    assert r.read_batch() == []


def test_many_records_per_publish_and_limits(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    sent = [(k % 5 + 1, payload_for(k, k % 23)) for k in range(100)]
    for kind, payload in sent:
        assert w.stage(kind, payload)
    head_before = ring.statistics().head
    w.publish()
    # One publish moved head by every staged byte at once.
    assert ring.statistics().head - head_before == sum(record_bytes(len(p)) for _, p in sent)
    got = r.read_batch(max_records=10)
    assert got == sent[:10]
    # max_bytes bounds payload bytes ...
    got2 = r.read_batch(max_bytes=30)
    assert sum(len(p) for _, p in got2) <= 30
    assert got2 == sent[10 : 10 + len(got2)]
    rest = r.read_batch()
    assert got + got2 + rest == sent


def test_max_bytes_returns_at_least_one_record(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    assert w.try_put(1, b"x" * 1000)
    assert w.try_put(2, b"y")
    assert r.read_batch(max_bytes=10) == [(1, b"x" * 1000)]
    assert r.read_batch(max_bytes=10) == [(2, b"y")]


@pytest.mark.parametrize("size", [*range(0, 41), 100, 1000, MIN_CAPACITY // 2])
def test_every_size_around_the_wrap_point(ring: Ring, size: int) -> None:
    """Place a record of ``size`` bytes at every 8-byte position near the end of the area."""
    w = ring.writer()
    r = ring.reader()
    cap = ring.capacity
    for seq, end_gap in enumerate(range(0, 72, 8)):
        # Move head so that exactly end_gap bytes remain before the end of the data area.
        head = ring.statistics().head
        gap = (cap - end_gap - head % cap) % cap
        while gap:
            filler = min(gap, MIN_CAPACITY // 4) - RECORD_HEADER_BYTES
            assert w.try_put(99, bytes(filler))
            assert r.read_batch() == [(99, bytes(filler))]
            gap -= filler + RECORD_HEADER_BYTES
        assert ring.statistics().head % cap == (cap - end_gap) % cap
        payload = payload_for(seq, size)
        assert w.try_put(3, payload)
        assert w.try_put(4, b"after")
        assert r.read_batch() == [(3, payload), (4, b"after")]
    assert ring.statistics().used_bytes == 0


def test_largest_record_is_a_quarter_of_the_ring_even_across_the_end(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    quarter = ring.capacity // 4
    assert ring.max_record_payload_bytes == quarter - RECORD_HEADER_BYTES
    big = payload_for(1, ring.max_record_payload_bytes)
    for _ in range(4):
        assert w.stage(1, big)
    assert w.free_bytes == 0
    assert not w.try_put(2, b"")
    assert r.read_batch() == [(1, big)] * 4
    # Same again starting mid-area, so one of them wraps.
    assert w.try_put(2, b"abc")
    assert r.read_batch() == [(2, b"abc")]
    for _ in range(3):
        assert w.try_put(3, big)
    assert r.read_batch() == [(3, big)] * 3
    assert ring.statistics().fragments_written == 0


@pytest.mark.parametrize("kind", [0, -1, 2**32])
def test_invalid_kind(ring: Ring, kind: int) -> None:
    w = ring.writer()
    with pytest.raises(ValueError, match="kind"):
        w.stage(kind, b"x")
    assert w.staged_bytes == 0


def test_kind_limits_round_trip(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    assert w.try_put(1, b"a")
    assert w.try_put(2**32 - 1, b"b")
    assert r.read_batch() == [(1, b"a"), (2**32 - 1, b"b")]


def test_full_ring_and_free_space_accounting(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    cap = ring.capacity
    assert w.free_bytes == cap
    staged = 0
    n = 0
    while w.stage(1, payload_for(n, 100)):
        n += 1
        staged += record_bytes(100)
        assert w.free_bytes == cap - staged
        assert w.staged_bytes == staged
    assert n == cap // record_bytes(100)
    # A failed stage wrote nothing.
    assert w.staged_bytes == staged
    # A smaller record that still fits is accepted.
    rest = cap - staged
    assert w.stage(2, bytes(rest - RECORD_HEADER_BYTES))
    assert w.free_bytes == 0
    assert not w.stage(3, b"")
    w.publish()
    assert w.free_bytes == 0
    assert len(r.read_batch(max_records=3)) == 3
    assert w.free_bytes == 3 * record_bytes(100)
    assert w.stage(3, b"")
    w.publish()
    got = r.read_batch(max_records=10_000)
    assert len(got) == n - 3 + 2
    assert got[-1] == (3, b"")
    assert w.free_bytes == cap


def test_try_put_publishes_earlier_staged_records_even_when_it_fails(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    for kind in range(1, 5):
        assert w.stage(kind, bytes(1000))
    assert not w.try_put(5, bytes(100))
    assert w.staged_bytes == 0
    assert r.read_batch() == [(kind, bytes(1000)) for kind in range(1, 5)]
    assert r.read_batch() == []  # nothing of the record that did not fit


def test_put_blocking_times_out_without_reader_and_publishes_first(ring: Ring) -> None:
    w = ring.writer()
    for _ in range(4):
        assert w.stage(1, bytes(1000))
    assert not w.put_blocking(2, bytes(100), timeout=0.05)
    stats = ring.statistics()
    assert stats.head == 4 * record_bytes(1000)  # the staged records were published
    assert w.staged_bytes == 0
    assert w.put_blocking(3, bytes(10), timeout=0)


def test_statistics(ring: Ring) -> None:
    w = ring.writer()
    s0 = ring.statistics()
    assert s0 == RingStatistics(
        capacity=MIN_CAPACITY,
        used_bytes=0,
        peak_used_bytes=0,
        head=0,
        tail=0,
        incarnation=0,
        records_written=0,
        records_read=0,
        fragments_written=0,
        fragments_read=0,
        payloads_dropped=0,
    )
    r = ring.reader()
    for i in range(10):
        assert w.stage(1, bytes(i))
    assert ring.statistics().records_written == 0  # staged only
    w.publish()
    used = sum(record_bytes(i) for i in range(10))
    s1 = ring.statistics()
    assert (s1.head, s1.tail, s1.used_bytes, s1.incarnation) == (used, 0, used, 1)
    assert s1.records_written == 10
    assert s1.peak_used_bytes == used
    assert len(r.read_batch(max_records=4)) == 4
    r.read_batch()
    s2 = ring.statistics()
    assert (s2.head, s2.tail, s2.used_bytes) == (used, used, 0)
    assert s2.records_read == 10
    assert s2.peak_used_bytes == used
    with pytest.raises(AttributeError):
        s2.head = 0  # type: ignore[misc]


def test_memoryview_and_bytearray_payloads(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    ints = array.array("I", [1, 2, 3])
    assert w.try_put(1, memoryview(ints))  # len() would say 3, it is 12 bytes
    assert w.try_put(2, bytearray(b"abc"))
    assert w.try_put(3, memoryview(b"0123456789")[2:5])
    assert r.read_batch() == [(1, ints.tobytes()), (2, b"abc"), (3, b"234")]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("stage"), st.integers(0, 700)),
            st.tuples(st.just("publish"), st.just(0)),
            st.tuples(st.just("read"), st.integers(1, 20)),
        ),
        max_size=200,
    )
)
def test_matches_a_model(ring: Ring, ops: list[tuple[str, int]]) -> None:
    """Any interleaving of stage/publish/read behaves like a bounded FIFO of records."""
    w = ring.writer()
    r = ring.reader()
    published: deque[tuple[int, bytes]] = deque()
    staged: list[tuple[int, bytes]] = []
    used = ring.statistics().used_bytes
    staged_bytes = 0
    seq = 0
    for op, arg in ops:
        if op == "stage":
            payload = payload_for(seq, arg)
            fits = used + staged_bytes + record_bytes(arg) <= ring.capacity
            assert w.stage(seq % 1000 + 1, payload) is fits
            if fits:
                staged.append((seq % 1000 + 1, payload))
                staged_bytes += record_bytes(arg)
            seq += 1
        elif op == "publish":
            w.publish()
            published.extend(staged)
            staged.clear()
            used += staged_bytes
            staged_bytes = 0
        else:
            got = r.read_batch(max_records=arg)
            expected = [published.popleft() for _ in range(min(arg, len(published)))]
            assert got == expected
            used -= sum(record_bytes(len(p)) for _, p in got)
        assert w.free_bytes == ring.capacity - used - staged_bytes
    w.publish()
    published.extend(staged)
    assert r.read_batch(max_records=10_000) == list(published)


def test_attach_sees_the_same_ring(ring: Ring, ring_name: str) -> None:
    other = Ring.attach(ring_name)
    try:
        assert other.capacity == ring.capacity
        w = ring.writer()
        assert w.try_put(5, b"shared")
        assert other.reader().read_batch() == [(5, b"shared")]
        assert ring.statistics().tail == record_bytes(6)
    finally:
        other.close()


def test_segment_is_private_and_fully_sized(ring: Ring, ring_name: str) -> None:
    st_ = os.stat(shm_path(ring_name))
    assert stat.S_IMODE(st_.st_mode) == 0o600
    assert st_.st_size == 4096 + ring.capacity
    # posix_fallocate reserved the pages: they count as allocated blocks.
    assert st_.st_blocks * 512 >= st_.st_size


@pytest.mark.parametrize("capacity", [0, 4095, 4097, 6000, 2048, -4096, MAX_CAPACITY * 2])
def test_capacity_must_be_a_power_of_two(ring_name: str, capacity: int) -> None:
    with pytest.raises(ValueError, match=str(capacity)):
        Ring.create(ring_name, capacity)
    assert not shm_path(ring_name).exists()


def test_create_existing_and_attach_missing(ring: Ring, ring_name: str, instance: str) -> None:
    with pytest.raises(SegmentExistsError) as exc_info:
        Ring.create(ring_name, MIN_CAPACITY)
    assert isinstance(exc_info.value, FileExistsError)
    assert ring_name in str(exc_info.value)
    missing = segment_name(instance, "nope")
    with pytest.raises(SegmentNotFoundError, match=missing):
        Ring.attach(missing)


def test_attach_foreign_segment_is_broken(instance: str) -> None:
    name = segment_name(instance, "foreign")
    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=4096 + MIN_CAPACITY)
    try:
        os.pwrite(shm.fd, b"not a ring header", 0)
        with pytest.raises(RingBrokenError, match="magic"):
            Ring.attach(name)
        os.ftruncate(shm.fd, 100)
        with pytest.raises(RingBrokenError, match="smaller than a ring header"):
            Ring.attach(name)
    finally:
        shm.close_fd()
        shm.unlink()


def test_attach_wrong_size_or_version(ring: Ring, ring_name: str) -> None:
    from mpbroker.shm import _ring

    ring._hq[_ring._W_VERSION] = 99
    with pytest.raises(RingBrokenError, match="version 99"):
        Ring.attach(ring_name)
    # Version 1 knew no fragments: its processes would take one for a corrupt record.
    ring._hq[_ring._W_VERSION] = 1
    with pytest.raises(RingBrokenError, match="layout version 1, this code reads version 2"):
        Ring.attach(ring_name)
    ring._hq[_ring._W_VERSION] = _ring._LAYOUT_VERSION
    ring._hq[_ring._W_CAPACITY] = MIN_CAPACITY * 2
    with pytest.raises(RingBrokenError, match="capacity"):
        Ring.attach(ring_name)
    ring._hq[_ring._W_CAPACITY] = MIN_CAPACITY


def test_corrupt_counters_and_records_are_broken(ring: Ring) -> None:
    from mpbroker.shm import _ring

    w = ring.writer()
    r = ring.reader()
    assert w.try_put(1, b"abc")
    ring._dmm[4:8] = b"\x00\x00\x00\x00"  # kind 0 is reserved: corruption
    with pytest.raises(RingBrokenError, match="kind 0"):
        r.read_batch()
    ring._hq[_ring._W_HEAD] = 10 * ring.capacity
    with pytest.raises(RingBrokenError, match="inconsistent"):
        r.read_batch()
    with pytest.raises(RingBrokenError, match="inconsistent"):
        ring.reader()


def test_closed_handle(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    assert w.try_put(1, b"x")
    ring.close()
    ring.close()  # idempotent
    assert ring.closed
    for call in (
        lambda: w.stage(1, b"y"),
        lambda: w.publish() if w.stage(1, b"y") else None,
        lambda: w.free_bytes,
        r.read_batch,
        r.has_data,
        lambda: r.set_waiting(True),
        ring.statistics,
        ring.writer,
        ring.reader,
    ):
        with pytest.raises(RingClosedError):
            call()
    # On a closed handle, being closed wins over a caller mistake.
    with pytest.raises(RingClosedError):
        w.stage(0, b"")


def test_publish_after_close_with_staged_records(ring_name: str) -> None:
    ring = Ring.create(ring_name, MIN_CAPACITY)
    try:
        w = ring.writer()
        assert w.stage(1, b"x")
        ring.close()
        with pytest.raises(RingClosedError):
            w.publish()
    finally:
        ring.unlink()
        ring.unlink()  # idempotent
    assert not shm_path(ring_name).exists()


def test_not_enough_space_in_dev_shm_creates_nothing(
    ring_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    free = shm_free_bytes()
    if free >= MAX_CAPACITY:
        # No ring is larger than MAX_CAPACITY: pretend /dev/shm has less free than that.
        free = MAX_CAPACITY // 4
        monkeypatch.setattr(_segment, "shm_free_bytes", lambda: free)
    capacity = 1 << max(12, (free + 1).bit_length())  # a power of two above the free space
    with pytest.raises(ShmSpaceError) as exc_info:
        Ring.create(ring_name, capacity)
    err = exc_info.value
    assert err.name == ring_name
    assert err.need == 4096 + capacity
    assert 0 <= err.free < err.need
    assert f"cannot create ring {ring_name}: needs {err.need} bytes" in str(err)
    assert "/dev/shm has" in str(err)
    assert not shm_path(ring_name).exists()


def test_fallocate_enospc_leaves_nothing_behind(
    ring_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int, int]] = []

    def no_space(fd: int, offset: int, length: int) -> None:
        calls.append((fd, offset, length))
        assert shm_path(ring_name).exists()  # it fails after the segment was created
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(ShmSpaceError, match=f"cannot create ring {ring_name}") as exc_info:
        Ring.create(ring_name, 1 << 16)
    assert calls == [(calls[0][0], 0, 4096 + (1 << 16))]
    assert isinstance(exc_info.value.__cause__, OSError)
    assert not shm_path(ring_name).exists()


def test_other_fallocate_errors_also_leave_nothing_behind(
    ring_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "posix_fallocate", broken)
    with pytest.raises(OSError) as exc_info:
        Ring.create(ring_name, 1 << 16)
    assert exc_info.value.errno == errno.EIO
    assert not shm_path(ring_name).exists()


async def test_async_put_waits_for_room(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    big = bytes(ring.max_record_payload_bytes)
    for _ in range(4):
        assert w.try_put(1, big)
    got: list[tuple[int, bytes]] = []

    async def drain_later() -> None:
        await trio.sleep(0.05)
        got.extend(r.read_batch())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain_later)
        await w.put(2, big)  # blocks until drain_later made room
        assert got == [(1, big)] * 4
    assert r.read_batch() == [(2, big)]


async def test_async_put_cancelled_writes_nothing(ring: Ring) -> None:
    w = ring.writer()
    r = ring.reader()
    big = bytes(ring.max_record_payload_bytes)
    for _ in range(4):
        assert w.stage(1, big)
    with trio.move_on_after(0.05) as scope:
        await w.put(2, b"x")
    assert scope.cancelled_caught
    # The earlier staged records were published before waiting; the cancelled one is not there.
    assert r.read_batch() == [(1, big)] * 4
    assert r.read_batch() == []
    assert w.staged_bytes == 0


async def test_async_put_is_a_checkpoint(ring: Ring) -> None:
    w = ring.writer()
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            await w.put(1, b"x")
    assert w.staged_bytes == 0
    assert ring.statistics().head == 0
