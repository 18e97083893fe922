"""Process bodies for the multi-process tests.

They run in spawn-context children, so they live in a small importable module (not in a test
module, which would drag pytest and hypothesis into every child).
"""

from __future__ import annotations

import random
import time
import zlib
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

from mpbroker.shm import (
    STATE_READY,
    STATE_STOPPING,
    ControlBlock,
    Doorbell,
    Ring,
    park,
)
from mpbroker.shm import _ring as ring_internals

# --- bulk transfer ----------------------------------------------------------------------------


def transfer_sizes(seed: int, total_bytes: int, capacity: int) -> list[int]:
    """Payload sizes adding up to at least ``total_bytes``: many tiny, many medium, some large,
    a few larger than a record (a quarter of the ring) up to three times the whole ring (those
    go as fragments, so writer and reader must take turns within one payload)."""
    rng = random.Random(seed)
    sizes: list[int] = []
    total = 0
    while total < total_bytes:
        pick = rng.random()
        if pick < 0.35:
            size = rng.randrange(0, 64)
        elif pick < 0.65:
            size = rng.randrange(64, 2048)
        elif pick < 0.99:
            size = rng.randrange(2048, 20_000)
        else:
            size = rng.randrange(capacity // 4 - 8, 3 * capacity)
        sizes.append(size)
        total += size
    return sizes


def transfer_payload(seed: int, seq: int, size: int) -> bytes:
    """The bytes of record ``seq``: derived from the sequence number only."""
    return random.Random(seed * 1_000_003 + seq).randbytes(size)


def transfer_writer(
    ring_name: str, bell_name: str, seed: int, total_bytes: int, out: Queue[Any]
) -> None:
    ring = Ring.attach(ring_name)
    bell = Doorbell.attach(bell_name)
    w = ring.writer(bell)
    sizes = transfer_sizes(seed, total_bytes, ring.capacity)
    rng = random.Random(seed + 1)
    crc = 0
    nbytes = 0
    blocked = 0
    seq = 0
    while seq < len(sizes):
        # Batches of 1..64 records published at once; a batch that does not fit is handled by
        # put_blocking, which must publish the staged part first (the big-batch trap).
        for _ in range(rng.randint(1, 64)):
            if seq == len(sizes):
                break
            payload = transfer_payload(seed, seq, sizes[seq])
            if not w.stage(seq + 1, payload):
                blocked += 1
                if not w.put_blocking(seq + 1, payload, timeout=60):
                    out.put(("writer-timeout", seq))
                    return
            crc = zlib.crc32(payload, crc)
            nbytes += len(payload)
            seq += 1
        w.publish()
        if rng.random() < 0.01:
            # Pause now and then so the reader runs dry and parks on its doorbell.
            time.sleep(rng.uniform(0.002, 0.02))
    out.put(("writer", seq, nbytes, crc, blocked))
    bell.close()
    ring.close()


def transfer_reader(
    ring_name: str,
    bell_name: str,
    seed: int,
    total_bytes: int,
    park_timeout: float,
    out: Queue[Any],
) -> None:
    ring = Ring.attach(ring_name)
    bell = Doorbell.create(bell_name)
    r = ring.reader()
    out.put(("reader-ready",))
    sizes = transfer_sizes(seed, total_bytes, ring.capacity)
    rng = random.Random(seed + 2)
    crc = 0
    nbytes = 0
    seq = 0
    first_bad = -1
    parks = woken = timeouts = 0
    while seq < len(sizes):
        batch = r.read_batch(max_records=rng.randint(1, 200))
        if not batch:
            parks += 1
            if park([r], bell, park_timeout):
                woken += 1
            else:
                timeouts += 1
            continue
        for kind, payload in batch:
            if first_bad < 0 and (
                kind != seq + 1 or payload != transfer_payload(seed, seq, sizes[seq])
            ):
                first_bad = seq
            crc = zlib.crc32(payload, crc)
            nbytes += len(payload)
            seq += 1
        if rng.random() < 0.01:
            # Fall behind now and then so the writer finds the ring full and must wait.
            time.sleep(rng.uniform(0.002, 0.02))
    extra = r.read_batch()
    fragments = ring.statistics().fragments_read
    out.put(("reader", seq, nbytes, crc, first_bad, parks, woken, timeouts, len(extra), fragments))
    bell.close()
    bell.unlink()
    ring.close()


def fragment_writer(ring_name: str, bell_name: str, seed: int, sizes: list[int]) -> None:
    """Put payloads of ``sizes`` (kind = sequence number + 1), each with put_blocking."""
    ring = Ring.attach(ring_name)
    bell = Doorbell.attach(bell_name)
    w = ring.writer(bell)
    for seq, size in enumerate(sizes):
        if not w.put_blocking(seq + 1, transfer_payload(seed, seq, size), timeout=60):
            raise SystemExit(f"no room for payload {seq} within 60 s")
    bell.close()
    ring.close()


# --- torn counters -----------------------------------------------------------------------------


def hammer_counters(ring_name: str, cpu: int, stop: Event, seen: Any, out: Queue[Any]) -> None:
    """Load head and tail as fast as possible; both must only ever grow, and never read 0
    (checked by "never smaller than the last value": the counters start far above 0).
    ``seen.value`` tells the parent how many head changes were observed so far."""
    import os

    os.sched_setaffinity(0, {cpu})
    ring = Ring.attach(ring_name)
    q = ring._hq
    w_head = ring_internals._W_HEAD
    w_tail = ring_internals._W_TAIL
    last_head = q[w_head]
    last_tail = q[w_tail]
    samples = 0
    changes = 0
    bad: list[tuple[str, int, int]] = []
    out.put(("hammer-ready",))
    while not stop.is_set():
        for _ in range(4096):
            h = q[w_head]
            t = q[w_tail]
            if h != last_head:
                if h < last_head and len(bad) < 10:
                    bad.append(("head", last_head, h))
                changes += 1
                last_head = h
            if t != last_tail:
                if t < last_tail and len(bad) < 10:
                    bad.append(("tail", last_tail, t))
                last_tail = t
        samples += 4096
        seen.value = changes
    out.put(("hammer", samples, changes, bad))
    ring.close()


# --- reader killed mid-stream ------------------------------------------------------------------


def slow_reader(ring_name: str, progress: Any, ready: Event) -> None:
    """Read one record at a time, slowly, publishing the last sequence number consumed."""
    ring = Ring.attach(ring_name)
    r = ring.reader()
    ready.set()
    while True:
        batch = r.read_batch(max_records=1)
        if batch:
            progress.value = int.from_bytes(batch[0][1][:8], "little")
            time.sleep(0.001)
        else:
            time.sleep(0.0005)


# --- control block -----------------------------------------------------------------------------


def control_worker(name: str, index: int, other: int, out: Queue[Any]) -> None:
    import os

    block = ControlBlock.attach(name)
    mine = block.slot(index)
    theirs = block.slot(other)
    mine.pid = os.getpid()
    mine.incarnation = mine.incarnation + 1
    for i in range(16):
        mine.set_counter(i, (index + 1) * 1000 + i)
    mine.add_counter(15, 5)
    mine.beat()
    mine.state = STATE_READY
    deadline = time.monotonic() + 30
    while theirs.state not in (STATE_READY, STATE_STOPPING) and time.monotonic() < deadline:
        time.sleep(0.001)
    seen = (
        theirs.pid,
        theirs.incarnation,
        theirs.state,
        theirs.heartbeat_ms,
        [theirs.counter(i) for i in range(16)],
        block.memwatch_level,
    )
    out.put((index, os.getpid(), seen))
    # Stay until the other has read our slot too.
    mine.state = STATE_STOPPING
    while theirs.state != STATE_STOPPING and time.monotonic() < deadline:
        time.sleep(0.001)
    block.close()
