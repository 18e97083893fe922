"""bench.compare: two versions of the broker in turns, under the same load generator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.compare import Sample, table

CHECKOUT = Path(__file__).resolve().parents[2]
COMPARE = (sys.executable, "-m", "bench.compare")


def test_the_table_shows_medians_and_the_after_over_before_ratios() -> None:
    before, after = Sample(), Sample()
    for rate, cpu in ((100_000, 14.0), (90_000, 15.0), (110_000, 13.0)):
        before.add({"ok": True, "received_per_s": rate, "server_us_per_delivery": cpu})
    for rate, cpu in ((120_000, 10.5), (130_000, 10.0)):
        after.add(
            {
                "ok": True,
                "received_per_s": rate,
                "server_us_per_delivery": cpu,
                "server_memory_mib": 108.0,
            }
        )
    after.add({"ok": False, "aborted": "no message received for 30 s"})
    text = table({"queue": {"old": before, "new": after}}, ("old", "new"))
    assert "| queue | old | 100,000 | 14.00 | - | 3 |" in text
    assert "| queue | new | 125,000 | 10.25 | 108 | 2 (1 failed) |" in text
    assert "| queue | after/before | x1.25 | x0.73 | - | |" in text
    assert after.failures == ["no message received for 30 s"]


@pytest.mark.slow
def test_it_runs_a_revision_against_this_checkout() -> None:
    """HEAD and the working tree (which may differ), one short queue run each."""
    result = subprocess.run(
        [*COMPARE, "--before", "HEAD", "--rounds", "1", "--scenario", "queue", "--count", "3000"],
        cwd=CHECKOUT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(CHECKOUT)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| queue | HEAD |" in result.stdout
    assert "| queue | . |" in result.stdout
    assert "| queue | after/before | x" in result.stdout


def test_unknown_scenarios_and_flavours_are_refused() -> None:
    def compare(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*COMPARE, *argv],
            cwd=CHECKOUT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    refused = compare("--before", "HEAD", "--scenario", "queue,fanout")
    assert refused.returncode == 2 and "unknown scenario 'fanout'" in refused.stderr
    refused = compare("--before", "HEAD", "--after", "HEAD")
    assert refused.returncode == 2 and "name the same version" in refused.stderr
    refused = compare("--before", "HEAD+fast", "--scenario", "queue", "--count", "10")
    assert refused.returncode != 0 and "unknown flavour 'fast'" in refused.stderr
