"""The memory soak, briefly: queues and topics reconcile and the report has its figures.

A 6-second soak (after a 2-second calibration) of 2 producers on 2 queues and 2 topics, with
2 consumer processes, against a default-config broker the soak starts itself. Nothing here
looks at speed; memory is only checked to be reported (and to decide the exit status).
"""

from __future__ import annotations

import pytest

from bench.memsoak import consumer_groups, destinations
from tests.commands import run_module_json

pytestmark = pytest.mark.slow


def test_destinations_are_spread_over_the_consumers() -> None:
    names = destinations(3, 2)
    assert names == (
        "/queue/memsoak-0",
        "/queue/memsoak-1",
        "/queue/memsoak-2",
        "/topic/memsoak-0",
        "/topic/memsoak-1",
    )
    assert consumer_groups(len(names), 2) == ((0, 2, 4), (1, 3))
    # Never a consumer without a destination.
    assert consumer_groups(1, 2) == ((0,),)


def test_a_short_memory_soak_reconciles_queues_and_topics() -> None:
    code, summary, err = run_module_json(
        "bench.memsoak",
        "--minutes",
        "0.1",
        "--calibrate-seconds",
        "2",
        "--producers",
        "2",
        "--queues",
        "2",
        "--topics",
        "2",
        "--consumers",
        "2",
        "--size",
        "200",
        "--json",
    )
    assert code == (0 if summary["ok"] else 1), f"{summary}\n{err}"
    assert summary["failures"] == []

    # Every accepted message arrived exactly once: queue messages at their queue, topic
    # messages at their topic's subscriber.
    assert summary["lossless"]
    assert set(summary["by_kind"]) == {"queue", "topic"}
    for kind in summary["by_kind"].values():
        assert kind["accepted"] > 0
        assert kind["lost"] == kind["duplicates"] == 0
        assert kind["delivered_not_accepted"] == kind["unknown_delivered"] == 0
        assert kind["unknown"] == 0
        assert kind["sent"] == kind["accepted"] + kind["refused"] + kind["dropped"]
    assert summary["received"] == summary["accepted"]
    assert summary["misrouted"] == summary["foreign"] == 0

    # Memory: the summed PSS against the default max_memory, MemWatch from the admin API.
    assert summary["max_memory_mib"] == 256
    assert summary["peak_mib"] > summary["idle_mib"] > 0
    assert summary["peak_parts_mib"]
    assert summary["memwatch"]["published"]
    assert summary["memwatch"]["max_level"] is not None
    assert summary["status_polls"] > 0
    for key in ("paging_s", "peak_usage_mib", "peak_messages", "paging_starts_logged"):
        assert key in summary["temp_store"]
    throughput = summary["throughput"]
    assert throughput["first_minute_rate"] > 0
    assert {"paging_or_throttled_rate", "ratio"} <= set(throughput)
    # How often flow control stops the producers depends on the machine's speed (none is
    # fine); a release only ever follows a stop.
    assert summary["flow_starts"] <= summary["flow_stops"]
