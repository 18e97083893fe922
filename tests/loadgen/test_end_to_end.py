"""`mpbroker bench` end to end: real processes, a real broker or the baseline server.

Small counts keep these fast; they check that every message arrived and that every process
the bench started is gone afterwards (for the broker: its shared-memory segments too). No
assertion looks at speed.
"""

from __future__ import annotations

import json
import os
import re
import socket
from typing import Any

import pytest

from mpbroker.harness import BrokerProcess, ServerProcess
from mpbroker.loadgen.cpu import listening_server_pid, tree_memory_bytes
from mpbroker.shm import SHM_DIR
from tests.commands import gone, run_module, run_module_json


def _bench(*argv: str) -> tuple[int, str, str]:
    return run_module("mpbroker", "bench", *argv)


def _bench_json(*argv: str) -> tuple[int, dict[str, Any], str]:
    return run_module_json("mpbroker", "bench", "--json", *argv)


def _segments_of(pid: int) -> list[str]:
    prefixes = (f"mpb.{pid}.", f"sem.mpb.{pid}.")
    return sorted(name for name in os.listdir(SHM_DIR) if name.startswith(prefixes))


def _assert_broker_cleaned_up(run: dict[str, Any]) -> None:
    pid = run["server_pid"]
    assert isinstance(pid, int)
    assert gone(pid), f"broker pid {pid} still runs"
    assert _segments_of(pid) == []


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--consumers", "2"], 2000),
        (["--destination", "/topic/bench", "--consumers", "2"], 4000),
        (["--ack", "client", "--prefetch", "100", "--baseline"], 2000),
    ],
    ids=["queue-1-2", "topic-1-2", "queue-client-ack-with-baseline"],
)
def test_against_a_broker_it_starts(argv: list[str], expected: int) -> None:
    code, report, err = _bench_json("--count", "2000", "--gateways", "1", *argv)
    assert code == 0, err
    assert report["ok"]
    if "--baseline" in argv:
        baseline, run = report["runs"]
        assert baseline["server"] == "baseline" and baseline["all_arrived"]
        assert gone(baseline["server_pid"])
        assert set(report["ratios"]["mpbroker"]) == {"sent", "received", "total"}
    else:
        (run,) = report["runs"]
    assert run["server"] == "mpbroker"
    assert run["all_arrived"] and run["ok"], run
    assert (run["sent"], run["received"], run["expected"]) == (2000, expected, expected)
    assert (run["missing"], run["duplicated"]) == (0, 0)
    _assert_broker_cleaned_up(run)


def test_against_the_baseline_server(baseline: ServerProcess) -> None:
    code, out, err = _bench(
        "--port",
        str(baseline.port),
        "--count",
        "2000",
        "--producers",
        "2",
        "--consumers",
        "2",
        "--ack",
        "client-individual",
        "--repeat",
        "2",
    )
    assert code == 0, err
    assert out.count("ok: all 4000 deliveries arrived exactly once") == 2
    assert "recv/s" in out  # the table
    assert "median of 2 runs" in out


def test_an_error_frame_fails_the_run_with_its_message(baseline: ServerProcess) -> None:
    # The baseline's parser refuses frames over 1 MiB with an ERROR frame.
    code, out, err = _bench("--port", str(baseline.port), "--count", "2", "--size", "2000000")
    assert code == 1, out + err
    assert "FAILED" in out
    assert "max_frame_bytes" in out or "exceeds" in out or "too large" in out.lower(), out


def test_a_silent_server_aborts_instead_of_hanging() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        code, out, err = _bench("--port", str(port), "--count", "10", "--timeout", "1")
    assert code == 1, err
    assert "aborted" in out
    assert "CONNECTED" in out  # what it was waiting for


def test_against_a_running_broker_its_cpu_is_found_by_its_port(
    start_broker: type[BrokerProcess],
) -> None:
    """The bench finds the process listening on --port; for mpbroker, whose gateways
    listen, their supervisor, so the CPU per message counts every process of the broker."""
    broker = start_broker("--gateways", "2")
    assert listening_server_pid(broker.port) == broker.pid
    # Enough messages that every busy process uses CPU ticks (10 ms each) during the run.
    code, out, err = _bench("--port", str(broker.port), "--count", "20000", "--json")
    assert code == 0, err
    (run,) = json.loads(out)["runs"]
    assert run["server_pid"] == broker.pid
    assert run["server_cpu_s"] > 0
    # Per delivery, and the memory of every process of the broker once all arrived.
    assert run["server_us_per_delivery"] == pytest.approx(
        run["server_cpu_s"] / run["received"] * 1e6, abs=0.01
    )
    now_mib = (tree_memory_bytes(broker.pid) or 0) / 2**20
    assert run["server_memory_mib"] > 10 and now_mib / 2 < run["server_memory_mib"] < now_mib * 2
    # And by process: the broker's by their roles, adding up (the JSON's keys are sorted).
    by_process = run["server_us_per_delivery_by_process"]
    assert "p2p 0" in by_process and ("gateway 0" in by_process or "gateway 1" in by_process)
    assert sum(by_process.values()) == pytest.approx(run["server_us_per_delivery"], abs=0.1)
    code, out, err = _bench("--port", str(broker.port), "--count", "20000")
    assert code == 0, err
    assert re.search(r"server \S+ CPU-s \(\S+ us/delivery\).*server memory \d+ MiB", out), out
    line = re.search(r"server us/delivery by process: (.*)", out)
    assert line is not None and "p2p 0 " in line[1], out
    # The summary lists them the busiest first.
    figures = [float(part.rsplit(" ", 1)[1]) for part in line[1].split(", ")]
    assert figures == sorted(figures, reverse=True), out
    with socket.create_server(("127.0.0.1", 0)) as listener:  # anyone's listener: itself
        assert listening_server_pid(listener.getsockname()[1]) == os.getpid()
