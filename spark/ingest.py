"""Ingest an `mpbroker export` directory into a Parquet table, and write reports beside it.

    python -m spark.ingest --input /srv/export --output /srv/table          # local[*]
    spark-submit spark/ingest.py --input /srv/export --output /srv/table    # a cluster

Every input file is checked first (a damaged or foreign Parquet file, or a schema version
this job does not know, is refused naming the file, exit code 2, before anything is
written). The rows are appended to a table partitioned by destination and day (UTC), leaving
out rows already in it (same store, seq and message id), so re-running adds nothing. Files
ingested before (``<output>/_ingested.json``: path and size) are not read again, so a run
costs what the new files cost, not the whole history of an incrementally exported directory;
delete that file to have every file read again (the anti-join still adds nothing twice). The
reports under ``<output>/_reports/`` are recomputed from the whole table when it changed and
replaced as a whole. The message body is not copied into the table.

A run that was killed is finished by running it again: Spark makes a written file visible in
the table only by renaming it there, so the table holds whole files of the killed run at
most, and the anti-join appends exactly the rows still missing. What the killed run left in
``<output>/_temporary/`` is removed first; Spark's job commit would otherwise merge those
task outputs into the table a second time (measured: 3,095 duplicate rows after a kill -9
of a 300,000-row append). One run at a time per table: ``<output>/_ingest.lock`` (flock)
refuses a second. The table is a local or shared POSIX directory (not an HDFS URI).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["IngestError", "IngestSummary", "check_inputs", "ingest", "main"]

# The export's unique key: (store, seq) is unique in a data directory; the message id guards
# against two data directories with the same store names.
KEY: Final = ("store", "seq", "message_id")
PARTITIONS: Final = ("destination", "day")
REPORTS_DIR: Final = "_reports"
# The table's row count the reports were computed from (in the reports directory).
REPORTS_MARKER: Final = "_table_rows"
LOCK_FILE: Final = "_ingest.lock"
# Export files already appended (absolute path -> size), so that a run reads only new ones:
# an export directory only gains files, and re-reading its whole history every run would
# make each ingest cost as much as all before it.
INGEST_LOG: Final = "_ingested.json"
# Where Spark's file committer stages a write before its job commit renames it into place.
SPARK_STAGING_DIR: Final = "_temporary"
# Size histogram buckets: upper bounds in bytes (exclusive); the last bucket is open.
SIZE_BUCKETS_BYTES: Final = (1024, 4096, 16384, 65536, 262144, 1048576)
OUTCOME_COLUMNS: Final = ("acked", "expired", "dead-lettered", "unsubscribed", "pending")

# Used when mpbroker itself is not importable (spark-submit with a bare Python).
_SCHEMA_KEY: Final = b"mpbroker.export.schema_version"
_KIND_KEY: Final = b"mpbroker.export.kind"
_KNOWN_SCHEMA_VERSIONS: Final = frozenset({b"1", b"2"})


class IngestError(Exception):
    """The job refused its input; names the file and why. Nothing was written."""

    def __init__(self, path: Path | str, detail: str) -> None:
        self.path = Path(path)
        self.detail = detail
        super().__init__(f"ingest: {self.path}: {detail}")


@dataclass
class IngestSummary:
    files: int = 0
    files_read: int = 0
    """Files not ingested before (the others are in the table's ingest log)."""
    rows_read: int = 0
    rows_appended: int = 0
    rows_in_table: int = 0
    destinations: dict[str, tuple[int, int]] = field(default_factory=dict)
    """destination -> (messages, bytes) over the whole table."""
    leftovers_removed: list[Path] = field(default_factory=list)
    """What an earlier, killed run left half written (removed before this run wrote)."""
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [
            *(f"removed {p}, left by an unfinished earlier run" for p in self.leftovers_removed),
            *self.warnings,
            f"{'destination':<40} {'messages':>10} {'bytes':>14}",
            *(
                f"{name:<40} {n:>10} {size:>14}"
                for name, (n, size) in sorted(self.destinations.items())
            ),
            f"{self.files} files ({self.files - self.files_read} ingested before),"
            f" {self.rows_read} rows read, {self.rows_appended} appended"
            f" ({self.rows_read - self.rows_appended} already in the table),"
            f" {self.rows_in_table} rows in the table",
        ]
        return out


def _check_file(path: Path) -> str:
    try:
        from mpbroker.export import ExportError
        from mpbroker.export._parquet import check_file
    except ImportError:
        return _check_file_pyarrow(path)
    try:
        return check_file(path)
    except ExportError as exc:
        raise IngestError(path, exc.detail) from None


def _check_file_pyarrow(path: Path) -> str:
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except Exception as exc:  # ArrowInvalid, OSError, ... for a bad footer
        raise IngestError(path, f"damaged or not a Parquet file ({exc})") from None
    metadata = schema.metadata or {}
    version = metadata.get(_SCHEMA_KEY)
    if version is None:
        raise IngestError(path, "a Parquet file not written by mpbroker export (foreign file)")
    if version not in _KNOWN_SCHEMA_VERSIONS:
        raise IngestError(path, f"schema version {version.decode(errors='replace')!r} unknown")
    return str(metadata.get(_KIND_KEY, b"rows").decode(errors="replace"))


def check_inputs(input_dir: Path) -> list[Path]:
    """The export's row files, each checked; IngestError naming the first bad one. (Files
    under a folder whose name starts with an underscore, such as the export's _updates/,
    are not row files.)"""
    if not input_dir.is_dir():
        raise IngestError(input_dir, "not a directory")
    files = sorted(
        p
        for p in input_dir.rglob("*.parquet")
        if p.is_file()
        and not any(part.startswith(("_", ".")) for part in p.relative_to(input_dir).parts)
    )
    if not files:
        raise IngestError(input_dir, "no .parquet files (not an mpbroker export directory?)")
    for path in files:
        kind = _check_file(path)
        if kind != "rows":
            raise IngestError(path, f"an export file of kind {kind!r} among the row files")
    return files


@contextlib.contextmanager
def table_lock(output: Path) -> Iterator[None]:
    """Hold ``output``'s ingest lock (created with the directory); IngestError if another
    run holds it. A second run would share the first one's Spark staging directory."""
    output.mkdir(parents=True, exist_ok=True)
    path = output / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise IngestError(
                output, f"another ingest into this table is running (pid {holder}, {path})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays, so its inode is the lock


def _remove_unfinished(output: Path) -> list[Path]:
    """Remove what a killed run left half done: Spark's staging directory and a reports
    directory not yet swapped in. Called with the table lock held."""
    candidates = (SPARK_STAGING_DIR, REPORTS_DIR + ".tmp", INGEST_LOG + ".tmp")
    leftovers = [output / name for name in candidates if (output / name).exists()]
    for path in leftovers:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return leftovers


def _read_log(output: Path) -> tuple[dict[str, int], str | None]:
    """The ingest log, and a warning when it had to be ignored (every file is read again,
    which the anti-join makes safe)."""
    path = output / INGEST_LOG
    try:
        data = json.loads(path.read_text())
        files = data["files"]
        if data.get("version") != 1 or not isinstance(files, dict):
            raise ValueError("unknown layout")
        return {str(k): int(v) for k, v in files.items()}, None
    except FileNotFoundError:
        return {}, None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return {}, f"ignored {path} ({exc}): every input file is read again"


def _write_log(output: Path, files: dict[str, int]) -> None:
    path = output / INGEST_LOG
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"version": 1, "files": files}, indent=0, sort_keys=True))
    os.replace(tmp, path)


def _table_files(output: Path) -> bool:
    return output.is_dir() and any(
        not any(part.startswith(("_", ".")) for part in p.relative_to(output).parts)
        for p in output.rglob("*.parquet")
    )


def _reports(table: DataFrame) -> dict[str, DataFrame]:
    from pyspark.sql import functions as F

    latency_ms = F.when(
        F.col("outcome") == "acked",
        F.expr("unix_millis(settled_at) - unix_millis(timestamp)"),
    )
    per_minute = (
        table.withColumn("minute", F.date_trunc("minute", "timestamp"))
        .withColumn("latency_ms", latency_ms)
        .groupBy("destination", "minute")
        .agg(
            F.count("*").alias("messages"),
            F.sum("size_bytes").alias("bytes"),
            F.count("latency_ms").alias("acked"),
            *(
                F.percentile_approx("latency_ms", q).alias(f"latency_p{int(q * 100)}_ms")
                for q in (0.5, 0.95, 0.99)
            ),
        )
        .orderBy("destination", "minute")
    )
    bucket = F.lit(f">={SIZE_BUCKETS_BYTES[-1]}")
    for bound in reversed(SIZE_BUCKETS_BYTES):
        bucket = F.when(F.col("size_bytes") < bound, F.lit(f"<{bound}")).otherwise(bucket)
    order = F.lit(len(SIZE_BUCKETS_BYTES))
    for i, bound in reversed(list(enumerate(SIZE_BUCKETS_BYTES))):
        order = F.when(F.col("size_bytes") < bound, F.lit(i)).otherwise(order)
    sizes = (
        table.withColumn("size_bucket", bucket)
        .withColumn("bucket_order", order)
        .groupBy("destination", "bucket_order", "size_bucket")
        .agg(F.count("*").alias("messages"), F.sum("size_bytes").alias("bytes"))
        .orderBy("destination", "bucket_order")
        .drop("bucket_order")
    )
    outcomes = (
        table.groupBy("destination")
        .agg(
            F.count("*").alias("messages"),
            F.sum("size_bytes").alias("bytes"),
            *(
                F.count(F.when(F.col("outcome") == o, 1)).alias(o.replace("-", "_"))
                for o in OUTCOME_COLUMNS
            ),
            F.count(F.when(F.col("redeliveries") > 0, 1)).alias("redelivered_messages"),
            F.sum("redeliveries").alias("redeliveries"),
        )
        .orderBy("destination")
    )
    return {"per_minute": per_minute, "sizes": sizes, "outcomes": outcomes}


def ingest(spark: SparkSession, input_dir: Path, output: Path) -> IngestSummary:
    """Check, append the new rows, rewrite the reports; IngestError before any write."""
    files = check_inputs(input_dir)
    with table_lock(output):
        return _ingest_locked(spark, files, output)


def _ingest_locked(spark: SparkSession, files: list[Path], output: Path) -> IngestSummary:
    from pyspark.sql import functions as F

    summary = IngestSummary(files=len(files))
    summary.leftovers_removed = _remove_unfinished(output)
    updates = {u for f in files for u in f.parents[1].glob("_updates/**/*.parquet")}
    if updates:
        summary.warnings.append(
            f"{len(updates)} update files (outcomes the export found later) are not applied"
            " by this version of the job: the table keeps the outcomes of the row files"
        )
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # days and minutes are UTC
    log, warning = _read_log(output)
    if warning is not None:
        summary.warnings.append(warning)
    seen = {f: (str(f.resolve()), f.stat().st_size) for f in files}
    todo = [f for f, (name, size) in seen.items() if log.get(name) != size]
    summary.files_read = len(todo)
    if todo:
        rows = (
            spark.read.parquet(*(str(f) for f in todo))
            .drop("body")
            .withColumn("day", F.to_date("timestamp"))
        )
        # An export holds each row once, so de-duplicating whole rows (a shuffle of every
        # column) is only needed when the input overlaps itself (say, two exports of one data
        # directory under --input); counting distinct keys finds out for a shuffle of keys.
        summary.rows_read = rows.select(*KEY).distinct().count()
        if summary.rows_read != rows.count():
            rows = rows.dropDuplicates(list(KEY))
        before = spark.read.parquet(str(output)).count() if _table_files(output) else 0
        if before:
            existing = spark.read.parquet(str(output)).select(*KEY)
            rows = rows.join(existing, on=list(KEY), how="left_anti")
        rows.write.mode("append").partitionBy(*PARTITIONS).parquet(str(output))
        # Only after the append committed: a run killed before this reads them again.
        _write_log(output, log | dict(seen.values()))
    if not _table_files(output):  # nothing appended to a table that did not exist yet
        return summary

    table = spark.read.parquet(str(output))
    for row in (
        table.groupBy("destination").agg(F.count("*").alias("n"), F.sum("size_bytes").alias("b"))
    ).collect():
        summary.destinations[row["destination"]] = (int(row["n"]), int(row["b"]))
    summary.rows_in_table = sum(n for n, _ in summary.destinations.values())
    if todo:
        # The lock keeps other writers out: what the table gained is what this run appended.
        summary.rows_appended = summary.rows_in_table - before
    _write_reports(table, output, summary.rows_in_table)
    return summary


def _write_reports(table: DataFrame, output: Path, rows_in_table: int) -> None:
    """Recompute the reports over the whole table and swap them in whole, unless the ones
    there were computed over this very table: it only ever grows, so the same row count is
    the same table (a re-run that appended nothing rewrites nothing)."""
    final = output / REPORTS_DIR
    marker = final / REPORTS_MARKER
    if marker.is_file() and marker.read_text().strip() == str(rows_in_table):
        return
    tmp = output / (REPORTS_DIR + ".tmp")  # a killed run's is gone (_remove_unfinished)
    for name, report in _reports(table).items():
        report.coalesce(1).write.option("header", True).csv(str(tmp / name))
    (tmp / REPORTS_MARKER).write_text(f"{rows_in_table}\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark.ingest",
        description="Append an mpbroker export to a Parquet table partitioned by destination"
        " and day, and write reports under OUTPUT/_reports/.",
    )
    parser.add_argument("--input", required=True, type=Path, help="an `mpbroker export` --out")
    parser.add_argument("--output", required=True, type=Path, help="the table directory")
    parser.add_argument(
        "--master", default=None, help="Spark master (default: spark-submit's, else local[*])"
    )
    parser.add_argument(
        "--chart",
        metavar="PNG",
        type=Path,
        default=None,
        help="also draw the reports as a chart image (as python -m spark.chart does)",
    )
    args = parser.parse_args(argv)
    try:
        files = check_inputs(args.input)  # before Spark starts: a bad file costs no JVM
        with table_lock(args.output):
            summary = _run_spark(args.master, files, args.output)
    except IngestError as exc:
        print(exc, file=sys.stderr)
        return 2
    print("\n".join(summary.lines()))
    if args.chart is not None and summary.rows_in_table:
        try:
            from spark.chart import ChartError, write_chart
        except ImportError:  # spark-submit spark/ingest.py: the script's directory is on the path
            from chart import ChartError, write_chart  # type: ignore[import-not-found,no-redef]

        try:
            print(f"chart: {write_chart(args.output, args.chart)}")
        except ChartError as exc:
            print(f"{exc} (the table and its reports are written)", file=sys.stderr)
            return 2
    return 0


def _run_spark(master: str | None, files: list[Path], output: Path) -> IngestSummary:
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName("mpbroker-ingest")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if master is not None:
        builder = builder.master(master)
    elif "pyspark.shell" not in sys.modules and not _under_spark_submit():
        builder = builder.master("local[*]")
    spark = builder.getOrCreate()
    try:
        return _ingest_locked(spark, files, output)
    finally:
        spark.stop()


def _under_spark_submit() -> bool:
    import os

    return "SPARK_ENV_LOADED" in os.environ or "PYSPARK_GATEWAY_PORT" in os.environ


if __name__ == "__main__":
    sys.exit(main())
