"""`mpbroker export --max-memory`: the export's memory stays under the bound whatever the
size of the stores (it reads them in batches and looks up outcomes by seq range), measured
from outside on a real `mpbroker export` process; a bound it cannot keep is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.exportrate import fill_stores, process_memory

pytestmark = pytest.mark.slow

MiB = 1 << 20


def mpbroker(*argv: str) -> list[str]:
    return [sys.executable, "-m", "mpbroker", *argv]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """150,000 persistent messages (several segments, some archived, outcomes of every
    kind): a dozen times what a batch holds."""
    path = tmp_path_factory.mktemp("memory") / "data"
    fill_stores(path, 150_000, 200, 10, 0.2)
    return path


@pytest.mark.parametrize("bound", [64, 128])
def test_the_export_stays_under_its_memory_bound(data: Path, tmp_path: Path, bound: int) -> None:
    out = tmp_path / "out"
    run = process_memory(
        mpbroker(
            "export", "--data-dir", str(data), "--out", str(out), "--max-memory", f"{bound}MiB"
        )
    )
    assert run.code == 0, run.stderr
    peak = run.peak_anonymous
    assert peak < bound * MiB, f"peak {peak / MiB:.1f} MiB over the bound of {bound} MiB"
    assert sum(1 for _ in out.rglob("*.parquet")) > 1


@pytest.mark.parametrize(
    ("value", "message"),
    [("1MiB", "--max-memory: 1 MiB is too small"), ("lots", "--max-memory 'lots': not a size")],
)
def test_a_bound_it_cannot_keep_is_refused_in_one_line(
    data: Path, tmp_path: Path, value: str, message: str
) -> None:
    out = tmp_path / "out"
    run = subprocess.run(
        mpbroker("export", "--data-dir", str(data), "--out", str(out), "--max-memory", value),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert message in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    assert not out.exists()
