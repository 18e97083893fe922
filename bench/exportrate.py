"""How fast `mpbroker export` turns the stores into Parquet, and how long the Spark ingest
job takes over the result: rows/s and MB/s, each against a baseline run in the same
invocation.

``python -m bench.exportrate [--messages 1000000] [--size 200] [--destinations 10]
[--topic-share 0.2] [--keep DIR] [--json]``

1. **Fill** (not a headline number): a temporary data directory laid out as a default broker
   leaves it (one p2p store ``p2p-0``, one pubsub store ``pubsub-0`` with its durable
   registry), written directly with :class:`MessageStore` and :class:`TopicStore` in
   group-commit batches (``[store] commit_max_messages`` / ``commit_max_bytes``), default
   segment size (32 MiB) and ``archive = true`` (without it acked segments are deleted and
   could not be exported). ``synchronous = normal`` only to fill faster: the export reads
   the same files either way. ``--messages`` persistent messages of ``--size`` body bytes
   (JSON-like, different in each message: a few fields, then random hex digits) and three
   header fields, a ``--topic-share`` of them to ``/topic/bench`` (one durable
   subscription), the others round-robin over ``--destinations`` queues; timestamps spread
   over 10 minutes. Outcomes: the newest 10 % of each destination pending (a consumer
   behind), of the others 5 % expired and the rest acked (2 % of the queue messages after
   a redelivery). Older segments are then fully settled and archived, as in a broker that
   has run for a while.
2. **Raw scan** (the export's baseline): the same SQL the export runs, with plain
   ``sqlite3`` over every segment file (message rows with their body, settlements,
   deliveries, the durable registry's pending counts), rows fetched and nothing converted.
3. **Export**: ``export(data, out, Options())`` timed: rows/s, MB/s of source (message
   bytes: the sum of ``size``, body plus header text) and of Parquet written, and its time
   as a multiple of the raw scan's; then the same with ``Options(body=False)``
   (``--no-body``) into a second directory.
4. **Ingest**: one local SparkSession (``local[*]``, UI off, 4 shuffle partitions, UTC);
   its start (JVM and a first trivial job) is reported on its own. (a) baseline: read the
   export's files, ``count()`` and ``groupBy(destination).count()``; (b) ``ingest(spark,
   export, table)`` into a fresh table; (c) the same again (every file is in the table's
   ingest log: nothing is read); (d) again without the ingest log (every row read and
   anti-joined against the table, nothing appended: the cost of idempotence). (b), (c)
   and (d) as multiples of (a); (a) runs twice and the second, warm run
   is the baseline (the first, reported too, also warms up the JVM's Parquet reader). Note
   that (a) reads a single column (``count()`` takes the row counts from the files' footers),
   while the ingest reads every column but the body, de-duplicates (a shuffle), writes the
   partitioned table and recomputes its reports; so (a2), a second denominator: every
   column but the body read and decoded into Spark's ``noop`` sink (``ingest_x_scan``).
   With (a) well under a second at 1M rows, (a2) gives the steadier ratios.

MB are 10^6 bytes. The files were just written, so every read is from the page cache. On a
shared machine the absolute figures wander; the ratios to the baselines hold better.
Exit status 0 when it measured and the counts check (export rows == N, table rows == N
after both ingests, nothing appended by the second), else 1 with the reason. Stops Spark
and its JVM, removes the temporary directory (unless ``--keep DIR``: everything is left
in DIR). With ``--json`` the summary is one JSON line, the last one on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import psutil

from mpbroker.config import StoreSettings
from mpbroker.export import Options, export
from mpbroker.export._source import (
    DELIVERIES_SQL,
    MESSAGES_SQL,
    SEALED_SQL,
    SETTLEMENTS_SQL,
    find_stores,
    list_segments,
    open_segment,
    pending_counts,
)
from mpbroker.records import Message, message_size
from mpbroker.stores import MessageStore, TopicStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["main", "measure"]

TOPIC: Final = "/topic/bench"
SUBSCRIPTION: Final = "bench-durable"
SPAN_MS: Final = 10 * 60 * 1000
PENDING_SHARE: Final = 0.10
EXPIRED_SHARE: Final = 0.05
REDELIVERED_SHARE: Final = 0.02
MB: Final = 1_000_000


def _say(text: str) -> None:
    print(f"exportrate: {text}", file=sys.stderr, flush=True)


def _rate(n: float, seconds: float) -> float:
    return round(n / seconds, 1) if seconds > 0 else 0.0


# -- 1. fill ---------------------------------------------------------------------------------


@dataclass
class Fill:
    seconds: float = 0.0
    messages: int = 0
    bytes: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    redelivered: int = 0
    segments: int = 0
    archived_segments: int = 0


@dataclass
class _Batch:
    messages: list[Message] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)
    redelivered: list[bool] = field(default_factory=list)
    bytes: int = 0


def _body(i: int, size: int, rng: random.Random) -> bytes:
    """A JSON-like body of exactly `size` bytes that differs from message to message: a few
    fields, then hex digits (half their bits random): compressible as real payloads are,
    not a repeated constant a columnar codec would reduce to nothing."""
    head = f'{{"order":{i},"customer":"c-{i % 9973}","amount":{i % 100_000 / 100},"note":"'
    pad = rng.randbytes(size // 2 + 1).hex()
    return (head + pad)[: max(0, size - 2)].encode() + b'"}'[:size]


def _settings() -> StoreSettings:
    return StoreSettings(archive=True, synchronous="normal")


def _flush_queue(store: MessageStore, batch: _Batch, fill: Fill) -> None:
    seqs = store.append(batch.messages)
    at_ms = batch.messages[-1].timestamp_ms + 50
    by_outcome: dict[str, list[int]] = {}
    for seq, outcome in zip(seqs, batch.outcomes, strict=True):
        by_outcome.setdefault(outcome, []).append(seq)
    again = [s for s, r in zip(seqs, batch.redelivered, strict=True) if r]
    if again:
        store.record_delivery(again)
        fill.redelivered += len(again)
    for outcome in ("acked", "expired"):
        if by_outcome.get(outcome):
            store.settle(by_outcome[outcome], outcome, at_ms)


def _flush_topic(store: TopicStore, batch: _Batch) -> None:
    seqs = store.append([(m, [SUBSCRIPTION]) for m in batch.messages])
    at_ms = batch.messages[-1].timestamp_ms + 50
    acked = [(SUBSCRIPTION, s) for s, o in zip(seqs, batch.outcomes, strict=True) if o == "acked"]
    expired = [s for s, o in zip(seqs, batch.outcomes, strict=True) if o == "expired"]
    store.ack(acked, "acked", at_ms)
    store.expire(expired, at_ms)


def fill_stores(
    data: Path, messages: int, size: int, destinations: int, topic_share: float
) -> Fill:
    """Write the data directory (see the module docstring); what was written."""
    settings = _settings()
    per_batch = max(1, min(settings.commit_max_messages, settings.commit_max_bytes // size))
    rng = random.Random(20261123)
    start_ms = int(time.time() * 1000) - SPAN_MS - 60_000
    topic_n = round(messages * topic_share)
    queue_n = messages - topic_n
    # The newest PENDING_SHARE of each destination (queues together, the topic) is pending.
    queue_pending_from = queue_n - round(queue_n * PENDING_SHARE)
    topic_pending_from = topic_n - round(topic_n * PENDING_SHARE)
    fill = Fill()
    began = time.perf_counter()
    queues = MessageStore.open(data / "p2p-0", settings)
    topics = TopicStore(data / "pubsub-0", data / "pubsub-0-durable.db", settings)
    try:
        topics.recover(0)
        topics.subscribe(SUBSCRIPTION, TOPIC)
        qbatch, tbatch = _Batch(), _Batch()
        queued = published = 0
        for i in range(messages):
            ts = start_ms + i * SPAN_MS // messages
            # Spread the topic's messages evenly among the queues' (Bresenham).
            to_topic = int((i + 1) * topic_share) > int(i * topic_share)
            if to_topic:
                destination, batch, pending = TOPIC, tbatch, published >= topic_pending_from
                published += 1
            else:
                destination = f"/queue/bench-{queued % destinations}"
                batch, pending = qbatch, queued >= queue_pending_from
                queued += 1
            expired = not pending and rng.random() < EXPIRED_SHARE
            outcome = "pending" if pending else "expired" if expired else "acked"
            m = Message(
                message_id=f"ID:bench-{i}",
                destination=destination,
                headers={
                    "content-type": "application/json",
                    "correlation-id": f"c-{i}",
                    "tenant": f"t{i % 7}",
                },
                body=_body(i, size, rng),
                timestamp_ms=ts,
                persistent=True,
                expires_ms=ts + 60_000 if expired else 0,
            )
            m.size = message_size(m)
            batch.messages.append(m)
            batch.outcomes.append(outcome)
            batch.redelivered.append(
                not to_topic and outcome == "acked" and rng.random() < REDELIVERED_SHARE
            )
            fill.bytes += m.size
            fill.outcomes[outcome] += 1
            if len(batch.messages) >= per_batch:
                if to_topic:
                    _flush_topic(topics, tbatch)
                    tbatch = _Batch()
                else:
                    _flush_queue(queues, qbatch, fill)
                    qbatch = _Batch()
            if i and i % 100_000 == 0:
                _say(f"fill: {i:,} messages")
        if qbatch.messages:
            _flush_queue(queues, qbatch, fill)
        if tbatch.messages:
            _flush_topic(topics, tbatch)
    finally:
        queues.close()
        topics.close()
    fill.seconds = time.perf_counter() - began
    fill.messages = messages
    for store in find_stores(data):
        present = list_segments(store)
        fill.segments += len(present)
        fill.archived_segments += sum(1 for seg in present if seg.archived)
    return fill


# -- 2. raw scan -----------------------------------------------------------------------------


@dataclass
class Scan:
    seconds: float
    rows: int
    bytes: int


def raw_scan(data: Path) -> Scan:
    """Every row the export reads, with the export's own queries and connections (read-only,
    format checked), fetched with plain sqlite3 and not converted."""
    rows = size = 0
    began = time.perf_counter()
    for store in find_stores(data):
        segments = list_segments(store)
        for seg in segments:  # the settlements and delivery counts the export looks up
            with open_segment(seg.path) as conn:
                conn.execute(SETTLEMENTS_SQL).fetchall()
                conn.execute(DELIVERIES_SQL).fetchall()
        for seg in segments:  # its read_segment (and pending_counts for a topic store)
            with open_segment(seg.path) as conn:
                conn.execute("BEGIN")
                conn.execute(SEALED_SQL).fetchone()
                found = conn.execute(MESSAGES_SQL, (0,)).fetchall()
                conn.execute("COMMIT")
            rows += len(found)
            size += sum(r[8] for r in found)
            if found:
                pending_counts(store.registry, found[0][0], found[-1][0])
    return Scan(time.perf_counter() - began, rows, size)


# -- 3. export -------------------------------------------------------------------------------


def _export(data: Path, out: Path, options: Options, scan: Scan) -> dict[str, Any]:
    began = time.perf_counter()
    summary = export(data, out, options)
    seconds = time.perf_counter() - began
    parquet = sum(p.stat().st_size for p in out.rglob("*.parquet"))
    return {
        "seconds": round(seconds, 3),
        "rows": summary.rows,
        "source_bytes": summary.bytes,
        "files": summary.files_written,
        "segments_read": summary.segments_read,
        "parquet_bytes": parquet,
        "rows_per_s": _rate(summary.rows, seconds),
        "source_mb_per_s": _rate(summary.bytes / MB, seconds),
        "parquet_mb_per_s": _rate(parquet / MB, seconds),
        "x_raw_scan": round(seconds / scan.seconds, 2) if scan.seconds > 0 else 0.0,
    }


# -- 4. ingest -------------------------------------------------------------------------------


def _start_spark() -> SparkSession:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[*]")
        .appName("mpbroker-bench-exportrate")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.range(10).count()  # a first trivial job: the executor is up
    return spark


def _stop_spark(spark: SparkSession) -> None:
    """Stop the session, then its JVM: it exits when its stdin (a pipe from us) closes."""
    from pyspark import SparkContext

    gateway: Any = SparkContext._gateway
    spark.stop()
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    with contextlib.suppress(Exception):
        gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    gc.collect()
    if proc is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except Exception:
            proc.kill()
            proc.wait(timeout=10)


def _timed(work: Any) -> tuple[float, Any]:
    began = time.perf_counter()
    result = work()
    return time.perf_counter() - began, result


def ingest_phase(out: Path, table: Path) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from spark.ingest import ingest

    start_s, spark = _timed(_start_spark)
    try:
        files = [str(p) for p in sorted(out.rglob("*.parquet")) if "_updates" not in p.parts]

        def baseline() -> tuple[int, int]:
            frame = spark.read.parquet(*files)
            n = frame.count()
            groups = frame.groupBy("destination").agg(F.count("*").alias("n")).collect()
            return n, sum(int(r["n"]) for r in groups)

        # Twice: the first pass also warms up the JVM's Parquet reading (JIT, classes); the
        # second, warm one is the baseline.
        cold_s, _ = _timed(baseline)
        baseline_s, (read_rows, grouped_rows) = _timed(baseline)

        def scan() -> None:
            # Every column the ingest reads, decoded and dropped (the noop sink writes nothing).
            spark.read.parquet(*files).drop("body").write.format("noop").mode("overwrite").save()

        scan_s, _ = _timed(scan)
        ingest_s, first = _timed(lambda: ingest(spark, out, table))
        again_s, again = _timed(lambda: ingest(spark, out, table))
        reread_s, reread = _timed(lambda: ingest(spark, out, table, reread=True))
    finally:
        _stop_spark(spark)

    def x(seconds: float, base: float = baseline_s) -> float:
        return round(seconds / base, 2) if base > 0 else 0.0

    return {
        "spark_start_s": round(start_s, 3),
        "baseline_cold_s": round(cold_s, 3),
        "baseline_s": round(baseline_s, 3),
        "baseline_rows": read_rows,
        "baseline_grouped_rows": grouped_rows,
        "scan_s": round(scan_s, 3),
        "ingest_s": round(ingest_s, 3),
        "ingest_x_baseline": x(ingest_s),
        "ingest_x_scan": x(ingest_s, scan_s),
        "ingest_rows_per_s": _rate(first.rows_appended, ingest_s),
        "ingest_rows_read": first.rows_read,
        "ingest_rows_appended": first.rows_appended,
        "ingest_rows_in_table": first.rows_in_table,
        "reingest_s": round(again_s, 3),
        "reingest_x_baseline": x(again_s),
        "reingest_x_scan": x(again_s, scan_s),
        "reingest_rows_appended": again.rows_appended,
        "reingest_rows_in_table": again.rows_in_table,
        "reread_s": round(reread_s, 3),
        "reread_x_baseline": x(reread_s),
        "reread_x_scan": x(reread_s, scan_s),
        "reread_rows_read": reread.rows_read,
        "reread_rows_appended": reread.rows_appended,
        "table_bytes": sum(p.stat().st_size for p in table.rglob("*.parquet")),
    }


# -- 3b. export memory -----------------------------------------------------------------------


@dataclass
class ProcessMemory:
    """A process run to its end, its memory sampled every few ms."""

    code: int
    peak_anonymous: int
    """Resident memory less what is mapped from files (what --max-memory bounds)."""
    peak_resident: int
    stderr: str


def process_memory(command: list[str], timeout_s: float = 600) -> ProcessMemory:
    """Run `command` to its end, sampling its memory every few milliseconds."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    watched = psutil.Process(process.pid)
    anonymous = resident = 0
    deadline = time.monotonic() + timeout_s
    try:
        while process.poll() is None and time.monotonic() < deadline:
            try:
                info = watched.memory_info()
            except psutil.Error:
                break
            anonymous = max(anonymous, info.rss - info.shared)
            resident = max(resident, info.rss)
            time.sleep(0.003)
        _, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return ProcessMemory(process.returncode, anonymous, resident, err.decode(errors="replace"))


def export_memory(data: Path, out: Path, max_memory: str) -> dict[str, Any]:
    """`mpbroker export` as a process of its own (its default --max-memory unless given)."""
    command = [sys.executable, "-m", "mpbroker", "export", "--data-dir", str(data)]
    run = process_memory([*command, "--out", str(out), "--max-memory", max_memory])
    return {
        "max_memory": max_memory,
        "code": run.code,
        "peak_anonymous_mib": round(run.peak_anonymous / (1 << 20), 1),
        "peak_resident_mib": round(run.peak_resident / (1 << 20), 1),
    }


# -- the whole run ---------------------------------------------------------------------------


def _children() -> list[str]:
    me = psutil.Process()
    left = []
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE:
                left.append(f"pid {child.pid} ({child.name()})")
    return left


def measure(
    work: Path, messages: int, size: int, destinations: int, topic_share: float
) -> dict[str, Any]:
    data, out, out_nobody, table = (
        work / "data",
        work / "export",
        work / "export-nobody",
        work / "table",
    )
    _say(f"fill: {messages:,} messages of {size} body bytes into {data}")
    fill = fill_stores(data, messages, size, destinations, topic_share)
    _say(
        f"fill: {fill.seconds:.1f} s; {fill.segments} segments ({fill.archived_segments} archived)"
    )
    _say("raw scan")
    scan = raw_scan(data)
    _say(f"raw scan: {scan.rows:,} rows in {scan.seconds:.2f} s")
    _say("export")
    exported = _export(data, out, Options(), scan)
    _say(f"export: {exported['rows']:,} rows in {exported['seconds']:.2f} s")
    _say("export --no-body")
    exported_nobody = _export(data, out_nobody, Options(body=False), scan)
    _say(f"export --no-body: {exported_nobody['seconds']:.2f} s")
    _say("export as a process, memory sampled")
    memory = export_memory(data, work / "export-memory", "128MiB")
    _say(
        f"export memory: peak {memory['peak_anonymous_mib']} MiB anonymous,"
        f" {memory['peak_resident_mib']} MiB resident"
    )
    _say("ingest (Spark local[*])")
    spark = ingest_phase(out, table)
    problems: list[str] = []
    checks = {
        "raw scan rows": scan.rows,
        "export rows": exported["rows"],
        "export --no-body rows": exported_nobody["rows"],
        "Spark baseline rows": spark["baseline_rows"],
        "rows appended by the first ingest": spark["ingest_rows_appended"],
        "table rows after the first ingest": spark["ingest_rows_in_table"],
        "table rows after the second ingest": spark["reingest_rows_in_table"],
        "rows read by the ingest without its log": spark["reread_rows_read"],
    }
    problems += [f"{name}: {n} != {messages}" for name, n in checks.items() if n != messages]
    for run in ("reingest", "reread"):
        if spark[f"{run}_rows_appended"] != 0:
            problems.append(f"{run}: appended {spark[f'{run}_rows_appended']} rows, not 0")
    if memory["code"] != 0:
        problems.append(f"mpbroker export exited with {memory['code']}")
    if exported["source_bytes"] != fill.bytes:
        problems.append(f"export bytes {exported['source_bytes']} != filled {fill.bytes}")
    left = _children()
    if left:
        problems.append("processes left: " + ", ".join(left))
    return {
        "messages": messages,
        "size": size,
        "destinations": destinations,
        "topic_share": topic_share,
        "source_bytes": fill.bytes,
        "fill": {
            "seconds": round(fill.seconds, 3),
            "rows_per_s": _rate(messages, fill.seconds),
            "segments": fill.segments,
            "archived_segments": fill.archived_segments,
            "outcomes": dict(fill.outcomes),
            "redelivered": fill.redelivered,
        },
        "raw_scan": {
            "seconds": round(scan.seconds, 3),
            "rows": scan.rows,
            "rows_per_s": _rate(scan.rows, scan.seconds),
            "source_mb_per_s": _rate(scan.bytes / MB, scan.seconds),
        },
        "export": exported,
        "export_no_body": exported_nobody,
        "export_memory": memory,
        "ingest": spark,
        "problems": problems,
        "ok": not problems,
    }


def format_summary(s: dict[str, Any]) -> str:
    f, r, e, nb, i = s["fill"], s["raw_scan"], s["export"], s["export_no_body"], s["ingest"]
    outcomes = ", ".join(f"{k} {v:,}" for k, v in sorted(f["outcomes"].items()))
    lines = [
        f"{s['messages']:,} messages of {s['size']} body bytes ({s['source_bytes'] / MB:.1f} MB"
        f" with headers), {s['destinations']} queues + 1 topic ({s['topic_share']:.0%})",
        f"fill:       {f['seconds']:8.2f} s  {f['rows_per_s']:>12,.0f} rows/s   {f['segments']}"
        f" segments ({f['archived_segments']} archived); {outcomes}",
        f"raw scan:   {r['seconds']:8.2f} s  {r['rows_per_s']:>12,.0f} rows/s"
        f"  {r['source_mb_per_s']:8.1f} MB/s   (baseline)",
    ]
    for name, x in (("export:", e), ("--no-body:", nb)):
        lines.append(
            f"{name:<11} {x['seconds']:8.2f} s  {x['rows_per_s']:>12,.0f} rows/s"
            f"  {x['source_mb_per_s']:8.1f} MB/s source, {x['parquet_mb_per_s']:.1f} MB/s"
            f" Parquet ({x['parquet_bytes'] / MB:.1f} MB, {x['files']} files);"
            f" x{x['x_raw_scan']} the raw scan"
        )
    m = s["export_memory"]
    lines += [
        f"memory:     peak {m['peak_anonymous_mib']} MiB anonymous ({m['peak_resident_mib']} MiB"
        f" resident with the libraries) of mpbroker export --max-memory {m['max_memory']}",
        f"spark start:{i['spark_start_s']:8.2f} s  (JVM and a first job; not in the figures below)",
        f"read+count: {i['baseline_s']:8.2f} s  (baseline: count and groupBy(destination);"
        f" {i['baseline_cold_s']:.2f} s the first, cold time)",
        f"full scan:  {i['scan_s']:8.2f} s  (every column but the body, to Spark's noop sink)",
        f"ingest:     {i['ingest_s']:8.2f} s  {i['ingest_rows_per_s']:>12,.0f} rows/s"
        f"   x{i['ingest_x_baseline']} the baseline, x{i['ingest_x_scan']} the full scan;"
        f" table {i['table_bytes'] / MB:.1f} MB",
        f"re-ingest:  {i['reingest_s']:8.2f} s  x{i['reingest_x_baseline']} the baseline,"
        f" x{i['reingest_x_scan']} the full scan ({i['reingest_rows_appended']} rows appended;"
        " every file in the ingest log)",
        f"without log: {i['reread_s']:7.2f} s  x{i['reread_x_baseline']} the baseline,"
        f" x{i['reread_x_scan']} the full scan ({i['reread_rows_read']:,} rows read and"
        f" anti-joined, {i['reread_rows_appended']} appended)",
    ]
    lines += [f"PROBLEM: {p}" for p in s["problems"]]
    lines.append("ok" if s["ok"] else "FAILED")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.exportrate",
        description="Fill a data directory, then time mpbroker export (against a raw sqlite3"
        " scan) and the Spark ingest job (against a plain read and count).",
    )
    parser.add_argument("--messages", type=int, default=1_000_000, help="default 1000000")
    parser.add_argument("--size", type=int, default=200, help="body bytes (default 200)")
    parser.add_argument(
        "--destinations", type=int, default=10, help="queues (default 10), plus one topic"
    )
    parser.add_argument(
        "--topic-share", type=float, default=0.2, help="share of messages to the topic (0.2)"
    )
    parser.add_argument(
        "--keep", type=Path, metavar="DIR", help="work in DIR (new or empty) and leave it"
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.size < 1 or args.destinations < 1:
        parser.error("--messages, --size and --destinations must be at least 1")
    if not 0 <= args.topic_share < 1:
        parser.error("--topic-share must be in [0, 1)")
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        parser.error(f"--keep {args.keep}: not empty")
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        work = args.keep
    else:
        work = Path(tempfile.mkdtemp(prefix="mpbroker-exportrate-"))
    try:
        summary = measure(work, args.messages, args.size, args.destinations, args.topic_share)
    except Exception as exc:
        _say(f"aborted: {type(exc).__name__}: {exc}")
        return 1
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(format_summary(summary), flush=True)
    if args.json:
        print(json.dumps(summary), flush=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
