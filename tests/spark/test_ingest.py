"""The Spark ingest job in local mode over an export of real store files (no broker
process): exact counts per destination and outcome, re-runs add nothing, a killed run is
finished by the next, refusals."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from mpbroker.export import Options, export
from mpbroker.stores import MessageStore, TopicStore
from spark import ingest as ingest_module
from spark.ingest import IngestError, ingest, main
from spark.tablefs import TableFS
from tests.export.test_export_stores import SETTINGS, fill, garble
from tests.spark.conftest import PY4J_SOCKETS

pytestmark = [pytest.mark.slow, PY4J_SOCKETS]


@contextlib.contextmanager
def stores(tmp_path: Path) -> Iterator[tuple[MessageStore, TopicStore]]:
    """The data directory's queue and topic stores, open (made the first time)."""
    data = tmp_path / "data"
    queues = MessageStore.open(data / "p2p-0", SETTINGS)
    topics = TopicStore(data / "pubsub-0", data / "pubsub-0-durable.db", SETTINGS)
    try:
        topics.recover(0)
        yield queues, topics
    finally:
        queues.close()
        topics.close()


def make_export(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    with stores(tmp_path) as (queues, topics):
        topics.subscribe("s1", "/topic/t")
        for start in range(0, 40, 10):
            fill(queues, topics, start, 10)
        queues.settle(queues.expired(10, 1000), "expired", 3_000_000)
        queues.record_delivery(queues.live_seqs()[:3])
    out = tmp_path / "export"
    export(data, out, Options())
    return out


EXPECTED = {
    ("/queue/a", "acked"): 20,
    ("/queue/a", "pending"): 20,
    ("/queue/b", "expired"): 40,
    ("/topic/t", "acked"): 4 * (10 // 4),
    ("/topic/t", "pending"): 40 - 4 * (10 // 4),
}


def table_counts(spark: SparkSession, table: Path) -> Counter[tuple[str, str]]:
    rows = spark.read.parquet(str(table)).groupBy("destination", "outcome").count().collect()
    return Counter({(r["destination"], r["outcome"]): int(r["count"]) for r in rows})


def read_report(table: Path, name: str) -> list[dict[str, str]]:
    (part,) = (table / "_reports" / name).glob("part-*.csv")
    with open(part, newline="") as fh:
        return list(csv.DictReader(fh))


def report_parts(table: Path) -> set[str]:
    return {p.name for p in (table / "_reports").rglob("part-*.csv")}


def table_files(table: Path) -> list[Path]:
    return [
        p
        for p in table.rglob("*.parquet")
        if not any(part.startswith(("_", ".")) for part in p.relative_to(table).parts)
    ]


def test_ingest_counts_types_reports_and_rerun(spark: SparkSession, tmp_path: Path) -> None:
    out = make_export(tmp_path)
    table = tmp_path / "table"

    first = ingest(spark, out, table)
    assert (first.rows_read, first.rows_appended, first.rows_in_table) == (120, 120, 120)
    assert first.table_version == 1
    assert table_counts(spark, table) == EXPECTED
    # Partitioned by destination and (UTC) day.
    parts = {p.relative_to(table).parts[:2] for p in table_files(table)}
    assert ("destination=%2Fqueue%2Fa", "day=1970-01-01") in parts
    assert "body" not in spark.read.parquet(str(table)).columns

    # Typed: timestamps in microseconds, UTC (not INT96); required columns not null; the
    # schema version in the table's metadata and in every column's.
    schema = pq.read_schema(table_files(table)[0])
    assert schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert schema.field("settled_at").type == pa.timestamp("us", tz="UTC")
    required = {f.name for f in schema if not f.nullable}
    assert required >= {"message_id", "timestamp", "outcome", "seq", "store", "headers"}
    assert {f.name for f in schema if f.nullable} == {
        "expires",
        "settled_at",
        "pending_subscriptions",
    }
    assert b'"mpbroker.table.schema_version":2' in schema.metadata[
        b"org.apache.spark.sql.parquet.row.metadata"
    ].replace(b" ", b"")
    state = max((table / "_mpbroker_table").glob("state-*.json"))
    assert state.name == "state-00000001.json"
    assert json.loads(state.read_text())["schema_version"] == 2

    outcomes = {r["destination"]: r for r in read_report(table, "outcomes")}
    assert outcomes["/queue/b"]["expired"] == "40"
    assert outcomes["/queue/a"]["acked"] == "20"
    assert sum(int(r["redelivered_messages"]) for r in outcomes.values()) == 3
    per_minute = read_report(table, "per_minute")
    assert sum(int(r["messages"]) for r in per_minute) == 120
    queue_a = [r for r in per_minute if r["destination"] == "/queue/a"]
    # Acked at 2_000_000 ms, sent at 1_000_000 + i for i in 0..39: latency just under 1000 s.
    assert all(990_000 <= int(r["latency_p50_ms"]) <= 1_000_000 for r in queue_a)
    queue_b = [r for r in per_minute if r["destination"] == "/queue/b"]
    assert all(r["latency_p50_ms"] == "" for r in queue_b)  # none acked: no latency
    report_parts_before = report_parts(table)
    sizes = read_report(table, "sizes")
    assert sum(int(r["messages"]) for r in sizes) == 120
    assert {r["size_bucket"] for r in sizes} == {"<1024"}

    again = ingest(spark, out, table)  # every file ingested before: none is read
    assert (again.files, again.files_read, again.rows_read) == (first.files, 0, 0)
    assert (again.rows_appended, again.rows_in_table, again.table_version) == (0, 120, 1)
    assert table_counts(spark, table) == EXPECTED
    # The same table: its reports are not written again (Spark names each part file anew).
    assert report_parts(table) == report_parts_before

    # Told to read every file again, it does, and the anti-join adds nothing: the table's
    # version, state and reports stay as they are.
    again = ingest(spark, out, table, reread=True)
    assert (again.files_read, again.rows_read, again.rows_appended) == (first.files, 120, 0)
    assert again.table_version == 1
    assert table_counts(spark, table) == EXPECTED
    assert report_parts(table) == report_parts_before
    assert not (table / "_mpbroker_table" / "state-00000002.json").exists()

    # Reports of another version of the table (a run killed before it swapped in its new
    # reports) are recomputed, though nothing new is appended.
    (table / "_reports" / "_table_version").write_text("0\n")
    ingest(spark, out, table)
    assert report_parts(table).isdisjoint(report_parts_before)
    assert (table / "_reports" / "_table_version").read_text().strip() == str(again.table_version)


def settle_some(tmp_path: Path) -> None:
    """Since the export: seven waiting /queue/a messages acked, five of the topic's too."""
    with stores(tmp_path) as (queues, topics):
        queues.settle(queues.live_seqs()[:7], "acked", 9_000_000)  # all /queue/a's
        topics.ack([("s1", s) for s in topics.messages.live_seqs()[:5]], "acked", 9_000_001)


UPDATED = {
    ("/queue/a", "acked"): 20 + 7,
    ("/queue/a", "pending"): 20 - 7,
    ("/queue/b", "expired"): 40,
    ("/topic/t", "acked"): 4 * (10 // 4) + 5,
    ("/topic/t", "pending"): 40 - 4 * (10 // 4) - 5,
}


def test_outcomes_found_later_are_applied_to_the_table(spark: SparkSession, tmp_path: Path) -> None:
    out = make_export(tmp_path)
    table = tmp_path / "table"
    ingest(spark, out, table)
    untouched = {p.name for p in (table / "destination=%2Fqueue%2Fb").rglob("*.parquet")}
    settle_some(tmp_path)
    assert export(tmp_path / "data", out, Options()).outcomes_found == {"acked": 12}

    summary = ingest(spark, out, table)
    assert (summary.update_files_read, summary.outcomes_updated) == (3, 12)  # 2 + 1 row files
    assert summary.rows_appended == 0 and summary.table_version == 2
    assert summary.updates_without_row == 0
    assert table_counts(spark, table) == UPDATED
    # The export directory reads as a dataset: its row files, not _updates/ or the manifest.
    assert spark.read.option("recursiveFileLookup", "true").parquet(str(out)).count() == 120
    # Only the partitions holding settled rows were rewritten.
    assert {p.name for p in (table / "destination=%2Fqueue%2Fb").rglob("*.parquet")} == untouched
    assert not (table / "_staging").exists() and not (table / "_mpbroker_table/swap.json").exists()
    acked = spark.read.parquet(str(table)).where("outcome = 'acked' AND kind = 'topic'")
    assert acked.where("pending_subscriptions != 0 OR settled_at IS NULL").count() == 0
    outcomes = {r["destination"]: r for r in read_report(table, "outcomes")}
    assert outcomes["/queue/a"]["acked"] == "27" and outcomes["/topic/t"]["pending"] == "27"

    # Again, and with every file read again: nothing changes.
    for reread in (False, True):
        again = ingest(spark, out, table, reread=reread)
        assert again.rows_appended == 0
        assert again.partitions_rewritten == 0
        assert table_counts(spark, table) == UPDATED

    # Every file read again while new outcomes came for /queue/a alone: the topic's rows are
    # named by update files too (settled before), but only /queue/a's partition is rewritten.
    topic_files = {p.name for p in (table / "destination=%2Ftopic%2Ft").rglob("*.parquet")}
    with stores(tmp_path) as (queues, _):
        queues.settle(queues.live_seqs(), "acked", 9_500_000)
    export(tmp_path / "data", out, Options())
    last = ingest(spark, out, table, reread=True)
    assert (last.outcomes_updated, last.partitions_rewritten) == (13, 1)
    assert {p.name for p in (table / "destination=%2Ftopic%2Ft").rglob("*.parquet")} == topic_files
    assert table_counts(spark, table)[("/queue/a", "acked")] == 40


def test_a_swap_cut_short_is_finished_by_the_next_run(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed between moving one partition out of the table and the staged one in: the
    journal has the next run finish the swap before it does anything else."""
    out = make_export(tmp_path)
    table = tmp_path / "table"
    ingest(spark, out, table)
    settle_some(tmp_path)
    export(tmp_path / "data", out, Options())

    real_rename = TableFS.rename
    moves: list[str] = []

    def rename_then_die(self: TableFS, source: str, target: str) -> None:
        real_rename(self, source, target)
        moves.append(source)
        if len(moves) == 3:  # partition 1 out and in, partition 2 out
            raise KeyboardInterrupt("killed")

    monkeypatch.setattr(TableFS, "rename", rename_then_die)
    with pytest.raises(KeyboardInterrupt):
        ingest(spark, out, table)
    monkeypatch.undo()
    assert (table / "_mpbroker_table" / "swap.json").exists()

    summary = ingest(spark, out, table)
    assert str(table / "_mpbroker_table" / "swap.json") in " ".join(summary.leftovers_removed)
    assert table_counts(spark, table) == UPDATED
    assert not (table / "_staging").exists()


def test_uris_and_relative_paths_reach_the_same_table(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """file:// URIs, then relative paths from another working directory: every table file
    (lock, state, reports) is where the table is, and the second run adds nothing."""
    out = make_export(tmp_path)
    table = tmp_path / "tables" / "t"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    first = ingest(spark, out.as_uri(), table.as_uri())
    assert first.rows_appended == 120
    assert (table / "_ingest.lock").exists() and (table / "_mpbroker_table").is_dir()
    assert list(elsewhere.iterdir()) == []  # no ./file:/... left in the working directory

    monkeypatch.chdir(tmp_path / "tables")
    again = ingest(spark, os.path.relpath(out), "t")
    assert (again.files_read, again.rows_appended, again.rows_in_table) == (0, 0, 120)
    assert table_counts(spark, table) == EXPECTED


@pytest.mark.parametrize(
    ("output", "named"),
    [("s3a://bucket/table", "s3a://"), ("gs://bucket/table", "gs://"), ("foo://x/t", "foo://")],
)
def test_an_output_that_cannot_hold_the_table_is_refused_naming_its_scheme(
    spark: SparkSession, tmp_path: Path, output: str, named: str
) -> None:
    out = make_export(tmp_path)
    with pytest.raises(IngestError, match="cannot hold the table") as info:
        ingest(spark, out, output)
    assert named in str(info.value)


def test_a_table_of_the_earlier_version_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    out = make_export(tmp_path)
    table = tmp_path / "table"
    old = table / "destination=%2Fqueue%2Fa" / "day=1970-01-01"
    old.mkdir(parents=True)
    pq.write_table(pa.table({"seq": [1]}), old / "part-0.parquet")
    with pytest.raises(IngestError, match="earlier version of this job"):
        ingest(spark, out, table)


def test_an_incremental_export_is_ingested_incrementally(
    spark: SparkSession, tmp_path: Path
) -> None:
    out = make_export(tmp_path)
    table = tmp_path / "table"
    first = ingest(spark, out, table)
    with stores(tmp_path) as (queues, topics):
        fill(queues, topics, 100, 4)  # 12 more rows, in the active segments
    added = export(tmp_path / "data", out, Options())
    assert added.rows == 12

    second = ingest(spark, out, table)
    # Only the new files are read: the export directory's history is not read again.
    assert second.files == first.files + added.files_written
    assert second.files_read == added.files_written
    assert (second.rows_read, second.rows_appended, second.rows_in_table) == (12, 12, 132)
    assert sum(table_counts(spark, table).values()) == 132


def test_an_input_that_overlaps_itself_is_ingested_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    out = make_export(tmp_path)
    both = tmp_path / "both"  # two exports of one data directory under one --input
    shutil.copytree(out, both / "first")
    shutil.copytree(out, both / "second")
    summary = ingest(spark, both, tmp_path / "table")
    assert (summary.rows_read, summary.rows_appended, summary.rows_in_table) == (120, 120, 120)
    assert table_counts(spark, tmp_path / "table") == EXPECTED


def test_foreign_file_is_refused_naming_it(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "export"
    out.mkdir()
    foreign = out / "other.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), foreign)
    table = tmp_path / "table"
    assert main(["--input", str(out), "--output", str(table)]) == 2
    err = capsys.readouterr().err
    assert str(foreign) in err
    assert "foreign" in err
    assert not any(table.rglob("*.parquet"))


def test_damaged_footer_and_unknown_version_are_refused(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = make_export(tmp_path)
    table = tmp_path / "table"
    good = sorted(out.rglob("*.parquet"))[0]
    newer = good.with_name("newer.parquet")
    t = pq.read_table(good)
    pq.write_table(t.replace_schema_metadata({b"mpbroker.export.schema_version": b"99"}), newer)
    assert main(["--input", str(out), "--output", str(table)]) == 2
    err = capsys.readouterr().err
    assert "newer.parquet" in err and "'99'" in err
    newer.unlink()
    damaged = good.with_name("damaged.parquet")
    damaged.write_bytes(good.read_bytes()[:-100])
    assert main(["--input", str(out), "--output", str(table)]) == 2
    err = capsys.readouterr().err
    assert "damaged.parquet" in err and "damaged or not a Parquet file" in err
    assert len(err.strip().splitlines()) == 1
    assert not table_files(table)


def test_a_file_damaged_inside_a_data_page_is_named_and_nothing_is_written(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its footer is intact, so only reading its pages finds the damage: the job's write is
    aborted and the file named in one line, exit 2."""
    out = make_export(tmp_path)
    table = tmp_path / "table"
    victim = max((p for p in out.rglob("*.parquet")), key=lambda p: p.stat().st_size)
    garble(victim, "message_id")
    pq.read_schema(victim)  # the footer still reads

    assert main(["--input", str(out), "--output", str(table)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert victim.name in err and "damaged: Spark could not read it" in err
    assert not table_files(table)
    assert not (table / "_mpbroker_table").exists()


def test_a_first_run_killed_before_it_recorded_its_state_is_finished_by_the_next(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the new table's rows were committed, before its state said so: the next
    run knows the table as this job's (its state folder came first), reads every file again
    and appends nothing twice."""
    out = make_export(tmp_path)
    table = tmp_path / "table"
    real_write_state = ingest_module.write_state

    def die_after_the_writes(
        fs: TableFS, state: ingest_module.TableState
    ) -> ingest_module.TableState:
        if state.version > 0:
            raise KeyboardInterrupt("killed")
        return real_write_state(fs, state)

    monkeypatch.setattr(ingest_module, "write_state", die_after_the_writes)
    with pytest.raises(KeyboardInterrupt):
        ingest(spark, out, table)
    monkeypatch.undo()
    assert table_files(table)
    assert [p.name for p in (table / "_mpbroker_table").iterdir()] == ["state-00000000.json"]

    summary = ingest(spark, out, table)
    assert (summary.rows_read, summary.rows_appended, summary.rows_in_table) == (120, 0, 120)
    assert summary.table_version == 1
    assert table_counts(spark, table) == EXPECTED


def test_reports_follow_rows_a_killed_run_appended_without_recording_them(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next run appends nothing (the rows are there), but the files were not in its
    ingest log: the table's version moves and the reports count the rows."""
    out = make_export(tmp_path)
    table = tmp_path / "table"
    ingest(spark, out, table)
    with stores(tmp_path) as (queues, topics):
        fill(queues, topics, 100, 4)
    export(tmp_path / "data", out, Options())
    real_write_state = ingest_module.write_state

    def die_after_the_writes(
        fs: TableFS, state: ingest_module.TableState
    ) -> ingest_module.TableState:
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(ingest_module, "write_state", die_after_the_writes)
    with pytest.raises(KeyboardInterrupt):
        ingest(spark, out, table)
    monkeypatch.setattr(ingest_module, "write_state", real_write_state)
    assert sum(int(r["messages"]) for r in read_report(table, "per_minute")) == 120

    summary = ingest(spark, out, table)
    assert (summary.rows_appended, summary.rows_in_table, summary.table_version) == (0, 132, 2)
    assert sum(int(r["messages"]) for r in read_report(table, "per_minute")) == 132


def test_a_damaged_update_file_is_refused_before_any_row_is_appended(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """New rows and new outcomes, an update file garbled inside a page (its footer intact):
    it is named, exit 2, and the table is as before: no row appended, no outcome applied."""
    out = make_export(tmp_path)
    table = tmp_path / "table"
    ingest(spark, out, table)
    settle_some(tmp_path)
    with stores(tmp_path) as (queues, topics):
        fill(queues, topics, 100, 4)
    export(tmp_path / "data", out, Options())
    victim = max((out / "_updates").rglob("*.parquet"), key=lambda p: p.stat().st_size)
    garble(victim, "message_id")

    assert main(["--input", str(out), "--output", str(table)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert victim.name in err and "damaged" in err
    assert table_counts(spark, table) == EXPECTED
    assert not (table / "_mpbroker_table" / "state-00000002.json").exists()


def kill_during_write(export_dir: Path, table: Path) -> None:
    """Run the job in a child process and kill -9 it (and its JVM) once at least one Spark
    task has committed its output, before the job commit: the state a crash leaves."""
    # Many small tasks without adaptive coalescing: a long window in which some tasks have
    # committed and others not.
    env = dict(
        os.environ,
        PYSPARK_SUBMIT_ARGS="--conf spark.sql.adaptive.enabled=false"
        " --conf spark.sql.shuffle.partitions=32 --conf spark.ui.enabled=false pyspark-shell",
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "spark.ingest", "--input", str(export_dir), "--output", str(table)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its JVM is in its process group: one killpg ends both
    )
    staging = table / "_temporary" / "0"
    deadline = time.monotonic() + 90
    try:
        while not (staging.is_dir() and any(p.name.startswith("task_") for p in staging.iterdir())):
            assert child.poll() is None, "the job ended before a task committed"
            assert time.monotonic() < deadline, "no task committed within 90 s"
            time.sleep(0.005)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    assert not (table / "_SUCCESS").exists()


def test_a_killed_run_is_finished_by_the_next(spark: SparkSession, tmp_path: Path) -> None:
    out = make_export(tmp_path)
    table = tmp_path / "table"
    kill_during_write(out, table)

    summary = ingest(spark, out, table)
    assert summary.leftovers_removed == [f"file:{table}/_temporary"]
    assert summary.rows_in_table == 120
    assert table_counts(spark, table) == EXPECTED  # no row twice, none missing
    assert not (table / "_temporary").exists()


def test_a_second_run_into_the_same_table_is_refused(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = make_export(tmp_path)
    table = tmp_path / "table"
    with TableFS(spark, str(table)).lock("_ingest.lock"):  # as if another run were writing
        assert main(["--input", str(out), "--output", str(table)]) == 2
    err = capsys.readouterr().err
    assert f"pid {os.getpid()}" in err and str(table) in err
    assert not any(table.rglob("*.parquet"))
