"""Control block: slots written by their own worker, read by everyone; the MemWatch level."""

from __future__ import annotations

import multiprocessing as mp
import os
import stat
import struct
from collections.abc import Iterator
from typing import Any

import posix_ipc
import pytest

from mpbroker.shm import (
    COUNTERS,
    STATE_EMPTY,
    STATE_READY,
    STATE_STARTING,
    STATE_STOPPING,
    ControlBlock,
    SegmentExistsError,
    SegmentNotFoundError,
    ShmClosedError,
    ShmError,
    ShmSpaceError,
    monotonic_ms,
    segment_name,
    shm_path,
)
from mpbroker.shm._segment import shm_free_bytes

from . import _children


@pytest.fixture
def block(instance: str) -> Iterator[ControlBlock]:
    b = ControlBlock.create(segment_name(instance, "control"), 4)
    yield b
    b.close()
    b.unlink()


def test_fresh_block(block: ControlBlock) -> None:
    assert block.slot_count == 4
    assert block.memwatch_level == 0
    assert (STATE_EMPTY, STATE_STARTING, STATE_READY, STATE_STOPPING) == (0, 1, 2, 3)
    for i in range(4):
        s = block.slot(i)
        assert (s.pid, s.incarnation, s.state, s.heartbeat_ms) == (0, 0, STATE_EMPTY, 0)
        assert [s.counter(c) for c in range(COUNTERS)] == [0] * COUNTERS
    st = os.stat(shm_path(block.name))
    assert stat.S_IMODE(st.st_mode) == 0o600


def test_fields_round_trip_and_slots_are_independent(block: ControlBlock) -> None:
    a, b = block.slot(1), block.slot(2)
    a.pid = 4242
    a.incarnation = 3
    a.state = STATE_READY
    before = monotonic_ms()
    beat = a.beat()
    assert before <= beat == a.heartbeat_ms <= monotonic_ms()
    a.set_counter(0, 2**64 - 1)
    a.set_counter(15, 7)
    assert a.add_counter(15, 5) == 12
    assert a.add_counter(3) == 1
    assert (a.pid, a.incarnation, a.state) == (4242, 3, STATE_READY)
    assert (a.counter(0), a.counter(3), a.counter(15)) == (2**64 - 1, 1, 12)
    assert (b.pid, b.state, b.counter(15)) == (0, STATE_EMPTY, 0)
    block.memwatch_level = 2
    assert block.memwatch_level == 2
    assert block.memwatch_permille == 0  # before MemWatch's first reading
    block.memwatch_permille = 812
    other = ControlBlock.attach(block.name)
    try:
        assert other.slot(1).counter(15) == 12
        assert other.memwatch_level == 2
        assert other.memwatch_permille == 812
    finally:
        other.close()


def test_bad_indexes_and_values(block: ControlBlock) -> None:
    with pytest.raises(IndexError):
        block.slot(4)
    with pytest.raises(IndexError):
        block.slot(-1)
    s = block.slot(0)
    with pytest.raises(IndexError):
        s.counter(COUNTERS)
    with pytest.raises(IndexError):
        s.set_counter(-1, 0)
    with pytest.raises(ValueError):
        s.set_counter(0, -1)
    with pytest.raises(ValueError):
        ControlBlock.create(segment_name("1", "x"), 0)


def test_closed_block(block: ControlBlock) -> None:
    s = block.slot(0)
    block.close()
    block.close()
    assert block.closed
    with pytest.raises(ShmClosedError):
        _ = s.pid
    with pytest.raises(ShmClosedError):
        s.add_counter(0)
    with pytest.raises(ShmClosedError):
        block.memwatch_level = 1
    with pytest.raises(ShmClosedError):
        block.slot(0)


def test_create_attach_errors(block: ControlBlock, instance: str) -> None:
    with pytest.raises(SegmentExistsError):
        ControlBlock.create(block.name, 2)
    with pytest.raises(SegmentNotFoundError):
        ControlBlock.attach(segment_name(instance, "missing"))
    name = segment_name(instance, "foreign")
    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=4096)
    try:
        with pytest.raises(ShmError, match="magic"):
            ControlBlock.attach(name)
        os.pwrite(
            shm.fd, struct.pack("<QQQQ", int.from_bytes(b"mpbCTRL\0", "little"), 1, 99, 256), 0
        )
        with pytest.raises(ShmError, match="cannot hold 99 slots"):
            ControlBlock.attach(name)
    finally:
        shm.close_fd()
        shm.unlink()


def test_not_enough_space(instance: str) -> None:
    name = segment_name(instance, "control")
    with pytest.raises(ShmSpaceError, match=f"cannot create control block {name}"):
        ControlBlock.create(name, shm_free_bytes() // 256 + 1)
    assert not shm_path(name).exists()


def test_two_processes_write_their_own_slots_and_read_each_other(block: ControlBlock) -> None:
    ctx = mp.get_context("spawn")
    block.memwatch_level = 1
    out: Any = ctx.Queue()
    procs = [
        ctx.Process(target=_children.control_worker, args=(block.name, i, 1 - i, out), daemon=True)
        for i in (0, 1)
    ]
    for p in procs:
        p.start()
    try:
        results = {}
        for _ in procs:
            index, pid, seen = out.get(timeout=60)
            results[index] = (pid, seen)
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(10)
    for index in (0, 1):
        other = 1 - index
        other_pid = results[other][0]
        pid, incarnation, state, heartbeat, counters, level = results[index][1]
        assert pid == other_pid
        assert incarnation == 1
        assert state in (STATE_READY, STATE_STOPPING)
        assert 0 < heartbeat <= monotonic_ms()
        expected = [(other + 1) * 1000 + i for i in range(16)]
        expected[15] += 5
        assert counters == expected
        assert level == 1
    # The parent sees both slots as the workers left them.
    assert block.slot(0).pid == results[0][0]
    assert block.slot(1).state == STATE_STOPPING
