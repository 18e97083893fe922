"""The text views of the admin API."""

from __future__ import annotations

from mpbroker.admin import render_status


def worker(title: str, **stats: object) -> dict[str, object]:
    return {
        "title": title,
        "state": "ready",
        "pid": 10,
        "incarnation": 0,
        "heartbeat_age_ms": 5,
        "stats": stats,
    }


def test_status_shows_memory_and_each_pipelines_temp_store() -> None:
    temp = {
        "paging": True,
        "messages": 1200,
        "bytes": 3 * 2**20,
        "usage_bytes": 8 * 2**20,
        "limit_bytes": 1024 * 2**20,
        "full": False,
        "segments": 1,
        "paged_out": 1500,
        "paged_in": 300,
    }
    data = {
        "workers": [worker("gateway 0", connections=3), worker("p2p 0", temp_store=temp)],
        "memory": {"level": 2, "used_bytes": 210 * 2**20, "max_memory": 256 * 2**20, "percent": 82},
    }
    text = render_status(data)
    assert text.startswith("memory: level 2, 210 MiB of max_memory 256 MiB (82 %)")
    [line] = [row for row in text.splitlines() if "8/1024" in row]
    assert line.split() == ["p2p", "0", "yes", "1200", "3.0", "8/1024", "no"]


def test_status_without_temp_stores_shows_only_the_workers() -> None:
    text = render_status({"workers": [worker("gateway 0", connections=1)]})
    assert "temp store" not in text
