"""kill -9 of a writer at random moments: reopening shows exactly the committed batches."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time
from collections import defaultdict
from pathlib import Path

import pytest

from mpbroker.config import StoreSettings
from mpbroker.stores import MessageStore

from . import _crash_child
from ._crash_child import BATCH

ROUNDS = 6


def _read_log(path: Path) -> tuple[bool, list[tuple[str, int]]]:
    text = path.read_text() if path.exists() else ""
    lines = text.split("\n")[:-1]  # a line cut by the kill has no newline: not reported
    ready = "ready" in lines
    events = [(kind, int(n)) for kind, n in (ln.split() for ln in lines if ln != "ready")]
    return ready, events


@pytest.mark.parametrize("synchronous", ["normal", "full"])
def test_sigkill_during_appends_keeps_exactly_the_committed_batches(
    tmp_path: Path, synchronous: str
) -> None:
    rng = random.Random(1234)
    ctx = mp.get_context("spawn")
    store_dir = tmp_path / "store"
    expected_live: set[int] = set()  # batches the model says are stored and unsettled
    next_batch = 0
    killed_mid_work = 0
    active_index = 0
    for round_no in range(ROUNDS):
        log = tmp_path / f"log-{round_no}"
        child = ctx.Process(
            target=_crash_child.run, args=(str(store_dir), str(log), next_batch, synchronous)
        )
        child.start()
        deadline = time.monotonic() + 30
        while not _read_log(log)[0]:
            assert child.is_alive() and time.monotonic() < deadline, "child did not start"
            time.sleep(0.005)
        time.sleep(rng.uniform(0.02, 0.25))
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL
        _, events = _read_log(log)
        appended = {n for kind, n in events if kind == "A"}
        settled = {n for kind, n in events if kind == "S"}
        killed_mid_work += bool(appended)

        with MessageStore.open(store_dir, StoreSettings(synchronous=synchronous)) as store:
            live = store.live()
            by_batch: dict[int, list[int]] = defaultdict(list)
            for sm in live:
                by_batch[int(sm.message.headers["batch"])].append(sm.seq)
                assert sm.message.message_id.startswith(f"b{sm.message.headers['batch']}-")
            observed = set(by_batch)
            # Every batch is all-or-nothing: a transaction was never half-applied.
            for batch, seqs in by_batch.items():
                assert len(seqs) == BATCH, (batch, seqs)
                assert sorted(seqs) == list(range(min(seqs), min(seqs) + BATCH))
            # A settle that returned is never undone.
            assert not (observed & settled)
            # At most one batch was committed without its append being reported.
            unreported = observed - expected_live - appended
            last = max(appended, default=next_batch - 1)
            assert unreported <= {last + 1}, (unreported, last)
            # Every append that returned is still there, except that the one settle in flight
            # when the kill came may have committed: the child settles the oldest batch first.
            should_be_live = (expected_live | appended) - settled
            vanished = should_be_live - observed
            assert vanished <= {min(should_be_live, default=-1)}, (vanished, should_be_live)
            # Delivery order still holds after the crash.
            keys = [(-sm.message.priority, sm.seq) for sm in live]
            assert keys == sorted(keys)
            segments = store.segments()
            assert all(s.sealed for s in segments[:-1])
            assert not segments[-1].sealed
            active_index = segments[-1].index
        expected_live = observed
        next_batch = max(observed | appended | settled, default=next_batch) + 2
    assert killed_mid_work >= ROUNDS - 1  # the kills hit a busy writer, not an idle one
    # Segments rolled and were retired all along, so kills also landed in rolls and retirements.
    assert active_index > 2 * ROUNDS, active_index
    print(f"{synchronous}: active segment {active_index} after {next_batch} batches")
