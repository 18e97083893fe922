"""The ingest on a real standalone Spark cluster: a master and a worker started here from the
installed PySpark (loopback only), the job submitted to it with `spark-submit` as a user
runs it, export and table as file:// URIs, the export a real broker's. It appends the rows,
then applies the outcomes a later export found; the table is checked by an independent
pyarrow read, exactly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from mpbroker.export import Options, export
from mpbroker.harness import BrokerProcess, RawClient
from tests.e2e.test_export import consume_and_ack, send_all

RawFactory = Callable[[BrokerProcess], RawClient]

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ENV = dict(
    os.environ,
    SPARK_LOCAL_IP="127.0.0.1",
    SPARK_MASTER_HOST="127.0.0.1",
    PYSPARK_PYTHON=sys.executable,
    PYTHONPATH=str(ROOT),
)


class Daemon:
    """A Spark daemon (`spark-class CLASS ...`) in a session of its own, its log followed."""

    def __init__(self, log: Path, *argv: str) -> None:
        self.log = log
        # Kept open while the daemon runs (closed by stop).
        self.handle = open(log, "w")  # noqa: SIM115
        self.process = subprocess.Popen(
            [str(BIN / "spark-class"), *argv],
            env=ENV,
            stdout=self.handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its JVM and children: one killpg ends them
        )

    def wait_for(self, pattern: str, timeout_s: float = 90) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(pattern, self.log.read_text(errors="replace"))
            if found is not None:
                return found
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} in {self.log} within {timeout_s} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.handle.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    """A standalone master and one worker (1 core, 1 GiB) on 127.0.0.1: the master URL."""
    master = Daemon(
        tmp_path / "master.log",
        "org.apache.spark.deploy.master.Master",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--webui-port",
        "0",
    )
    worker: Daemon | None = None
    try:
        url = master.wait_for(r"Starting Spark master at (spark://127\.0\.0\.1:\d+)").group(1)
        master.wait_for(r"I have been elected leader")
        work = tmp_path / "worker"
        work.mkdir()
        worker = Daemon(
            tmp_path / "worker.log",
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--webui-port",
            "0",
            "--cores",
            "1",
            "--memory",
            "1g",
            "--work-dir",
            str(work),
            url,
        )
        worker.wait_for(r"Successfully registered with master")
        yield url
    finally:
        if worker is not None:
            worker.stop()
        master.stop()


def submit(
    master: str, export_uri: str, table_uri: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    """`spark-submit spark/ingest.py` from outside the checkout, as on a cluster's edge node:
    the job and its helpers import as scripts beside it (the `spark` package is not
    importable there)."""
    return subprocess.run(
        [
            str(BIN / "spark-submit"),
            "--master",
            master,
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.executor.memory=512m",
            str(ROOT / "spark" / "ingest.py"),
            "--input",
            export_uri,
            "--output",
            table_uri,
            *extra,
        ],
        cwd=ROOT.parent,
        env={k: v for k, v in ENV.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=600,
    )


def counts(table: Path) -> Counter[tuple[str, str]]:
    rows = ds.dataset(table, format="parquet", partitioning="hive").to_table(
        columns=["destination", "outcome", "store", "seq"]
    )
    d = rows.to_pydict()
    assert len(set(zip(d["store"], d["seq"], strict=True))) == rows.num_rows  # no row twice
    return Counter(zip(d["destination"], d["outcome"], strict=True))


def test_the_job_runs_on_a_standalone_cluster(
    cluster: str, start_broker: type[BrokerProcess], raw: RawFactory, tmp_path: Path
) -> None:
    """A real broker's export while 300 messages wait, then after they were consumed."""
    broker = start_broker("--gateways", "1")
    producer = raw(broker)
    producer.connect()
    send_all(producer, "/queue/cluster-a", [{}] * 400)
    send_all(producer, "/queue/cluster-b", [{}] * 100)
    consumer = raw(broker)
    consumer.connect()
    consume_and_ack(consumer, "/queue/cluster-a", 100)
    out = tmp_path / "export"
    table = tmp_path / "table"
    export(broker.data_dir, out, Options())  # live: 300 of cluster-a pending

    first = submit(cluster, out.as_uri(), table.as_uri())
    assert first.returncode == 0, first.stderr[-3000:]
    assert "500 rows read, 500 appended" in first.stdout
    assert counts(table) == {
        ("/queue/cluster-a", "acked"): 100,
        ("/queue/cluster-a", "pending"): 300,
        ("/queue/cluster-b", "pending"): 100,
    }

    later = raw(broker)
    later.connect()
    consume_and_ack(later, "/queue/cluster-a", 300)
    assert broker.stop() == 0
    assert export(broker.data_dir, out, Options()).outcomes_found == {"acked": 300}
    chart = tmp_path / "report.png"
    second = submit(cluster, out.as_uri(), table.as_uri(), "--chart", str(chart))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "300 outcomes updated" in second.stdout
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert counts(table) == {
        ("/queue/cluster-a", "acked"): 400,
        ("/queue/cluster-b", "pending"): 100,
    }
