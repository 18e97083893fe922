"""Stats blocks: a seqlock'd JSON snapshot per worker."""

from __future__ import annotations

import errno
import os
import threading

import pytest

from mpbroker.shm import StatsBlock, segment_name


def test_a_snapshot_written_is_read_back_by_another_mapping(instance: str) -> None:
    name = segment_name(instance, "stats-0")
    block = StatsBlock.create(name, 1024)
    reader = StatsBlock.attach(name)
    try:
        assert reader.read() == b""
        block.write(b'{"a": 1}')
        assert reader.read() == b'{"a": 1}'
        block.write(b"{}")
        assert reader.read() == b"{}"
    finally:
        reader.close()
        block.close()
        block.unlink()


def test_a_reader_never_sees_a_torn_snapshot(instance: str) -> None:
    name = segment_name(instance, "stats-1")
    block = StatsBlock.create(name, 64 * 1024)
    reader = StatsBlock.attach(name)
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            # Some fit the block, some go to its spill file.
            block.write(bytes([n % 256]) * (1000 + n * 7919 % 100000))

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(2000):
            data = reader.read()
            assert len(set(data)) <= 1  # one write's bytes, never a mix
    finally:
        stop.set()
        writer.join()
        reader.close()
        block.close()
        block.unlink()


def test_a_writer_that_died_mid_write_does_not_block_its_successor(instance: str) -> None:
    name = segment_name(instance, "stats-2")
    block = StatsBlock.create(name, 128)
    try:
        block._q[0] = 7  # odd: a write that never finished
        successor = StatsBlock.attach(name)
        successor.write(b"fresh")
        assert block.read() == b"fresh"
        successor.close()
    finally:
        block.close()
        block.unlink()


def test_a_snapshot_larger_than_the_block_is_read_back_whole_from_its_spill_file(
    instance: str,
) -> None:
    name = segment_name(instance, "stats-3")
    block = StatsBlock.create(name, 1024)
    reader = StatsBlock.attach(name)
    try:
        big = b"x" * 5000
        block.write(big)
        assert reader.read() == big
        assert block.spill_path.stat().st_size == 5000
        block.write(b"y" * 7000)  # replaced in one rename
        assert reader.read() == b"y" * 7000
        block.write(b"{}")  # fits again: the spill file's memory is given back
        assert reader.read() == b"{}"
        assert not block.spill_path.exists()
        block.write(big)
    finally:
        reader.close()
        block.close()
        block.unlink()
    assert not block.spill_path.exists()  # unlink removes the spill file with the block


def test_a_spill_file_that_cannot_be_written_leaves_the_last_snapshot(
    instance: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = segment_name(instance, "stats-4")
    block = StatsBlock.create(name, 1024)
    try:
        block.write(b"{}")

        def full(fd: int, data: object) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", full)
        with pytest.raises(OSError, match="No space"):
            block.write(b"x" * 5000)
        monkeypatch.undo()
        assert block.read() == b"{}"
        assert not block.spill_path.exists()
        assert not list(block.spill_path.parent.glob(block.spill_path.name + "*"))
    finally:
        block.close()
        block.unlink()
