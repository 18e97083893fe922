"""bench.fixedcost: measures every process of an idle default broker, then leaves nothing.

No assertion looks at the figures themselves (they are measured, never asserted), only at
which processes were measured and that the broker is gone afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from mpbroker.shm import SHM_DIR

from .conftest import gone

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 120


def test_fixedcost_measures_each_broker_process_and_leaves_nothing() -> None:
    # A session of its own: if it hangs, killing the group also ends the broker.
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.fixedcost",
            "--json",
            "--gateways",
            "2",
            "--samples",
            "2",
            "--settle",
            "0.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"bench.fixedcost did not finish within {RUN_TIMEOUT_S} s:\n{out}\n{err}")
    lines = out.strip().splitlines()
    assert lines, f"no output; stderr:\n{err}"
    summary = json.loads(lines[-1])
    assert process.returncode == 0, f"{summary}\n{err}"
    assert summary["ok"] and summary["left_behind"] == [] and summary["stop_status"] == 0
    titles = sorted(p["title"] for p in summary["processes"])
    assert titles == [
        "forkserver",
        "gateway 0",
        "gateway 1",
        "p2p 0",
        "pubsub 0",
        "replay 0",
        "supervisor",
    ]
    assert summary["by_role_pss_mib"]["gateway"]["count"] == 2
    assert all(p["pss"] > 0 and p["uss"] > 0 and p["rss"] >= p["uss"] for p in summary["processes"])
    assert summary["total_pss"] > 0
    assert summary["shm_entries"] > 0 and summary["shm_bytes"] > 0
    supervisor = next(p["pid"] for p in summary["processes"] if p["title"] == "supervisor")
    assert all(gone(p["pid"]) for p in summary["processes"])
    assert not [n for n in os.listdir(SHM_DIR) if n.startswith(f"mpb.{supervisor}.")]
