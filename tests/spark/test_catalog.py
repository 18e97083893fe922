"""`--table NAME`: the ingest registers its table in Spark's catalog (its defaults: the
Hive-compatible one, metastore_db and spark-warehouse in the working directory), so that a
later session with the same catalog settings, in another process, queries every row by name,
outcomes found later included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpbroker.export import Options, export
from tests.spark.test_ingest import make_export, settle_some

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

QUERY = """
import json, sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .enableHiveSupport().getOrCreate())
rows = spark.sql(
    "SELECT destination, outcome, count(*) AS n FROM mpbroker_messages GROUP BY 1, 2"
).collect()
props = {r["key"]: r["value"] for r in spark.sql("SHOW TBLPROPERTIES mpbroker_messages").collect()}
print(json.dumps({"counts": {f"{r['destination']} {r['outcome']}": r["n"] for r in rows},
                  "schema_version": props.get("mpbroker.table.schema_version")}))
spark.stop()
"""


def run(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv],
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
    )


def query(cwd: Path) -> dict[str, object]:
    done = run(cwd, "-c", QUERY)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_table_is_queried_by_name_from_a_fresh_session(tmp_path: Path) -> None:
    out = make_export(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    job = ["-m", "spark.ingest", "--input", str(out), "--output", "table", "--master", "local[2]"]
    first = run(work, *job, "--table", "mpbroker_messages")
    assert first.returncode == 0, first.stderr[-3000:]
    assert (work / "metastore_db").is_dir()
    found = query(work)
    assert found["schema_version"] == "2"
    assert found["counts"] == {
        "/queue/a acked": 20,
        "/queue/a pending": 20,
        "/queue/b expired": 40,
        "/topic/t acked": 8,
        "/topic/t pending": 32,
    }

    # Outcomes found later, applied by the next ingest, are what the catalog's table shows.
    settle_some(tmp_path)
    export(tmp_path / "data", out, Options())
    second = run(work, *job, "--table", "mpbroker_messages")
    assert second.returncode == 0, second.stderr[-3000:]
    assert query(work)["counts"] == {
        "/queue/a acked": 27,
        "/queue/a pending": 13,
        "/queue/b expired": 40,
        "/topic/t acked": 13,
        "/topic/t pending": 27,
    }

    # A name the catalog holds over another place is refused, naming both.
    other = run(work, *job[:5], "other-table", *job[6:], "--table", "mpbroker_messages")
    assert other.returncode == 2
    assert "a table of that name exists over" in other.stderr
    assert not (work / "other-table").exists()  # refused before anything was written
    bad = run(work, *job, "--table", "no such name")
    assert bad.returncode == 2 and "--table 'no such name'" in bad.stderr
