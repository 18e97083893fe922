"""bench.destinations: makes queues and topic subscriptions, measures them, reports the
refusals past broker.max_destinations, then leaves nothing (figures are measured, never
asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.commands import run_module_json

pytestmark = pytest.mark.slow


def test_destinations_are_made_and_refused_past_the_limit(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("[broker]\nmax_destinations = 300\n")
    code, result, err = run_module_json(
        "bench.destinations",
        "--queues",
        "260",
        "--topics",
        "60",
        "--config",
        str(config),
        "--give-up-after",
        "5",
        "--json",
    )
    assert code == 0, err
    assert result["ok"] and result["left_behind"] == []
    queues, topics = result["steps"]["queues"], result["steps"]["topic subscriptions"]
    # 40 warm-up destinations (20 queues, 20 topics), then 260 queues: all of them fit.
    assert (queues["created"], queues["refused"]) == (260, 0)
    # Then the topics: none fits, and the step gives up after 5 refusals in a row.
    assert (topics["created"], topics["refused"]) == (0, 5)
    assert topics["errors"] == {
        "ResourceAllocation: <destination> broker.max_destinations 300 reached": 5
    }
    assert topics["first_refused"] == "/topic/dest-0"
    for step in (queues, topics):
        assert step["pss"]["total"] > 0 and step["pss"]["/dev/shm"] > 0
        assert "p2p 0" in step["delta"]
    status = result["status"]["destinations"]
    assert (status["count"], status["max_destinations"]) == (300, 300)
    assert status["refused"] >= 5
    assert result["peak_pss"] > 0
