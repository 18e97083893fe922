"""Throughput of the segmented SQLite message store (a measurement script, not a test).

    .venv/bin/python -m bench.store [messages] [directory]

100-byte messages appended in batches of 1, 8, 64 and 256 (one transaction each: the group
commit unit) with synchronous = full and = normal; settles/s (acks in batches of 64); and
the time `live()` takes to load 100k live messages at start-up. The directory defaults to a
temporary one on the same disk as the data directory would be (fsync cost depends on it).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from mpbroker.config import StoreSettings
from mpbroker.records import Message
from mpbroker.stores import MessageStore

BODY = bytes(range(100))


def _messages(n: int) -> list[Message]:
    return [
        Message(
            message_id=f"ID:bench-{i}",
            destination="/queue/bench",
            headers={},
            body=BODY,
            timestamp_ms=i,
            persistent=True,
        )
        for i in range(n)
    ]


def _append_rate(root: Path, synchronous: str, batch: int, n: int) -> float:
    directory = root / f"append-{synchronous}-{batch}"
    messages = _messages(n)
    with MessageStore.open(directory, StoreSettings(synchronous=synchronous)) as store:
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            store.append(messages[i : i + batch])
        elapsed = time.perf_counter() - t0
    shutil.rmtree(directory)
    return n / elapsed


def _settle_rate(root: Path, n: int) -> float:
    directory = root / "settle"
    with MessageStore.open(directory, StoreSettings(synchronous="full")) as store:
        seqs: list[int] = []
        messages = _messages(n)
        for i in range(0, n, 256):
            seqs.extend(store.append(messages[i : i + 256]))
        t0 = time.perf_counter()
        for i in range(0, n, 64):
            store.settle(seqs[i : i + 64], "acked", 0)
        elapsed = time.perf_counter() - t0
    shutil.rmtree(directory)
    return n / elapsed


def _live_load(root: Path, n: int) -> tuple[float, float]:
    directory = root / "live"
    settings = StoreSettings(synchronous="normal")
    with MessageStore.open(directory, settings) as store:
        messages = _messages(n)
        for i in range(0, n, 1000):
            store.append(messages[i : i + 1000])
    t0 = time.perf_counter()
    with MessageStore.open(directory, settings) as store:
        t1 = time.perf_counter()
        live = store.live()
        t2 = time.perf_counter()
        assert len(live) == n
    shutil.rmtree(directory)
    return t1 - t0, t2 - t1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.store",
        description=(__doc__ or "").strip().splitlines()[0],
    )
    parser.add_argument("messages", type=int, nargs="?", default=20_000, help="per case")
    parser.add_argument(
        "directory", type=Path, nargs="?", help="where to write (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    n = args.messages
    root = Path(tempfile.mkdtemp(prefix="mpb-store-bench-", dir=args.directory))
    try:
        print(f"store bench in {root}: 100-byte messages, {n} per case")
        for synchronous in ("full", "normal"):
            for batch in (1, 8, 64, 256):
                count = min(n, 2_000) if batch == 1 and synchronous == "full" else n
                rate = _append_rate(root, synchronous, batch, count)
                print(
                    f"  append  synchronous={synchronous:<6} batch={batch:>3}: {rate:>9,.0f} msgs/s"
                )
        print(f"  settle  synchronous=full   batch= 64: {_settle_rate(root, n):>9,.0f} msgs/s")
        open_s, live_s = _live_load(root, 100_000)
        print(f"  open + live() of 100k messages: open {open_s:.2f} s, live() {live_s:.2f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
