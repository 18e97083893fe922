"""Rings between real processes (spawn context), covering the traps listed in docs/architecture.md, "Traps"."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from multiprocessing.context import SpawnProcess
from typing import Any

import pytest

from mpbroker.shm import (
    Doorbell,
    Ring,
    park,
    record_bytes,
    segment_name,
)
from mpbroker.shm import _ring as ring_internals

from . import _children

ctx = mp.get_context("spawn")


@pytest.fixture
def processes() -> Iterator[list[SpawnProcess]]:
    """Processes started by a test; any still alive at the end are killed (and the test fails
    through its own assertions)."""
    started: list[SpawnProcess] = []
    yield started
    for p in started:
        if p.is_alive():
            p.kill()
        p.join(10)
        p.close()


def start(processes: list[SpawnProcess], target: Any, *args: Any) -> SpawnProcess:
    p = ctx.Process(target=target, args=args, daemon=True)
    p.start()
    processes.append(p)
    return p


def join_all(processes: list[SpawnProcess], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
        assert not p.is_alive(), f"process {p.pid} hangs (>{timeout}s): lost wake-up or deadlock?"
        assert p.exitcode == 0, f"process {p.pid} exited with {p.exitcode}"


def test_40_mb_through_a_64_kib_ring(instance: str, processes: list[SpawnProcess]) -> None:
    """Varied records (0 B .. three whole rings, in fragments) cross the end of the data area
    hundreds of times; every byte is checked; the reader parks on its doorbell, the writer uses
    put_blocking."""
    ring_name = segment_name(instance, "bulk")
    bell_name = segment_name(instance, "bulk-bell")
    total = 40 << 20
    seed = 20240501
    ring = Ring.create(ring_name, 64 << 10)
    out: Any = ctx.Queue()
    try:
        start(processes, _children.transfer_reader, ring_name, bell_name, seed, total, 1.0, out)
        assert out.get(timeout=60) == ("reader-ready",)
        start(processes, _children.transfer_writer, ring_name, bell_name, seed, total, out)
        results = {}
        for _ in range(2):
            msg = out.get(timeout=120)
            results[msg[0]] = msg[1:]
        join_all(processes, 30)
    finally:
        ring.close()
        ring.unlink()
    assert "writer-timeout" not in results, results
    w_records, w_bytes, w_crc, w_blocked = results["writer"]
    r_records, r_bytes, r_crc, first_bad, parks, woken, timeouts, extra, fragments = results[
        "reader"
    ]
    assert first_bad == -1, f"record {first_bad} arrived wrong"
    assert (r_records, r_bytes, r_crc) == (w_records, w_bytes, w_crc)
    assert w_bytes >= total
    assert extra == 0
    assert fragments > 0
    # Both traps were actually exercised: the writer found the ring full, the reader parked
    # and the doorbell (not only the timeout backstop) woke it.
    assert w_blocked > 0
    assert parks > 0
    assert woken > 0, (parks, woken, timeouts)
    # A lost wake-up costs one park timeout (1 s); it must be rare, not the way things move.
    assert timeouts <= max(3, parks // 20), (parks, woken, timeouts)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_counters_are_never_seen_torn(instance: str, processes: list[SpawnProcess]) -> None:
    """Another process loads head and tail in a tight loop while this one publishes and
    consumes; with struct.pack_into it would now and then see 0 (docs/architecture.md, "Traps")."""
    name = segment_name(instance, "torn")
    ring = Ring.create(name, 1 << 16)
    # Free-running counters can start anywhere (8-aligned); start near 2**40 so that the
    # values have high bytes set and roll over byte boundaries while we run.
    start_at = (1 << 40) - 50_000 * 16
    ring._hq[ring_internals._W_HEAD] = start_at
    ring._hq[ring_internals._W_TAIL] = start_at
    out: Any = ctx.Queue()
    stop = ctx.Event()
    seen: Any = ctx.Value("q", 0, lock=False)
    # Pin the two sides to different CPUs: left to the scheduler on a busy 2-CPU machine, they
    # may share one CPU in turns, and then the hammer never loads while a store is under way.
    affinity = os.sched_getaffinity(0)
    my_cpu, other_cpu = sorted(affinity)[:2]
    try:
        os.sched_setaffinity(0, {my_cpu})
        start(processes, _children.hammer_counters, name, other_cpu, stop, seen, out)
        assert out.get(timeout=60) == ("hammer-ready",)
        w = ring.writer()
        r = ring.reader()
        # Run until the other process has watched enough stores (adaptive: on a loaded
        # machine the two processes may share a core for a while), at most 20 s.
        deadline = time.monotonic() + 20
        publishes = 0
        while seen.value < 50_000 and time.monotonic() < deadline:
            for _ in range(1000):
                w.try_put(1, b"12345678")
                publishes += 1
            r.read_batch()
        stop.set()
        _, samples, changes, bad = out.get(timeout=60)
        join_all(processes, 30)
        assert ring.statistics().head == start_at + publishes * record_bytes(8)
    finally:
        os.sched_setaffinity(0, affinity)
        ring.close()
        ring.unlink()
    assert bad == [], f"counter went backwards or read 0 mid-store: {bad}"
    assert changes >= 50_000, (
        f"the hammering process saw too few stores to mean anything: {changes} changes in "
        f"{samples} samples, {publishes} publishes"
    )
    assert samples > changes


def test_payloads_larger_than_the_ring_from_a_child_writer(
    instance: str, processes: list[SpawnProcess]
) -> None:
    """The writer is another process: fragments of one payload cross between processes while
    the reader parks on its doorbell whenever it has taken all that was published."""
    ring = Ring.create(segment_name(instance, "frag"), 1 << 14)
    bell = Doorbell.create(segment_name(instance, "frag-bell"))
    cap = ring.capacity
    seed = 77
    edge = [0, 1, cap // 4 - 8, cap // 4 - 7, cap - 8, cap, 3 * cap, 3 * cap + 5, 64 * cap + 3]
    sizes = edge + [random.Random(seed).randrange(0, 4 * cap) for _ in range(300)] + edge
    got: list[tuple[int, bytes]] = []
    try:
        reader = ring.reader()
        start(processes, _children.fragment_writer, ring.name, bell.name, seed, sizes)
        deadline = time.monotonic() + 120
        while len(got) < len(sizes) and time.monotonic() < deadline:
            batch = reader.read_batch(max_records=7)
            if batch:
                got += batch
            else:
                park([reader], bell, 0.5)
        join_all(processes, 30)
        stats = ring.statistics()
    finally:
        bell.close()
        bell.unlink()
        ring.close()
        ring.unlink()
    assert len(got) == len(sizes)
    for seq, (kind, payload) in enumerate(got):
        assert kind == seq + 1
        assert payload == _children.transfer_payload(seed, seq, sizes[seq]), seq
    assert stats.records_read == len(sizes)
    assert stats.fragments_read > 64
    assert stats.payloads_dropped == 0


def test_big_batch_larger_than_free_space_does_not_deadlock(instance: str) -> None:
    """Stage more than fits (nothing published), then put_blocking: it must publish the
    staged batch first, or the reader never sees anything and the writer waits forever."""
    ring = Ring.create(segment_name(instance, "batch"), 1 << 14)
    bell = Doorbell.create(segment_name(instance, "batch-bell"))
    writer_bell = Doorbell.attach(bell.name)
    received: list[tuple[int, bytes]] = []
    try:
        w = ring.writer(writer_bell)
        r = Ring.attach(ring.name)
        reader = r.reader()
        staged = 0
        while w.stage(staged + 1, staged.to_bytes(4, "little") * 25):
            staged += 1
        assert w.free_bytes == ring.capacity - staged * record_bytes(100) < record_bytes(100)
        total = staged + 50
        done = threading.Event()

        def read_all() -> None:
            while len(received) < total:
                batch = reader.read_batch()
                if batch:
                    received.extend(batch)
                else:
                    park([reader], bell, 0.5)
            done.set()

        thread = threading.Thread(target=read_all, daemon=True)
        thread.start()
        time.sleep(0.05)  # the reader is parked on an empty-looking ring now
        assert received == []
        t0 = time.monotonic()
        for seq in range(staged, total):
            assert w.put_blocking(seq + 1, seq.to_bytes(4, "little") * 25, timeout=10)
        assert time.monotonic() - t0 < 5
        assert done.wait(10)
        thread.join(5)
        r.close()
    finally:
        writer_bell.close()
        bell.close()
        bell.unlink()
        ring.close()
        ring.unlink()
    assert [k for k, _ in received] == list(range(1, total + 1))
    assert all(p == (k - 1).to_bytes(4, "little") * 25 for k, p in received)


def test_successor_of_a_killed_reader_continues_from_the_tail(
    instance: str, processes: list[SpawnProcess]
) -> None:
    name = segment_name(instance, "crash")
    ring = Ring.create(name, 4096)
    size = record_bytes(100)
    total = 400
    progress: Any = ctx.Value("q", -1, lock=False)
    ready = ctx.Event()
    try:
        w = ring.writer()
        child = start(processes, _children.slow_reader, name, progress, ready)
        assert ready.wait(60)
        assert ring.statistics().incarnation == 1

        def payload(seq: int) -> bytes:
            return seq.to_bytes(8, "little") + bytes([seq & 0xFF]) * 92

        seq = 0
        while seq < 150:
            assert w.put_blocking(1, payload(seq), timeout=30)
            seq += 1
        assert ring.statistics().used_bytes > 0
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(10)
        assert child.exitcode == -signal.SIGKILL
        dead_at = ring.statistics()
        consumed = (dead_at.tail - 0) // size
        assert 0 < consumed < 150
        # The dead reader consumed up to its last published tail (it may have died between
        # copying a record out and reporting it, never the other way round).
        assert consumed in (progress.value + 1, progress.value + 2)

        successor_ring = Ring.attach(name)
        successor = successor_ring.reader()
        assert successor.incarnation == successor_ring.statistics().incarnation == 2
        got: list[int] = []
        while seq < total:
            if not w.try_put(1, payload(seq)):
                got.extend(int.from_bytes(p[:8], "little") for _, p in successor.read_batch())
                continue
            seq += 1
        got.extend(int.from_bytes(p[:8], "little") for _, p in successor.read_batch())
        successor_ring.close()
    finally:
        ring.close()
        ring.unlink()
    assert got == list(range(consumed, total))
