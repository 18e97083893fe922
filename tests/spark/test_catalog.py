"""`--table NAME`: the ingest registers its table in Spark's catalog (its defaults: the
Hive-compatible one, metastore_db and spark-warehouse in the working directory), so that a
later session with the same catalog settings, in another process, queries every row by name:
a partition a later ingest added and outcomes it applied included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpbroker.export import Options, export
from tests.export.test_export_stores import message
from tests.spark.test_ingest import make_export, settle_some, stores

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

# A later session, in a process of its own: what the catalog shows, and that a second table
# of the name over another place is refused (before anything is written there).
LATER_SESSION = """
import json, sys
from pyspark.sql import SparkSession
from spark.ingest import IngestError, ingest
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .enableHiveSupport().getOrCreate())
rows = spark.sql(
    "SELECT destination, outcome, count(*) AS n FROM mpbroker_messages GROUP BY 1, 2"
).collect()
props = {r["key"]: r["value"] for r in spark.sql("SHOW TBLPROPERTIES mpbroker_messages").collect()}
try:
    ingest(spark, sys.argv[1], "other-table", table="mpbroker_messages")
    refused = ""
except IngestError as exc:
    refused = str(exc)
print(json.dumps({"counts": {f"{r['destination']} {r['outcome']}": r["n"] for r in rows},
                  "schema_version": props.get("mpbroker.table.schema_version"),
                  "refused": refused}))
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


def test_the_table_is_queried_by_name_from_a_fresh_session(tmp_path: Path) -> None:
    out = make_export(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    job = ["-m", "spark.ingest", "--input", str(out), "--output", "table", "--master", "local[2]"]
    bad = run(work, *job, "--table", "no such name")
    assert bad.returncode == 2 and "--table 'no such name'" in bad.stderr
    first = run(work, *job, "--table", "mpbroker_messages")
    assert first.returncode == 0, first.stderr[-3000:]
    assert (work / "metastore_db").is_dir()

    # Then: outcomes found later, and a destination new to the table (a new partition).
    settle_some(tmp_path)
    with stores(tmp_path) as (queues, _):
        queues.append([message(1, "/queue/new")])
    export(tmp_path / "data", out, Options())
    second = run(work, *job, "--table", "mpbroker_messages")
    assert second.returncode == 0, second.stderr[-3000:]

    later = run(work, "-c", LATER_SESSION, str(out))
    assert later.returncode == 0, later.stderr[-3000:]
    found = json.loads(later.stdout.strip().splitlines()[-1])
    assert found["schema_version"] == "2"
    assert found["counts"] == {
        "/queue/a acked": 27,
        "/queue/a pending": 13,
        "/queue/b expired": 40,
        "/queue/new pending": 1,
        "/topic/t acked": 13,
        "/topic/t pending": 27,
    }
    assert "a table of that name exists over" in found["refused"]
    assert not (work / "other-table").exists()
