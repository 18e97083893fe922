"""`mpbroker bench --filters` against a real broker it starts: a tiny grid, every delivery
checked. No assertion looks at speed."""

from __future__ import annotations

import pytest

from tests.commands import gone, run_module_json


@pytest.mark.slow
def test_a_tiny_selector_study_against_a_broker_it_starts() -> None:
    code, report, err = run_module_json(
        "mpbroker",
        "bench",
        "--json",
        "--filters",
        "--gateways",
        "1",
        "--filter-subscribers",
        "1,10",
        "--filter-kinds",
        "simple,or",
        "--filter-components",
        "3",
        "--replication",
        "1,2",
        "--filter-connections",
        "2",
        "--count",
        "300",
    )
    assert code == 0, err
    assert report["ok"], report
    points = report["points"]
    assert [(p["kind"], p["n"], p["r"]) for p in points] == [
        ("simple", 1, 1),
        ("simple", 10, 1),
        ("or", 1, 1),
        ("or", 10, 1),
        ("simple", 10, 2),
        ("or", 10, 2),
    ]
    for point in points:
        (run,) = point["runs"]
        assert run["ok"], run
        assert run["sent"] == 300
        assert run["expected"] == run["received"] == 300 * point["r"]
        assert (run["missing"], run["duplicated"], run["unexpected"]) == (0, 0, 0)
        assert run["server_us_per_message"] is not None and run["messages_per_s"] > 0
    assert {"simple", "or", "all"} <= set(report["fits"]["wall clock"])
    # Two replication grades: t_tx is fitted. (Not on server CPU here: /proc counts CPU in
    # 10 ms ticks, and a point of 300 messages may show none.)
    assert isinstance(report["fits"]["wall clock"]["all"]["t_tx_s"], float)
    assert set(report["fits"]["server CPU"]) == {"simple", "or", "all"}
    assert report["targets"] == []
    pid = err.split("(pid ")[1].split(")")[0]
    assert gone(int(pid))
