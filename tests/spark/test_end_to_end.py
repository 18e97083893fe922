"""From a real broker to the Spark table: persistent messages on several queues and a topic
with a durable subscriber, some acked, some expired, some dead-lettered; `mpbroker export`
after the broker stopped; the ingest job as a user runs it (`python -m spark.ingest
--chart`); the table's counts per destination and outcome equal what the test did, exactly;
running export and ingest again adds nothing."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from mpbroker.cli import main as mpbroker_main
from mpbroker.export import Options, export
from mpbroker.harness import BrokerProcess, RawClient
from spark.ingest import ingest
from tests.commands import EXPORT_IN_PROCESS
from tests.e2e.test_export import consume_and_ack, register_durable, send_all
from tests.spark.conftest import PY4J_SOCKETS

RawFactory = Callable[[BrokerProcess], RawClient]

pytestmark = [pytest.mark.slow, PY4J_SOCKETS]

# A NACKed message goes straight to /queue/DLQ.<name>; expiry is scanned every 0.2 s.
CONFIG = "[queues]\nexpiry_scan_interval_s = 0.2\nmax_redeliveries = 0\n"
TTL = {"ttl": "300"}

EXPECTED = {
    ("/queue/e2e-a", "acked"): 400,
    ("/queue/e2e-a", "pending"): 600,
    ("/queue/e2e-b", "expired"): 200,
    ("/queue/e2e-b", "pending"): 800,
    ("/queue/e2e-c", "dead-lettered"): 50,
    ("/queue/e2e-c", "pending"): 450,
    ("/queue/DLQ.e2e-c", "pending"): 50,
    ("/topic/e2e", "expired"): 100,
    ("/topic/e2e", "acked"): 300,
    ("/topic/e2e", "pending"): 600,
}


def wait_for_expiry(broker: BrokerProcess, queued: int, stored_topic: int) -> None:
    """Until the broker logged the expiry of `queued` queue and `stored_topic` durable
    topic messages."""

    def total(pattern: str) -> int:
        return sum(int(n) for n in re.findall(pattern, broker.log_text()))

    deadline = time.monotonic() + 30
    while (
        total(r"expired (\d+) messages") < queued
        or total(r"expired (\d+) stored topic messages") < stored_topic
    ):
        assert time.monotonic() < deadline, "the expected messages did not expire in 30 s"
        time.sleep(0.1)


def nack(client: RawClient, destination: str, count: int) -> None:
    client.send("SUBSCRIBE", {"destination": destination, "id": "n", "ack": "client-individual"})
    for _ in range(count):
        client.send("NACK", {"id": client.recv(timeout=15).headers["ack"]})
    client.send("DISCONNECT", {"receipt": "bye"})
    assert client.recv(timeout=15).command == "RECEIPT"


def independent_counts(table: Path) -> Counter[tuple[str, str]]:
    """The table read by pyarrow, not Spark: each (store, seq) once."""
    import pyarrow.dataset as ds

    d = (
        ds.dataset(table, format="parquet", partitioning="hive")
        .to_table(columns=["destination", "outcome", "store", "seq"])
        .to_pydict()
    )
    assert len(set(zip(d["store"], d["seq"], strict=True))) == len(d["seq"])
    return Counter(zip(d["destination"], d["outcome"], strict=True))


def table_counts(spark: SparkSession, table: Path) -> Counter[tuple[str, str]]:
    rows = spark.read.parquet(str(table)).groupBy("destination", "outcome").count().collect()
    return Counter({(r["destination"], r["outcome"]): int(r["count"]) for r in rows})


def test_broker_to_spark_table(
    start_broker: type[BrokerProcess], raw: RawFactory, spark: SparkSession, tmp_path: Path
) -> None:
    broker = start_broker("--gateways", "1", config=CONFIG)
    register_durable(raw(broker), "/topic/e2e")

    # Each outcome in a phase of its own, so that every delivery is settled as planned
    # (a message delivered beyond what a consumer settles would come back redelivered,
    # which with max_redeliveries = 0 is a dead letter).
    producer = raw(broker)
    producer.connect()
    send_all(producer, "/queue/e2e-b", [TTL] * 200)
    send_all(producer, "/topic/e2e", [TTL] * 100)
    wait_for_expiry(broker, queued=200, stored_topic=100)

    send_all(producer, "/queue/e2e-a", [{}] * 400)
    send_all(producer, "/topic/e2e", [{}] * 300)
    # While the broker runs, these 700 wait: exported and ingested as pending, their
    # outcomes come with the next export, as update files, and the next ingest applies them.
    out = tmp_path / "export"
    table = tmp_path / "table"
    export(broker.data_dir, out, Options())
    early = ingest(spark, out, table)
    assert table_counts(spark, table)[("/queue/e2e-a", "pending")] == 400
    assert early.rows_in_table == 1000
    consumer = raw(broker)
    consumer.connect()
    consume_and_ack(consumer, "/queue/e2e-a", 400)
    back = raw(broker)
    back.connect(**{"client-id": "app"})
    consume_and_ack(back, "/topic/e2e", 300, **{"activemq.subscriptionName": "sub1"})

    send_all(producer, "/queue/e2e-c", [{}] * 50)
    nacker = raw(broker)
    nacker.connect()
    nack(nacker, "/queue/e2e-c", 50)

    send_all(producer, "/queue/e2e-a", [{}] * 600)
    send_all(producer, "/queue/e2e-b", [{}] * 800)
    send_all(producer, "/queue/e2e-c", [{}] * 450)
    send_all(producer, "/topic/e2e", [{}] * 600)
    assert broker.stop() == 0

    assert (
        mpbroker_main(
            ["export", "--data-dir", str(broker.data_dir), "--out", str(out), *EXPORT_IN_PROCESS]
        )
        == 0
    )
    chart = tmp_path / "report.png"
    command = [sys.executable, "-m", "spark.ingest", "--input", str(out), "--output", str(table)]
    job = subprocess.run(
        [*command, "--master", "local[2]", "--chart", str(chart)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert job.returncode == 0, job.stderr
    total = sum(EXPECTED.values())
    later = total - 1000
    assert f"{later} rows read, {later} appended" in job.stdout
    assert "700 outcomes updated" in job.stdout
    assert f"chart: {chart}" in job.stdout

    assert table_counts(spark, table) == EXPECTED
    assert independent_counts(table) == EXPECTED
    (part,) = (table / "_reports" / "outcomes").glob("part-*.csv")
    with open(part, newline="") as fh:
        outcomes = {row["destination"]: row for row in csv.DictReader(fh)}
    assert outcomes["/queue/e2e-c"]["dead_lettered"] == "50"
    assert outcomes["/topic/e2e"]["expired"] == "100"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Again: the export finds nothing new, the ingest appends nothing.
    again_export = export(broker.data_dir, out, Options())
    assert (again_export.rows, again_export.update_files) == (0, 0)
    again = ingest(spark, out, table)
    assert (again.files_read, again.rows_appended, again.rows_in_table) == (0, 0, total)
    assert table_counts(spark, table) == EXPECTED
