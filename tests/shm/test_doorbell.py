"""Doorbells and parking: prompt wake-ups, no wake-up without a parked reader, restarts."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator

import pytest
import trio

from mpbroker.shm import (
    MIN_CAPACITY,
    Doorbell,
    Ring,
    RingReader,
    SegmentNotFoundError,
    ShmClosedError,
    ShmError,
    park,
    park_async,
    segment_name,
    shm_path,
)


@pytest.fixture
def bell(instance: str) -> Iterator[Doorbell]:
    b = Doorbell.create(segment_name(instance, "bell"))
    yield b
    b.close()
    b.unlink()


@pytest.fixture
def ring(instance: str) -> Iterator[Ring]:
    r = Ring.create(segment_name(instance, "ring"), MIN_CAPACITY)
    yield r
    r.close()
    r.unlink()


@pytest.fixture
def writer_bell(bell: Doorbell) -> Iterator[Doorbell]:
    b = Doorbell.attach(bell.name)
    yield b
    b.close()


def pending(bell: Doorbell) -> int:
    """Wake-up bytes waiting in the owner's FIFO (consumes them)."""
    n = 0
    try:
        while chunk := os.read(bell.fileno(), 4096):
            n += len(chunk)
    except BlockingIOError:
        pass
    return n


def waiting_flag(reader: RingReader) -> int:
    from mpbroker.shm import _ring

    return int(reader._q[_ring._W_WAITING])


def test_fifo_is_private(bell: Doorbell) -> None:
    st = os.stat(bell.path)
    assert stat.S_ISFIFO(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert bell.path == shm_path(bell.name)


def test_writer_rings_only_when_the_reader_is_parking(
    ring: Ring, bell: Doorbell, writer_bell: Doorbell
) -> None:
    w = ring.writer(writer_bell)
    r = ring.reader()
    assert w.try_put(1, b"a")
    assert pending(bell) == 0  # a busy reader costs the writer no system call
    r.set_waiting(True)
    assert w.try_put(1, b"b")
    assert w.try_put(1, b"c")
    assert pending(bell) == 2
    r.set_waiting(False)
    assert w.stage(1, b"d")
    assert pending(bell) == 0  # staging alone never rings
    w.publish()
    assert pending(bell) == 0
    assert len(r.read_batch()) == 4


def test_park_returns_at_once_when_data_is_there(
    ring: Ring, bell: Doorbell, writer_bell: Doorbell
) -> None:
    w = ring.writer(writer_bell)
    r = ring.reader()
    assert w.try_put(1, b"x")
    t0 = time.monotonic()
    assert park([r], bell, 10) is True
    assert time.monotonic() - t0 < 0.5
    assert waiting_flag(r) == 0
    assert r.read_batch() == [(1, b"x")]


def test_park_checks_every_ring(instance: str, bell: Doorbell, writer_bell: Doorbell) -> None:
    rings = [Ring.create(segment_name(instance, f"r{i}"), MIN_CAPACITY) for i in range(3)]
    try:
        readers = [rg.reader() for rg in rings]
        assert rings[2].writer(writer_bell).try_put(1, b"x")
        t0 = time.monotonic()
        assert park(readers, bell, 10) is True
        assert time.monotonic() - t0 < 0.5
        assert [waiting_flag(r) for r in readers] == [0, 0, 0]
    finally:
        for rg in rings:
            rg.close()
            rg.unlink()


def test_park_times_out(ring: Ring, bell: Doorbell) -> None:
    r = ring.reader()
    t0 = time.monotonic()
    assert park([r], bell, 0.1) is False
    assert 0.09 <= time.monotonic() - t0 < 2
    assert waiting_flag(r) == 0


def test_parked_reader_wakes_promptly(ring: Ring, bell: Doorbell, writer_bell: Doorbell) -> None:
    w = ring.writer(writer_bell)
    r = ring.reader()
    published_at: list[float] = []

    def publish_later() -> None:
        time.sleep(0.2)
        published_at.append(time.monotonic())
        assert w.try_put(1, b"wake")

    thread = threading.Thread(target=publish_later)
    thread.start()
    try:
        assert park([r], bell, 10) is True
        woke_at = time.monotonic()
    finally:
        thread.join(5)
    assert woke_at - published_at[0] < 0.5
    assert r.read_batch() == [(1, b"wake")]
    assert pending(bell) == 0  # park drained the doorbell


def test_a_full_pipe_is_a_pending_wake_up(bell: Doorbell, writer_bell: Doorbell) -> None:
    for _ in range(200_000):  # far more than a pipe holds (64 KiB by default)
        writer_bell.ring()
    bell.drain()
    assert pending(bell) == 0


def test_attach_missing_or_not_a_fifo(instance: str) -> None:
    name = segment_name(instance, "nobell")
    with pytest.raises(SegmentNotFoundError, match=name):
        Doorbell.attach(name)
    shm_path(name).write_bytes(b"")
    try:
        with pytest.raises(ShmError, match="not a FIFO"):
            Doorbell.attach(name)
    finally:
        shm_path(name).unlink()


def test_ring_without_a_reader_is_nothing_to_do(instance: str) -> None:
    name = segment_name(instance, "bell")
    owner = Doorbell.create(name)
    writer = Doorbell.attach(name)
    try:
        owner.close()  # the reader died: nobody has the FIFO open for reading
        writer.ring()  # EPIPE: nothing to do
        writer.ring()
        # A writer attaching while no reader is there connects later.
        late = Doorbell.attach(name)
        assert late.fileno() == -1
        late.ring()
        late.close()
    finally:
        writer.close()
        owner.unlink()
    assert not shm_path(name).exists()


def test_writers_reach_the_successor_of_a_dead_reader(instance: str) -> None:
    name = segment_name(instance, "bell")
    first = Doorbell.create(name)
    writer = Doorbell.attach(name)
    late = None
    try:
        first.close()  # reader died (kill -9 closes its descriptors the same way)
        late = Doorbell.attach(name)  # attaches while nobody reads: not connected yet
        successor = Doorbell.create(name)  # removes the stale FIFO, makes a new one
        try:
            first.unlink()  # the old owner's unlink must not remove the successor's FIFO
            assert shm_path(name).exists()
            writer.ring()  # old FIFO: EPIPE, reconnects to the new one and rings
            late.ring()
            assert pending(successor) == 2
        finally:
            successor.close()
            successor.unlink()
    finally:
        writer.close()
        if late is not None:
            late.close()
    assert not shm_path(name).exists()


def test_closed_doorbell(bell: Doorbell, writer_bell: Doorbell) -> None:
    writer_bell.close()
    writer_bell.close()
    with pytest.raises(ShmClosedError):
        writer_bell.ring()
    bell.close()
    for call in (bell.fileno, bell.ring, bell.drain):
        with pytest.raises(ShmClosedError):
            call()


async def test_park_async_wakes_on_publish(
    ring: Ring, bell: Doorbell, writer_bell: Doorbell
) -> None:
    w = ring.writer(writer_bell)
    r = ring.reader()

    async def publish_later() -> None:
        await trio.sleep(0.1)
        assert w.try_put(1, b"async")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publish_later)
        t0 = trio.current_time()
        assert await park_async([r], bell, 10) is True
        assert trio.current_time() - t0 < 1
    assert waiting_flag(r) == 0
    assert r.read_batch() == [(1, b"async")]


async def test_park_async_from_another_thread(
    ring: Ring, bell: Doorbell, writer_bell: Doorbell
) -> None:
    w = ring.writer(writer_bell)
    r = ring.reader()

    def publish_later() -> None:
        time.sleep(0.1)
        assert w.try_put(1, b"thread")

    thread = threading.Thread(target=publish_later)
    thread.start()
    try:
        with trio.fail_after(5):
            assert await park_async([r], bell, 10) is True
    finally:
        thread.join(5)
    assert r.read_batch() == [(1, b"thread")]


async def test_park_async_returns_at_once_or_times_out(
    ring: Ring, bell: Doorbell, writer_bell: Doorbell
) -> None:
    r = ring.reader()
    t0 = trio.current_time()
    assert await park_async([r], bell, 0.05) is False
    assert trio.current_time() - t0 >= 0.05
    assert waiting_flag(r) == 0
    assert ring.writer(writer_bell).try_put(1, b"x")
    with trio.fail_after(1):
        assert await park_async([r], bell, 10) is True


async def test_park_async_cancelled_clears_the_flag(ring: Ring, bell: Doorbell) -> None:
    r = ring.reader()
    with trio.move_on_after(0.05):
        await park_async([r], bell, 10)
    assert waiting_flag(r) == 0


def test_only_the_owner_parks(ring: Ring, writer_bell: Doorbell) -> None:
    r = ring.reader()
    with pytest.raises(ValueError, match="owner"):
        park([r], writer_bell, 0.01)
    assert waiting_flag(r) == 0


async def test_only_the_owner_parks_async(ring: Ring, writer_bell: Doorbell) -> None:
    with pytest.raises(ValueError, match="owner"):
        await park_async([ring.reader()], writer_bell, 0.01)


async def test_closing_the_doorbell_wakes_a_parked_task(ring: Ring, instance: str) -> None:
    bell = Doorbell.create(segment_name(instance, "closing"))
    r = ring.reader()
    try:

        async def close_later() -> None:
            await trio.sleep(0.05)
            bell.close()

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(close_later)
                with pytest.raises(ShmClosedError):
                    await park_async([r], bell, 10)
    finally:
        bell.close()
        bell.unlink()
    assert waiting_flag(r) == 0


def test_writer_attached_before_the_reader_exists(instance: str) -> None:
    name = segment_name(instance, "early")
    writer = Doorbell.attach(name, missing_ok=True)
    try:
        writer.ring()  # no FIFO yet: nothing to do
        owner = Doorbell.create(name)
        try:
            writer.ring()
            assert pending(owner) == 1
        finally:
            owner.close()
            owner.unlink()
    finally:
        writer.close()
