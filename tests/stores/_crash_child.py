"""The writer that test_crash.py kills with SIGKILL (runs in a spawned process)."""

from __future__ import annotations

import os
from pathlib import Path

from mpbroker.config import StoreSettings
from mpbroker.records import Message
from mpbroker.stores import MessageStore
from tests.factories import make_message

BATCH = 7


def batch_messages(batch: int) -> list[Message]:
    return [
        make_message(
            f"b{batch}-{i}",
            "/queue/crash",
            headers={"batch": str(batch), "i": str(i)},
            body=os.urandom(150),
            timestamp_ms=batch,
            persistent=True,
            priority=batch % 10,
        )
        for i in range(BATCH)
    ]


def run(directory: str, log_path: str, first_batch: int, synchronous: str) -> None:
    """Append batches forever; settle each batch two appends later; settle leftovers of
    earlier rounds first. Each call that RETURNED is logged with one write(2) of a line."""
    settings = StoreSettings(
        segment_max_bytes=40 * 1024, segment_max_age_s=0, synchronous=synchronous
    )
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    store = MessageStore.open(Path(directory), settings)
    leftovers: dict[int, list[int]] = {}
    for sm in store.live():
        leftovers.setdefault(int(sm.message.headers["batch"]), []).append(sm.seq)
    os.write(fd, b"ready\n")
    for batch, seqs in sorted(leftovers.items()):
        store.settle(seqs, "acked", 0)
        os.write(fd, f"S {batch}\n".encode())
    mine: list[tuple[int, list[int]]] = []
    batch = first_batch
    while True:
        seqs = store.append(batch_messages(batch))
        os.write(fd, f"A {batch}\n".encode())
        mine.append((batch, seqs))
        if len(mine) > 2:
            old, old_seqs = mine.pop(0)
            store.settle(old_seqs, "acked", batch)
            os.write(fd, f"S {old}\n".encode())
        if batch % 5 == 0:
            store.record_delivery(seqs[:1])
        batch += 1
