"""MemWatch's level logic with fake readings."""

from __future__ import annotations

import pytest

from mpbroker.config import MemLevel, MiB, parse_levels
from mpbroker.memory import MemWatch


def watch() -> MemWatch:
    return MemWatch(100 * MiB, parse_levels("50,80", "2000,750"), warn_level=2)


def test_levels_start_at_their_percentages_of_max_memory() -> None:
    w = watch()
    assert [w.level_for(n * MiB) for n in (0, 49, 50, 79, 80, 200)] == [0, 0, 1, 1, 2, 2]
    assert [w.gc_interval_ms(level) for level in (0, 1, 2)] == [0, 2000, 750]


def test_a_warning_entering_the_warn_level_and_a_note_back_at_zero() -> None:
    w = watch()
    assert w.update(60 * MiB) is None  # level 1: no warning
    assert w.update(85 * MiB) == "memory level 2: 85 MiB of max_memory 100 MiB"
    assert w.update(90 * MiB) is None  # still 2
    assert w.update(60 * MiB) is None  # 1
    assert w.update(10 * MiB) == "memory back to level 0: 10 MiB of max_memory 100 MiB"
    assert w.update(60 * MiB) is None and w.update(10 * MiB) is None  # no warning, no note


def test_more_levels_can_be_configured() -> None:
    levels = parse_levels("40,60,90", "5000,1000,100")
    assert levels[2] == MemLevel(90.0, 100)
    w = MemWatch(100 * MiB, levels, warn_level=3)
    assert w.update(95 * MiB) == "memory level 3: 95 MiB of max_memory 100 MiB"


@pytest.mark.parametrize(
    ("percents", "intervals", "why"),
    [
        ("50,80", "2000", "2 level thresholds but 1 gc intervals"),
        ("80,50", "1,1", "rising percentages"),
        ("50,x", "1,1", "comma-separated numbers"),
        ("50,120", "1,1", "at most 100"),
    ],
)
def test_bad_level_settings_say_what_is_wrong(percents: str, intervals: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_levels(percents, intervals)


def test_workers_collect_garbage_as_often_as_the_level_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from mpbroker.config import Config
    from mpbroker.workers import _gc

    clock = [0.0]
    monkeypatch.setattr(_gc.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(_gc.gc, "collect", lambda: 0)
    trims: list[int] = []
    monkeypatch.setattr(_gc, "release_free_heap", lambda: trims.append(1))
    control = SimpleNamespace(memwatch_level=0)
    level_gc = _gc.LevelGC(control, Config())  # type: ignore[arg-type]
    for level, advance in ((0, 10.0), (1, 1.0), (1, 1.0), (2, 0.75), (2, 0.75)):
        control.memwatch_level = level
        clock[0] += advance
        level_gc.tick()
    # Level 0: never; level 1: every 2 s (one of the two 1-s ticks); level 2: every 750 ms.
    assert level_gc.collections == 3
    assert len(trims) == 3  # each collection gives the freed C heap back


def test_releasing_the_free_heap_gives_freed_bodies_back_to_the_system() -> None:
    import psutil

    from mpbroker.workers._gc import release_free_heap

    process = psutil.Process()
    bodies = [bytes(1000) for _ in range(100_000)]  # ~100 MB of malloc'ed blocks
    pinned = bytes(1000)  # allocated last: the heap's top cannot shrink past it
    grown = process.memory_info().rss
    del bodies
    release_free_heap()
    assert process.memory_info().rss < grown - 50 * 2**20
    assert pinned


def test_a_process_counts_its_pss_without_its_shared_memory_mappings() -> None:
    from mpbroker.memory import private_pss_bytes

    rollup = (
        "559fad48f000-7ffc87c22000 ---p 00000000 00:00 0    [rollup]\n"
        "Rss:                9000 kB\nPss:                6000 kB\nPss_Anon:           3000 kB\n"
        "Pss_File:           1000 kB\nPss_Shmem:          2000 kB\nShared_Clean:       100 kB\n"
    )
    assert private_pss_bytes(rollup) == 4000 * 1024
    assert private_pss_bytes("Rss: 10 kB\n") is None
    assert private_pss_bytes("Pss: 10 kB\n") == 10 * 1024  # an old kernel: no Pss_Shmem
