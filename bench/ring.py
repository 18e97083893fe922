"""Throughput of a ring between two processes (a measurement script, not a test).

    .venv/bin/python -m bench.ring [records] [capacity]
    .venv/bin/python -m bench.ring --big [payloads] [payload_bytes]

Writer process -> reader process, 100-byte payloads, with 1 record per publish (try_put) and
with 64 records per publish (stage x64, publish); the reader takes one record per read_batch
or whatever is there (up to 1024), and parks on its doorbell when the ring is empty.
docs/architecture.md, "Rings", quotes ~650k/s and ~930k/s for a pure-Python ring on this kind of machine.

``--big``: payloads larger than a record (default 64 of 4 MiB), one put_blocking each, through
a 256 KiB ring (in fragments of 64 KiB) and an 8 MiB ring (fragments of 2 MiB).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from multiprocessing.synchronize import Event

from mpbroker.shm import Doorbell, Ring, park, remove_instance, segment_name

PAYLOAD = bytes(range(100))
BIG_CAPACITIES = (256 << 10, 8 << 20)


def _writer(
    ring_name: str, bell_name: str, n: int, batch: int, go: Event, payload_bytes: int = 100
) -> None:
    ring = Ring.attach(ring_name)
    bell = Doorbell.attach(bell_name)
    w = ring.writer(bell)
    payload = PAYLOAD if payload_bytes == 100 else bytes(payload_bytes)
    go.wait()
    if batch == 0:
        for _ in range(n):
            w.put_blocking(1, payload)
    elif batch == 1:
        for _ in range(n):
            if not w.try_put(1, PAYLOAD):
                w.put_blocking(1, PAYLOAD)
    else:
        left = n
        while left:
            k = min(batch, left)
            for _ in range(k):
                if not w.stage(1, PAYLOAD):
                    w.put_blocking(1, PAYLOAD)
            w.publish()
            left -= k
    bell.close()
    ring.close()


def _reader_main(
    ring_name: str,
    bell_name: str,
    n: int,
    max_records: int,
    go: Event,
    out: mp.SimpleQueue[float],
) -> None:
    ring = Ring.attach(ring_name)
    bell = Doorbell.create(bell_name)
    r = ring.reader()
    out.put(0.0)  # doorbell exists: the writer may attach
    go.wait()
    t0 = time.perf_counter()
    got = 0
    while got < n:
        batch = r.read_batch(max_records)
        if batch:
            got += len(batch)
        else:
            park([r], bell, 0.01)
    out.put(time.perf_counter() - t0)
    bell.close()
    bell.unlink()
    ring.close()


def run(
    n: int, batch: int, capacity: int, max_records: int = 1024, payload_bytes: int = 100
) -> float:
    ctx = mp.get_context("spawn")
    instance = f"{os.getpid()}bench"
    ring_name = segment_name(instance, "ring")
    bell_name = segment_name(instance, "bell")
    ring = Ring.create(ring_name, capacity)
    try:
        go = ctx.Event()
        out: mp.SimpleQueue[float] = ctx.SimpleQueue()
        rp = ctx.Process(target=_reader_main, args=(ring_name, bell_name, n, max_records, go, out))
        rp.start()
        out.get()
        wp = ctx.Process(target=_writer, args=(ring_name, bell_name, n, batch, go, payload_bytes))
        wp.start()
        time.sleep(0.5)  # let the writer attach and wait
        go.set()
        elapsed = out.get()
        wp.join()
        rp.join()
        return n / elapsed
    finally:
        ring.close()
        ring.unlink()
        remove_instance(instance)


def main_big(n: int, size: int) -> None:
    for capacity in BIG_CAPACITIES:
        rates = sorted(run(n, 0, capacity, payload_bytes=size) for _ in range(3))
        print(
            f"{n} payloads of {size} B, one put_blocking each, ring {capacity} B: median "
            f"{rates[1] * size / 2**20:,.0f} MiB/s (min {rates[0] * size / 2**20:,.0f}, "
            f"max {rates[2] * size / 2**20:,.0f})"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ring",
        description="Records/s through one ring between two processes (or, with --big, MiB/s "
        "of large payloads passed in fragments).",
    )
    parser.add_argument(
        "--big", action="store_true", help="large payloads through rings of several sizes"
    )
    parser.add_argument(
        "count", type=int, nargs="?", help="records (default 2,000,000; --big: 64 payloads)"
    )
    parser.add_argument(
        "size",
        type=int,
        nargs="?",
        help="ring capacity in bytes (default 1 MiB; --big: payload bytes, default 4 MiB)",
    )
    args = parser.parse_args(argv)
    if args.big:
        main_big(args.count or 64, args.size or 4 << 20)
        return
    n = args.count or 2_000_000
    capacity = args.size or 1 << 20
    for batch, max_records in ((1, 1), (1, 1024), (64, 1024)):
        rates = sorted(run(n, batch, capacity, max_records) for _ in range(3))
        print(
            f"{batch:>2} record(s)/publish, reader up to {max_records:>4}/read_batch, "
            f"100-byte payloads, ring {capacity} B: median {rates[1] / 1e3:,.0f}k records/s "
            f"(min {rates[0] / 1e3:,.0f}k, max {rates[2] / 1e3:,.0f}k)"
        )


if __name__ == "__main__":
    main()
