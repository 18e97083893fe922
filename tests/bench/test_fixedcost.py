"""bench.fixedcost: measures every process of an idle default broker, then leaves nothing.

No assertion looks at the figures themselves (they are measured, never asserted), only at
which processes were measured and that the broker is gone afterwards.
"""

from __future__ import annotations

import os

import pytest

from mpbroker.shm import SHM_DIR
from tests.commands import gone, run_module_json

pytestmark = pytest.mark.slow


def test_fixedcost_measures_each_broker_process_and_leaves_nothing() -> None:
    code, summary, err = run_module_json(
        "bench.fixedcost",
        "--json",
        "--gateways",
        "2",
        "--samples",
        "2",
        "--settle",
        "0.5",
    )
    assert code == 0, f"{summary}\n{err}"
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
