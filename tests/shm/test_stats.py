"""Stats blocks: a seqlock'd JSON snapshot per worker."""

from __future__ import annotations

import threading

from mpbroker.shm import StatsBlock, segment_name


def test_a_snapshot_written_is_read_back_by_another_mapping(instance: str) -> None:
    name = segment_name(instance, "stats-0")
    block = StatsBlock.create(name, 1024)
    reader = StatsBlock.attach(name)
    try:
        assert reader.read() == b""
        assert block.write(b'{"a": 1}')
        assert reader.read() == b'{"a": 1}'
        assert block.write(b"{}")
        assert reader.read() == b"{}"
        assert not block.write(b"x" * 1025)  # too big: the last snapshot stays
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
            block.write(bytes([n % 256]) * (1000 + n % 50000))

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
        assert successor.write(b"fresh")
        assert block.read() == b"fresh"
        successor.close()
    finally:
        block.close()
        block.unlink()
