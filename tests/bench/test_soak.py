"""The slow-consumer soak, briefly: flow control engages and nothing is lost.

A 6-second soak (after a 2-second calibration) against a broker the soak starts itself. The
send timeout is short (100 ms) so that held SENDs are also refused, which exercises the
ERROR, reconnect and reconciliation path; no assertion looks at speed or memory.
"""

from __future__ import annotations

import pytest

from tests.commands import run_module_json

pytestmark = pytest.mark.slow


def test_a_short_soak_loses_nothing_and_stops_the_producers() -> None:
    code, summary, err = run_module_json(
        "bench.soak",
        "--minutes",
        "0.1",
        "--calibrate-seconds",
        "2",
        "--send-timeout-ms",
        "100",
        "--json",
    )
    assert code == 0, f"{summary}\n{err}"
    assert summary["ok"] and summary["failures"] == []
    assert summary["lost"] == 0
    assert summary["duplicates"] == 0
    assert summary["delivered_not_accepted"] == 0
    assert summary["unknown"] == 0
    assert summary["sent"] == (summary["accepted"] + summary["refused"] + summary["dropped"])
    assert summary["received"] == summary["accepted"] > 0
    # Flow control engaged and let the producers go again.
    assert summary["flow_stops"] >= 1
    assert summary["flow_starts"] >= 1
    # A held SEND outlived the 100 ms send timeout: refused with an ERROR, and the broker's
    # log says so: the first from an address, then (collapsed, every 10 s) how many more,
    # so by the time the soak reads it at most every refusal is accounted for.
    assert summary["refused"] >= 1
    assert 1 <= summary["refused_sends_logged"] <= summary["refused"]
    assert summary["peak_mib"] > 0
