"""What makes the broker unhealthy for the watchdog, and the STATUS line."""

from __future__ import annotations

from mpbroker.systemd import Counters, RateMeter, WorkerBeat, stalled, status_line

STALL_MS = 15_000
STARTUP_MS = 60_000


def titles(beats: list[WorkerBeat], stall_ms: int = STALL_MS) -> list[str]:
    return [s.text() for s in stalled(beats, stall_ms, STARTUP_MS)]


def test_ready_workers_with_fresh_heartbeats_are_healthy() -> None:
    beats = [WorkerBeat("gateway 0", True, 10), WorkerBeat("p2p 0", True, 14_999)]
    assert titles(beats) == []


def test_a_ready_worker_silent_past_the_stall_timeout_is_not() -> None:
    beats = [WorkerBeat("gateway 0", True, 10), WorkerBeat("p2p 0", True, 16_000)]
    assert titles(beats) == ["p2p 0 silent for 16.0 s"]
    # The stall watch switched off (0) leaves heartbeats alone.
    assert titles(beats, stall_ms=0) == []


def test_the_successor_of_a_stalled_worker_is_not_vouched_for_until_ready() -> None:
    restarting = WorkerBeat("p2p 0", False, None, down_ms=200, after_stall=True)
    assert titles([restarting]) == ["p2p 0 restarting after a stall"]
    assert titles([WorkerBeat("p2p 0", True, 5, after_stall=True)]) == []


def test_a_worker_starting_or_restarting_is_healthy_until_the_startup_limit() -> None:
    assert titles([WorkerBeat("p2p 0", False, None, down_ms=59_000)]) == []
    assert titles([WorkerBeat("p2p 0", False, None, down_ms=61_000)]) == [
        "p2p 0 not ready for 61 s"
    ]


def test_rates_count_what_happened_since_the_last_reading() -> None:
    meter = RateMeter()
    meter.update(10.0, {"p2p 0": Counters(0, 100, 90)})
    assert (meter.rate_in, meter.rate_out) == (0.0, 0.0)  # one reading: no rate yet
    meter.update(12.0, {"p2p 0": Counters(0, 300, 290)})
    assert (meter.rate_in, meter.rate_out) == (100.0, 100.0)


def test_a_restarted_worker_counts_from_zero_and_never_makes_a_negative_rate() -> None:
    meter = RateMeter()
    meter.update(0.0, {"p2p 0": Counters(0, 1000, 1000), "pubsub 0": Counters(0, 10, 40)})
    # p2p 0 restarted (incarnation 1): its 50 are new; pubsub 0 went on.
    meter.update(1.0, {"p2p 0": Counters(1, 50, 20), "pubsub 0": Counters(0, 20, 80)})
    assert (meter.rate_in, meter.rate_out) == (60.0, 60.0)
    # A worker that went away counts nothing.
    meter.update(2.0, {"pubsub 0": Counters(0, 20, 80)})
    assert (meter.rate_in, meter.rate_out) == (0.0, 0.0)


def test_the_status_line_reads_as_a_sentence() -> None:
    line = status_line(
        connections=1,
        rate_in=3400.4,
        rate_out=3390,
        memory_used=93 * 2**20,
        max_memory=256 * 2**20,
        memory_level=0,
        workers_ready=5,
        workers=6,
        restarts=2,
        problems=["p2p 0 restarting after a stall"],
    )
    assert line == (
        "1 connection, 3,400 msg/s in, 3,390 msg/s out; memory 93 MiB of 256 MiB (level 0); "
        "5 of 6 workers ready, 2 restarts; p2p 0 restarting after a stall"
    )
    assert "restart" not in status_line(
        connections=0,
        rate_in=0,
        rate_out=0,
        memory_used=0,
        max_memory=1,
        memory_level=0,
        workers_ready=1,
        workers=1,
        restarts=0,
    )
