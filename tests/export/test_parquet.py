"""The export's Parquet reading: the seqs of update files, held compactly."""

from __future__ import annotations

import random
import tracemalloc
from pathlib import Path

from mpbroker.export._parquet import (
    UPDATES,
    ParquetOut,
    SeqSet,
    arrow_schema,
    pending_keys,
    update_seqs,
)


def update_file(path: Path, seqs: list[int]) -> Path:
    """An update file with an `acked` outcome for each of `seqs`, in that order."""
    rows = [
        {
            "store": "p2p-0",
            "segment": 1,
            "seq": seq,
            "message_id": f"m-{seq}",
            "destination": "/queue/a",
            "timestamp": 1_000_000,
            "outcome": "acked",
            "settled_at": 2_000_000,
            "redeliveries": 0,
        }
        for seq in seqs
    ]
    with ParquetOut.open(path, arrow_schema(True, "p2p-0/seg-00000001", kind=UPDATES)) as out:
        for i in range(0, len(rows), 50_000):
            out.write(rows[i : i + 50_000])
        out.commit()
    return path


def test_a_seq_set_answers_as_a_set_does() -> None:
    rng = random.Random(7)
    runs = [
        list(range(10, 200, 3)),  # ascending, as the export writes them
        rng.sample(range(1000), 300),  # in any order
        [5, 5, 70, 70, 999],  # with repeats, and seqs another run holds
        [],
    ]
    seqs = SeqSet(*runs)
    expected = {s for run in runs for s in run}
    assert len(seqs) == len(expected)
    assert all((probe in seqs) == (probe in expected) for probe in range(-5, 1100))
    assert "5" not in seqs and None not in seqs
    assert 0 not in SeqSet()


def test_the_seqs_of_update_files_take_8_bytes_each(tmp_path: Path) -> None:
    """A set of Python ints took about 57 bytes per seq: 55 MiB for a segment of a million
    rows, which --max-memory does not account for."""
    n = 200_000
    first = update_file(tmp_path / "u1.parquet", list(range(1, 2 * n, 2)))  # odd seqs
    second = update_file(tmp_path / "u2.parquet", [8, 4, 2])
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        seqs = update_seqs([first, second])
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(seqs) == n + 3
    assert held < 10 * (n + 3), f"{held / (n + 3):.1f} bytes per seq"
    assert all(s in seqs for s in (1, 3, 2 * n - 1, 2, 4, 8))
    assert all(s not in seqs for s in (0, 6, 2 * n, 2 * n + 1))


def test_pending_keys_leave_out_the_seqs_resolved(tmp_path: Path) -> None:
    rows = tmp_path / "rows.parquet"
    schema = arrow_schema(False, "p2p-0/seg-00000001")
    with ParquetOut.open(rows, schema) as out:
        out.write(
            [
                {
                    "message_id": f"m-{seq}",
                    "destination": "/queue/a",
                    "kind": "queue",
                    "persistent": True,
                    "priority": 4,
                    "timestamp": 1_000_000 + seq,
                    "expires": None,
                    "redeliveries": 0,
                    "size_bytes": 10,
                    "headers": [],
                    "properties": [],
                    "outcome": "pending" if seq % 2 else "acked",
                    "settled_at": None if seq % 2 else 2_000_000,
                    "pending_subscriptions": None,
                    "store": "p2p-0",
                    "segment": 1,
                    "seq": seq,
                }
                for seq in range(1, 11)
            ]
        )
        out.commit()
    resolved = update_seqs([update_file(tmp_path / "u.parquet", [7, 3])])
    keys = list(pending_keys(rows, resolved, 4))
    assert [s for k in keys for s in k.seq] == [1, 5, 9]
    assert [t for k in keys for t in k.timestamp_ms] == [1_000_001, 1_000_005, 1_000_009]
