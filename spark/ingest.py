"""Ingest an `mpbroker export` directory into a Parquet table, and write reports beside it.

    python -m spark.ingest --input /srv/export --output /srv/table          # local[*]
    spark-submit spark/ingest.py --input hdfs:///mpbroker/export --output hdfs:///mpbroker/table

`--input` and `--output` are any path Spark's Hadoop layer takes (a local path, ``file://``,
``hdfs://``, ``s3a://``, ``abfss://`` with the user's connectors); every file operation of
the job goes through it (`tablefs.TableFS`). The table needs a filesystem that renames
atomically and can keep a second run out; one that cannot (an object store) is refused as
`--output`, naming the scheme.

A run, under the table's lock:

1. finishes or clears what a killed run left (Spark's staging folder, a half-done swap of
   rewritten partitions, which it completes);
2. checks the export files it has not ingested before (their footers: an export file of a
   schema version this job reads), refusing a damaged or foreign one by name, exit 2;
3. appends the new rows (without the body) to the table, partitioned by destination and UTC
   day, leaving out rows already in it (same store, seq and message id);
4. applies the export's update files (outcomes found after a row was exported as pending):
   the partitions holding those rows are rewritten into a staging folder and swapped in,
   a swap journal making the swap finish after a kill;
5. records what it ingested and the table's new version in ``_mpbroker_table/``;
6. recomputes the reports (``_reports/``) when the table changed, and registers the table
   in Spark's catalog when ``--table NAME`` is given.

Re-running adds nothing and changes nothing; a killed run is finished by the next.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlparse

try:
    from spark.tablefs import TableFS, TableFSError, one_line, support
except ImportError:  # spark-submit spark/ingest.py: the script's directory is on the path
    from tablefs import (  # type: ignore[import-not-found,no-redef]
        TableFS,
        TableFSError,
        one_line,
        support,
    )

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "TABLE_COLUMNS",
    "TABLE_SCHEMA_VERSION",
    "IngestError",
    "IngestSummary",
    "ingest",
    "main",
]

# The export's unique key: (store, seq) is unique in a data directory; the message id guards
# against two data directories with the same store names.
KEY: Final = ("store", "seq", "message_id")
PARTITIONS: Final = ("destination", "day")
PENDING: Final = "pending"
STATE_DIR: Final = "_mpbroker_table"
"""The table's own metadata: ``state-N.json`` (schema version, version, the export files
ingested) and the swap journal."""
SWAP_JOURNAL: Final = f"{STATE_DIR}/swap.json"
STAGING_DIR: Final = "_staging"
REPORTS_DIR: Final = "_reports"
REPORTS_MARKER: Final = "_table_version"
LOCK_FILE: Final = "_ingest.lock"
# Where Spark's file committer stages a write before its job commit renames it into place.
SPARK_STAGING_DIR: Final = "_temporary"
UPDATES_DIR: Final = "_updates"
STATE_FORMAT: Final = "mpbroker-table"
# 2: TIMESTAMP (microseconds, UTC) instead of INT96, required columns non-null, the schema
# version in the table's metadata, outcomes updated in place. Tables made before (1) have
# no state folder.
TABLE_SCHEMA_VERSION: Final = 2
# Size histogram buckets: upper bounds in bytes (exclusive); the last bucket is open.
SIZE_BUCKETS_BYTES: Final = (1024, 4096, 16384, 65536, 262144, 1048576)
OUTCOME_COLUMNS: Final = ("acked", "expired", "dead-lettered", "unsubscribed", "settled", "pending")

# The export's footer keys (the job runs where mpbroker may not be importable).
_SCHEMA_KEY: Final = "mpbroker.export.schema_version"
_KIND_KEY: Final = "mpbroker.export.kind"
_KNOWN_SCHEMA_VERSIONS: Final = frozenset({"1", "2"})
_TABLE_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
_READ_ERROR: Final = re.compile(r"Encountered error while reading file (\S+?)\. Details")


@dataclass(frozen=True, slots=True)
class TableColumn:
    """A column of the table: its name, Spark SQL type, whether it may be null, and what it
    holds (the comment in the table's schema and in the catalog)."""

    name: str
    type: str
    """Spark SQL type."""
    nullable: bool
    doc: str


TABLE_COLUMNS: Final[tuple[TableColumn, ...]] = (
    TableColumn("message_id", "string", False, "the broker's message-id"),
    TableColumn("destination", "string", False, "e.g. /queue/orders (a partition column)"),
    TableColumn("kind", "string", False, "queue or topic"),
    TableColumn("persistent", "boolean", False, "always true: only persistent messages"),
    TableColumn("priority", "tinyint", False, "JMS priority 0-9"),
    TableColumn("timestamp", "timestamp", False, "when the broker received it (UTC)"),
    TableColumn("expires", "timestamp", True, "expiry; null when it never expires"),
    TableColumn("redeliveries", "int", False, "delivery attempts that came back"),
    TableColumn("size_bytes", "bigint", False, "body as stored plus header text"),
    TableColumn("headers", "map<string,string>", False, "standard STOMP/JMS headers"),
    TableColumn("properties", "map<string,string>", False, "the sender's other headers"),
    TableColumn("outcome", "string", False, "acked, expired, dead-lettered, ... or pending"),
    TableColumn("settled_at", "timestamp", True, "when it was settled; null while pending"),
    TableColumn("pending_subscriptions", "int", True, "topics: subscriptions owing an ack"),
    TableColumn("store", "string", False, "source store, e.g. p2p-0"),
    TableColumn("segment", "int", False, "source segment number"),
    TableColumn("seq", "bigint", False, "the store's sequence number"),
    TableColumn("day", "date", False, "UTC day of timestamp (a partition column)"),
)
_UPDATE_COLUMNS: Final = (
    "store string, segment int, seq bigint, message_id string, destination string,"
    " timestamp timestamp, outcome string, settled_at timestamp, redeliveries int"
)


class IngestError(Exception):
    """The job refused its input or output; names the file and why. Nothing was written."""

    exit_code = 2

    def __init__(self, path: Path | str, detail: str) -> None:
        self.path = str(path)
        self.detail = detail
        super().__init__(f"ingest: {self.path}: {detail}")


class SparkFailed(IngestError):
    """A Spark job failed for a reason that names no input file."""

    exit_code = 1


@dataclass
class IngestSummary:
    """What a run read, appended and updated, and the table it left (printed by `main`)."""

    files: int = 0
    files_read: int = 0
    """Row files not ingested before (the others are in the table's ingest log)."""
    update_files_read: int = 0
    rows_read: int = 0
    rows_appended: int = 0
    rows_in_table: int = 0
    outcomes_updated: int = 0
    """Pending rows of the table that an update file settled."""
    updates_without_row: int = 0
    partitions_rewritten: int = 0
    table_version: int = 0
    destinations: dict[str, tuple[int, int]] = field(default_factory=dict)
    """destination -> (messages, bytes) over the whole table."""
    leftovers_removed: list[str] = field(default_factory=list)
    """What an earlier, killed run left half done (removed or finished before this run)."""
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            *(f"{p}: left by an unfinished earlier run, done with" for p in self.leftovers_removed),
            *self.warnings,
            f"{'destination':<40} {'messages':>10} {'bytes':>14}",
            *(
                f"{name:<40} {n:>10,} {size:>14,}"
                for name, (n, size) in sorted(self.destinations.items())
            ),
            f"{self.files} files ({self.files - self.files_read} ingested before),"
            f" {self.rows_read} rows read, {self.rows_appended} appended"
            f" ({self.rows_read - self.rows_appended} already in the table),"
            f" {self.rows_in_table} rows in the table",
            f"{self.update_files_read} update files read, {self.outcomes_updated} outcomes"
            f" updated in {self.partitions_rewritten} partitions; table version"
            f" {self.table_version}",
        ]


# --- the table's state -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TableState:
    """The table's own record (``_mpbroker_table/state-N.json``): its version and the export
    files it holds."""

    version: int = 0
    """Bumped by every run that changed the table's rows (reports follow it)."""
    ingested: dict[str, int] = field(default_factory=dict)
    """Export files ingested: URI -> size. An export directory only gains files, so a run
    reads only new ones, not the export's whole history."""
    serial: int = -1
    """The number of the state file it was read from (-1: none yet); each is written once,
    under the next number."""

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": STATE_FORMAT,
                "schema_version": TABLE_SCHEMA_VERSION,
                "version": self.version,
                "ingested": dict(sorted(self.ingested.items())),
            },
            indent=0,
        )


def _state_name(serial: int) -> str:
    return f"{STATE_DIR}/state-{serial:08d}.json"


_STATE_FILE: Final = re.compile(r"/state-(\d{8})\.json$")


def _state_files(fs: TableFS) -> list[tuple[int, str]]:
    """The table's state files, (serial, name), oldest first."""
    found = ((_STATE_FILE.search(e.name), e.name) for e in fs.list(STATE_DIR))
    return sorted((int(m.group(1)), name) for m, name in found if m is not None)


def read_state(fs: TableFS) -> TableState:
    """The table's newest state; a table with data but no state (made by an earlier version
    of the job) or of another schema version is refused."""
    states = _state_files(fs)
    if not states:
        if _has_data(fs):
            raise IngestError(
                fs.uri,
                "a table made by an earlier version of this job (INT96 timestamps, no schema"
                " version): ingest into a new --output (the export directory holds every"
                " row), then remove this one",
            )
        return TableState()
    serial, name = states[-1]
    try:
        data = json.loads(fs.read_text(name))
        if data.get("format") != STATE_FORMAT:
            raise ValueError("not an mpbroker table state")
        if data.get("schema_version") != TABLE_SCHEMA_VERSION:
            raise IngestError(
                fs.child(name),
                f"table schema version {data.get('schema_version')!r} unknown (this job"
                f" writes {TABLE_SCHEMA_VERSION})",
            )
        return TableState(
            int(data["version"]), {str(k): int(v) for k, v in data["ingested"].items()}, serial
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise IngestError(fs.child(name), f"damaged table state ({exc})") from None


def write_state(fs: TableFS, state: TableState) -> TableState:
    """Record `state` as a new file, the one after `state.serial`'s (never overwriting one),
    then drop all but the newest two; `state` with its new serial."""
    written = replace(state, serial=state.serial + 1)
    fs.create_text(_state_name(written.serial), written.to_json())
    for _, old in _state_files(fs)[:-2]:
        fs.delete(old)
    return written


def _has_data(fs: TableFS) -> bool:
    return any(e.is_dir and not e.name.startswith(("_", ".")) for e in fs.list())


# --- inputs --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Inputs:
    """The export directory's files, by kind."""

    rows: list[tuple[str, int]]
    """Row files: (URI, size)."""
    updates: list[tuple[str, int]]


def list_inputs(fs: TableFS) -> Inputs:
    """The export's row files and update files (not checked yet)."""
    if not fs.is_dir():
        raise IngestError(fs.uri, "not a directory")
    rows: list[tuple[str, int]] = []
    updates: list[tuple[str, int]] = []
    for entry in fs.list(recursive=True):
        parts = entry.name.split("/")
        if not entry.name.endswith(".parquet") or any(p.startswith(".") for p in parts):
            continue
        if parts[0] == UPDATES_DIR:
            updates.append((fs.child(entry.name), entry.size))
        elif not any(p.startswith("_") for p in parts):
            rows.append((fs.child(entry.name), entry.size))
    if not rows:
        raise IngestError(fs.uri, "no .parquet files (not an mpbroker export directory?)")
    return Inputs(rows, updates)


def check_file(fs: TableFS, uri: str, kind: str) -> None:
    """IngestError naming the file unless its footer says it is an export file of `kind`
    and of a schema version this job reads (a damaged footer is refused too)."""
    try:
        metadata = fs.footer_metadata(uri)
    except TableFSError as exc:
        raise IngestError(uri, f"damaged or not a Parquet file ({exc.detail})") from None
    version = metadata.get(_SCHEMA_KEY)
    if version is None:
        raise IngestError(uri, "a Parquet file not written by mpbroker export (foreign file)")
    if version not in _KNOWN_SCHEMA_VERSIONS:
        raise IngestError(uri, f"schema version {version!r} unknown")
    found = metadata.get(_KIND_KEY, "rows")
    if found != kind:
        where = "under _updates/" if kind == "updates" else "among the row files"
        raise IngestError(uri, f"an export file of kind {found!r} {where}")


# --- Spark ---------------------------------------------------------------------------------


@contextlib.contextmanager
def spark_errors() -> Iterator[None]:
    """A Spark job's failure as one line: a file it could not read named (IngestError, exit
    2: the job's writes were aborted, nothing is in the table), anything else SparkFailed."""
    try:
        yield
    except IngestError:
        raise
    except TableFSError as exc:
        raise IngestError(exc.location, exc.detail) from None
    except Exception as exc:
        text = str(exc)
        found = _READ_ERROR.search(text)
        causes = [
            line.strip()
            for line in text.splitlines()
            if line.startswith("Caused by:") and "Encountered error while reading" not in line
        ]
        cause = causes[-1].removeprefix("Caused by: ") if causes else ""
        if found is not None:
            raise IngestError(
                found.group(1),
                f"damaged: Spark could not read it{f' ({cause[:200]})' if cause else ''}",
            ) from None
        first = next((line for line in text.splitlines() if line.strip()), type(exc).__name__)
        raise SparkFailed("spark", f"a Spark job failed: {(cause or first)[:300]}") from None


def _not_null(frame: DataFrame, column: Column) -> Column:
    """`column`, typed non-nullable, failing the job on a null (Spark types every column read
    from Parquet as nullable; the export guarantees these values, and its files say so).
    Spark has no public function for it: this is the expression its own encoders use."""
    from pyspark.sql import Column as SparkColumn

    jvm = frame.sparkSession._jvm
    assert jvm is not None
    empty = (
        jvm.scala.collection.JavaConverters.asScalaBufferConverter(jvm.java.util.ArrayList())
        .asScala()
        .toSeq()
    )
    expression = jvm.org.apache.spark.sql.catalyst.expressions.objects.AssertNotNull(
        column._jc.expr(), empty
    )
    return SparkColumn(jvm.org.apache.spark.sql.Column(expression))


def typed(frame: DataFrame) -> DataFrame:
    """`frame` as the table's columns: each cast, non-null where the table says so, with its
    description and the schema version in its metadata."""
    from pyspark.sql import functions as F

    columns = []
    for c in TABLE_COLUMNS:
        value = F.col(c.name).cast(c.type)
        if not c.nullable:
            value = _not_null(frame, value)
        columns.append(
            value.alias(
                c.name,
                metadata={"comment": c.doc, "mpbroker.table.schema_version": TABLE_SCHEMA_VERSION},
            )
        )
    return frame.select(*columns)


def _schema(*, day: bool = True) -> str:
    """The table's columns as Spark's DDL schema string (`day` false: as the export's row
    files hold them, before the job derives the day)."""
    return ", ".join(f"`{c.name}` {c.type}" for c in TABLE_COLUMNS if day or c.name != "day")


def _read_table(spark: SparkSession, fs: TableFS) -> DataFrame:
    """The table, its partition columns typed as the table says (not inferred from the
    folder names, where a destination named like a number would come back a number)."""
    return spark.read.schema(_schema()).parquet(fs.uri)


def _read_updates(spark: SparkSession, uris: list[str]) -> DataFrame:
    return spark.read.schema(_UPDATE_COLUMNS).parquet(*uris)


def _read_rows(spark: SparkSession, uris: list[str]) -> DataFrame:
    from pyspark.sql import functions as F

    # By name, with the table's types; the body is not read.
    rows = spark.read.schema(_schema(day=False)).parquet(*uris)
    return rows.withColumn("day", F.to_date("timestamp"))


def _append_rows(spark: SparkSession, fs: TableFS, uris: list[str], summary: IngestSummary) -> None:
    rows = _read_rows(spark, uris)
    # An export holds each row once, so de-duplicating whole rows (a shuffle of every
    # column) is only needed when the input overlaps itself (say, two exports of one data
    # directory under --input); counting distinct keys finds out for a shuffle of keys.
    summary.rows_read = rows.select(*KEY).distinct().count()
    if summary.rows_read != rows.count():
        rows = rows.dropDuplicates(list(KEY))
    if _has_data(fs):
        existing = _read_table(spark, fs).select(*KEY)
        rows = rows.join(existing, on=list(KEY), how="left_anti")
    typed(rows).write.mode("append").partitionBy(*PARTITIONS).parquet(fs.uri)


def _apply_updates(
    spark: SparkSession, fs: TableFS, uris: list[str], summary: IngestSummary
) -> None:
    """Rewrite the partitions holding rows the update files settle, into a staging folder,
    then swap them in (`_swap`)."""
    from pyspark.sql import functions as F

    updates = (
        _read_updates(spark, uris)
        .withColumn("day", F.to_date("timestamp"))
        .dropDuplicates(list(KEY))
    )
    places = updates.select(*PARTITIONS).distinct().collect()
    if not places or not _has_data(fs):
        summary.updates_without_row = updates.count()
        return
    destinations = sorted({r["destination"] for r in places})
    days = sorted({r["day"] for r in places})
    current = (
        _read_table(spark, fs)
        .where(F.col("destination").isin(destinations) & F.col("day").isin(days))
        .join(F.broadcast(updates.select(*PARTITIONS).distinct()), on=list(PARTITIONS))
    )
    found = updates.select(
        *KEY,
        F.col("outcome").alias("u_outcome"),
        F.col("settled_at").alias("u_settled_at"),
        F.col("redeliveries").alias("u_redeliveries"),
    )
    joined = current.join(found, on=list(KEY), how="left")
    settles = F.col("u_outcome").isNotNull() & (F.col("outcome") == PENDING)
    merged = joined.select(
        *(
            F.when(settles, F.col(f"u_{name}")).otherwise(F.col(name)).alias(name)
            if name in ("outcome", "settled_at")
            else F.when(settles, F.greatest("redeliveries", "u_redeliveries"))
            .otherwise(F.col("redeliveries"))
            .alias("redeliveries")
            if name == "redeliveries"
            else F.when(settles & (F.col("kind") == "topic"), F.lit(0))
            .otherwise(F.col("pending_subscriptions"))
            .alias("pending_subscriptions")
            if name == "pending_subscriptions"
            else F.col(name)
            for name in (c.name for c in TABLE_COLUMNS)
        ),
        settles.alias("_settled_now"),
    ).cache()
    try:
        summary.outcomes_updated = merged.where("_settled_now").count()
        summary.updates_without_row = updates.join(
            current.select(*KEY), on=list(KEY), how="left_anti"
        ).count()
        if summary.outcomes_updated == 0:
            return
        staging = f"{STAGING_DIR}/{uuid.uuid4().hex}"
        # Only the partitions where a row settles now (an update file may also name rows
        # settled by an earlier run: --reread, or a run killed before its state was written).
        changed = merged.where("_settled_now").select(*PARTITIONS).distinct()
        rewritten = merged.join(F.broadcast(changed), on=list(PARTITIONS)).drop("_settled_now")
        typed(rewritten).write.partitionBy(*PARTITIONS).parquet(fs.child(staging))
    finally:
        merged.unpersist()
    partitions = [
        day.name
        for destination in fs.list(staging)
        if destination.is_dir and destination.name.split("/")[-1].startswith("destination=")
        for day in fs.list(destination.name)
        if day.is_dir
    ]
    prefix = staging + "/"
    journal = {
        "staging": staging,
        "old": f"{staging}-old",
        "partitions": [p.removeprefix(prefix) for p in partitions],
    }
    fs.create_text(SWAP_JOURNAL, json.dumps(journal))
    _swap(fs, journal)
    summary.partitions_rewritten = len(partitions)


def _swap(fs: TableFS, journal: dict[str, Any]) -> None:
    """Move each staged partition into the table (the one there first to the old folder),
    then drop the staging folders and the journal. Run again after a kill, it finishes."""
    staging, old = str(journal["staging"]), str(journal["old"])
    assert staging.startswith(STAGING_DIR + "/") and old.startswith(STAGING_DIR + "/")
    for partition in journal["partitions"]:
        staged = f"{staging}/{partition}"
        if not fs.exists(staged):
            continue  # swapped before the kill
        if fs.exists(partition):
            fs.rename(partition, f"{old}/{partition}")
        fs.rename(staged, partition)
    fs.delete(STAGING_DIR)  # this run's staging and old folders, and nothing else's
    fs.delete(SWAP_JOURNAL)


def _finish_unfinished(fs: TableFS) -> list[str]:
    """Finish a swap a killed run began; remove what else it left half done: Spark's
    staging folder (its job commit would merge those task outputs into the table a second
    time: measured, 3,095 duplicate rows after a kill -9 of a 300,000-row append), staged
    partitions never swapped, a reports folder not swapped in."""
    done: list[str] = []
    if fs.exists(SWAP_JOURNAL):
        try:
            journal = json.loads(fs.read_text(SWAP_JOURNAL))
            if not (
                isinstance(journal, dict)
                and isinstance(journal.get("partitions"), list)
                and all(isinstance(journal.get(k), str) for k in ("staging", "old"))
            ):
                raise ValueError("not a swap journal")
        except ValueError as exc:
            # Written whole (create_text), so not by a killed run of this job.
            raise IngestError(
                fs.child(SWAP_JOURNAL), f"damaged swap journal ({exc}); left as it is"
            ) from None
        _swap(fs, journal)
        done.append(fs.child(SWAP_JOURNAL))
    for name in (SPARK_STAGING_DIR, STAGING_DIR, REPORTS_DIR + ".tmp"):
        if fs.exists(name):
            fs.delete(name)
            done.append(fs.child(name))
    return done


# --- reports -------------------------------------------------------------------------------


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


def _write_reports(table: DataFrame, fs: TableFS, version: int) -> None:
    """Recompute the reports over the whole table and swap them in whole, unless the ones
    there were computed over this version of the table."""
    marker = f"{REPORTS_DIR}/{REPORTS_MARKER}"
    if fs.exists(marker) and fs.read_text(marker).strip() == str(version):
        return
    tmp = REPORTS_DIR + ".tmp"  # a killed run's is gone (_finish_unfinished)
    for name, report in _reports(table).items():
        report.coalesce(1).write.option("header", True).csv(fs.child(f"{tmp}/{name}"))
    fs.create_text(f"{tmp}/{REPORTS_MARKER}", f"{version}\n")
    fs.delete(REPORTS_DIR)
    fs.rename(tmp, REPORTS_DIR)


def report_records(spark: SparkSession, fs: TableFS) -> dict[str, list[dict[str, str]]]:
    """The three reports as the CSV files hold them (text cells by column), read through
    Spark from wherever the table is."""
    out: dict[str, list[dict[str, str]]] = {}
    for name in ("per_minute", "sizes", "outcomes"):
        frame = spark.read.option("header", True).csv(fs.child(f"{REPORTS_DIR}/{name}"))
        out[name] = [
            {k: "" if v is None else str(v) for k, v in row.asDict().items()}
            for row in frame.collect()
        ]
    return out


# --- the catalog ---------------------------------------------------------------------------


def check_catalog(spark: SparkSession, name: str, fs: TableFS) -> None:
    """IngestError unless the catalog has no table `name` or has it over this table."""
    if not spark.catalog.tableExists(name):
        return
    described = spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect()
    location = next((str(r["data_type"]) for r in described if r["col_name"] == "Location"), "")
    if location.rstrip("/") != fs.uri.rstrip("/"):
        raise IngestError(
            name, f"a table of that name exists over {location or 'another place'}, not {fs.uri}"
        )


def _sql_string(text: str) -> str:
    """`text` inside a Spark SQL '...' literal."""
    return text.replace("\\", "\\\\").replace("'", "\\'")


def register(spark: SparkSession, name: str, fs: TableFS, version: int) -> None:
    """Create (or check) the catalog table `name` over the table's location, recover its
    partitions and refresh it, so a later session with the same catalog sees every row."""
    check_catalog(spark, name, fs)
    if not spark.catalog.tableExists(name):
        columns = ", ".join(
            f"`{c.name}` {c.type} COMMENT '{c.doc.replace(chr(39), '')}'" for c in TABLE_COLUMNS
        )
        spark.sql(
            f"CREATE TABLE {name} ({columns}) USING parquet PARTITIONED BY (destination, day)"
            f" LOCATION '{_sql_string(fs.uri)}'"
            f" TBLPROPERTIES ('mpbroker.table.schema_version' = '{TABLE_SCHEMA_VERSION}')"
        )
    spark.sql(f"ALTER TABLE {name} RECOVER PARTITIONS")
    spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('mpbroker.table.version' = '{version}')")
    spark.sql(f"REFRESH TABLE {name}")


# --- the run -------------------------------------------------------------------------------


def ingest(
    spark: SparkSession,
    input_dir: Path | str,
    output: Path | str,
    *,
    table: str | None = None,
    reread: bool = False,
) -> IngestSummary:
    """Ingest `input_dir` into the table at `output` (see the module docstring); IngestError
    before any write for refused input or output. `reread`: every export file, not only
    those not ingested before (nothing is added or changed twice)."""
    # A URI's scheme is judged before its filesystem is looked for (an s3a:// output is
    # refused for what S3 is, connectors or not); a bare path is on the default filesystem.
    _check_table_scheme(urlparse(str(output)).scheme, str(output))
    try:
        source = TableFS(spark, str(input_dir))
        target = TableFS(spark, str(output))
        _check_table_scheme(target.scheme, target.uri)
        with spark_errors():
            if table is not None:
                check_catalog(spark, table, target)
        inputs = list_inputs(source)
        target.mkdirs()
        with target.lock(LOCK_FILE) as taken_over, _table_session_conf(spark):
            summary = _ingest_locked(spark, source, target, inputs, table, reread)
        if taken_over is not None:
            summary.leftovers_removed.insert(0, taken_over)
        return summary
    except TableFSError as exc:
        raise IngestError(exc.location, exc.detail) from None


@contextlib.contextmanager
def _table_session_conf(spark: SparkSession) -> Iterator[None]:
    """The session settings the table's writes need, for the run only (a caller's session
    gets its own back)."""
    wanted = {
        "spark.sql.session.timeZone": "UTC",  # days and minutes are UTC
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",  # not INT96
        "spark.sql.sources.partitionOverwriteMode": "static",
    }
    before = {key: spark.conf.get(key, None) for key in wanted}
    for key, value in wanted.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, earlier in before.items():
            if earlier is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, earlier)


def _say(text: str) -> None:
    """Where a run is, on stderr when it is a terminal (each step may take a while on a big
    table; a log or a pipe gets only the summary and errors, as from `mpbroker export`)."""
    if sys.stderr.isatty():
        print(f"ingest: {text} ...", file=sys.stderr, flush=True)


def _check_table_scheme(scheme: str, location: str) -> None:
    """IngestError naming `scheme` when it cannot hold the table (see `tablefs.support`)."""
    if not scheme:
        return
    can = support(scheme)
    if not can.atomic_rename or can.lock is None:
        raise IngestError(
            location,
            f"{scheme}:// cannot hold the table: {can.why_not}. Keep the table on a"
            " filesystem that renames atomically (HDFS, ADLS Gen2, a local or shared POSIX"
            f" directory); {scheme}:// works as --input",
        )


def _ingest_locked(
    spark: SparkSession,
    source: TableFS,
    target: TableFS,
    inputs: Inputs,
    table: str | None,
    reread: bool,
) -> IngestSummary:
    summary = IngestSummary(files=len(inputs.rows))
    _say(f"{target.uri}: locked")
    summary.leftovers_removed = _finish_unfinished(target)
    state = read_state(target)
    new_table = state.serial < 0
    if new_table:
        # The state folder before the table's first write: a run killed after that write
        # leaves a table the next run knows as this job's (and completes), not one it
        # would refuse as made by an earlier version of the job.
        state = write_state(target, state)
    try:
        return _ingest_into(spark, source, target, inputs, table, reread, summary, state)
    except IngestError:
        if new_table and not _has_data(target):
            target.delete(STATE_DIR)  # refused before anything was written: nothing left
        raise


def _ingest_into(
    spark: SparkSession,
    source: TableFS,
    target: TableFS,
    inputs: Inputs,
    table: str | None,
    reread: bool,
    summary: IngestSummary,
    state: TableState,
) -> IngestSummary:
    from pyspark.sql import functions as F

    known = {} if reread else state.ingested
    new_rows = [(u, s) for u, s in inputs.rows if known.get(u) != s]
    new_updates = [(u, s) for u, s in inputs.updates if known.get(u) != s]
    _say(f"checking {len(new_rows)} new row files and {len(new_updates)} new update files")
    for uri, _ in new_rows:
        check_file(source, uri, "rows")
    for uri, _ in new_updates:
        check_file(source, uri, "updates")
    summary.files_read = len(new_rows)
    summary.update_files_read = len(new_updates)
    with spark_errors():
        if new_updates:
            # Read whole before the rows are appended: an update file damaged inside a page
            # is refused while nothing is written yet. (A damaged row file fails the append
            # job, whose files are never committed.)
            _read_updates(spark, [u for u, _ in new_updates]).write.format("noop").mode(
                "overwrite"
            ).save()
        before = _read_table(spark, target).count() if _has_data(target) else 0
        if new_rows:
            _say("appending the new rows")
            _append_rows(spark, target, [u for u, _ in new_rows], summary)
        if new_updates:
            _say("applying the outcomes found later")
            _apply_updates(spark, target, [u for u, _ in new_updates], summary)
    if summary.updates_without_row:
        summary.warnings.append(
            f"{summary.updates_without_row} outcomes in update files name rows that are not in"
            " the table (their row files were not ingested into it): not applied"
        )
    with spark_errors():
        # The lock keeps other writers out: what the table gained is what this run appended.
        summary.rows_appended = (
            _read_table(spark, target).count() if _has_data(target) else 0
        ) - before
    # The version (which the reports follow) moves when the rows did, or may have: files not
    # in the ingest log were read (a run killed after its writes left them unrecorded, and
    # its rows are no longer "appended"). Files read again by --reread that changed nothing
    # leave it, and the reports.
    unrecorded = any(state.ingested.get(u) != n for u, n in (*new_rows, *new_updates))
    moved = unrecorded or summary.rows_appended > 0 or summary.outcomes_updated > 0
    now = replace(
        state,
        version=state.version + (1 if moved else 0),
        ingested=state.ingested | dict(new_rows) | dict(new_updates),
    )
    if now != state:
        # Only after the table's writes: a run killed before this reads those files again.
        now = write_state(target, now)
    summary.table_version = now.version
    if not _has_data(target):  # nothing appended to a table that did not exist yet
        return summary
    with spark_errors():
        frame = _read_table(spark, target)
        for row in (
            frame.groupBy("destination").agg(
                F.count("*").alias("n"), F.sum("size_bytes").alias("b")
            )
        ).collect():
            summary.destinations[row["destination"]] = (int(row["n"]), int(row["b"]))
        summary.rows_in_table = sum(n for n, _ in summary.destinations.values())
        _say("reports")
        _write_reports(frame, target, now.version)
        if table is not None:
            _say(f"catalog table {table}")
            register(spark, table, target, now.version)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark.ingest",
        description="Append an mpbroker export to a Parquet table partitioned by destination"
        " and day, apply the outcomes found later, and write reports under OUTPUT/_reports/.",
    )
    parser.add_argument(
        "--input", required=True, help="an `mpbroker export` --out (a path or a URI)"
    )
    parser.add_argument("--output", required=True, help="the table directory (a path or a URI)")
    parser.add_argument(
        "--master", default=None, help="Spark master (default: spark-submit's, else local[*])"
    )
    parser.add_argument(
        "--table",
        metavar="NAME",
        default=None,
        help="also create or refresh a table NAME over the output in Spark's catalog",
    )
    parser.add_argument(
        "--reread",
        action="store_true",
        help="read every export file again, not only the new ones (nothing is added twice)",
    )
    parser.add_argument(
        "--chart",
        metavar="PNG",
        type=Path,
        default=None,
        help="also draw the reports as a chart image (a local file)",
    )
    args = parser.parse_args(argv)
    if args.table is not None and not _TABLE_NAME.match(args.table):
        print(
            f"ingest: --table {args.table!r}: give a table name (letters, digits, _; optionally"
            " database.table)",
            file=sys.stderr,
        )
        return 2
    try:
        # Before Spark starts: an output an object store cannot hold costs no JVM.
        _check_table_scheme(urlparse(args.output).scheme, args.output)
    except IngestError as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    if args.chart is not None:
        chart = _chart_module()
        try:
            chart.require_matplotlib()
        except chart.ChartError as exc:
            print(exc, file=sys.stderr)
            return 2
    from pyspark.sql import SparkSession

    # A session already running in this process (pyspark's shell, a caller's) is used and
    # left running; one made here is stopped at the end.
    ours = SparkSession.getActiveSession() is None
    try:
        spark = _session(args.master, hive=args.table is not None, quiet=ours)
    except IngestError as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    try:
        summary = ingest(spark, args.input, args.output, table=args.table, reread=args.reread)
        print("\n".join(summary.lines()))
        if args.chart is not None:
            if not summary.rows_in_table:
                print(f"chart: {args.chart} not drawn: the table has no rows", file=sys.stderr)
                return 0
            return _chart(spark, args.output, args.chart)
        return 0
    except IngestError as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    finally:
        if ours:
            spark.stop()


def _chart_module() -> Any:
    try:
        from spark import chart
    except ImportError:  # spark-submit spark/ingest.py: the script's directory is on the path
        import chart  # type: ignore[import-not-found,no-redef]
    return chart


def _chart(spark: SparkSession, output: str, png: Path) -> int:
    chart = _chart_module()
    fs = TableFS(spark, output)
    try:
        reports = chart.reports_from_records(report_records(spark, fs), fs.child(REPORTS_DIR))
        written = chart.write_reports_chart(reports, png, f"mpbroker reports: {fs.uri}")
        print(f"chart: {written}")
    except chart.ChartError as exc:
        print(f"{exc} (the table and its reports are written)", file=sys.stderr)
        return 2
    return 0


def _session(master: str | None, *, hive: bool, quiet: bool) -> SparkSession:
    """The job's session (`quiet`: Spark's log at ERROR unless spark.log.level is set)."""
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
    if hive:
        # The catalog a later session finds the table in: Spark's Hive-compatible one (its
        # defaults: metastore_db and spark-warehouse in the working directory; on a cluster,
        # the metastore its configuration names).
        builder = builder.enableHiveSupport()
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        raise SparkFailed("spark", f"Spark did not start: {one_line(exc)[:300]}") from None
    if quiet and not spark.sparkContext.getConf().contains("spark.log.level"):
        # Spark's warnings are for its operators (and RECOVER PARTITIONS warns of each of
        # the job's own files beside the partitions): errors only, unless told otherwise
        # (`--conf spark.log.level=WARN`, which a setting made here would override).
        spark.sparkContext.setLogLevel("ERROR")
    return spark


def _under_spark_submit() -> bool:
    import os

    return "SPARK_ENV_LOADED" in os.environ or "PYSPARK_GATEWAY_PORT" in os.environ


if __name__ == "__main__":
    sys.exit(main())
