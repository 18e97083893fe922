"""What each filesystem scheme can hold (pure), and the lock a run holds on a table where
the filesystem has no flock (an exclusive create, tried here on the local filesystem)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark.tablefs import CREATE, FLOCK, TableFS, TableFSError, support
from tests.spark.conftest import PY4J_SOCKETS


@pytest.mark.parametrize(
    ("scheme", "lock"),
    [("file", FLOCK), ("hdfs", CREATE), ("viewfs", CREATE), ("abfss", CREATE), ("HDFS", CREATE)],
)
def test_filesystems_that_rename_atomically_can_hold_the_table(scheme: str, lock: str) -> None:
    can = support(scheme)
    assert (can.lock, can.atomic_rename, can.why_not) == (lock, True, "")


@pytest.mark.parametrize("scheme", ["s3a", "s3", "gs", "wasbs", "oss"])
def test_object_stores_cannot_and_say_why(scheme: str) -> None:
    can = support(scheme)
    assert (can.lock, can.atomic_rename) == (None, False)
    assert "renames by copying" in can.why_not


def test_an_unknown_scheme_is_assumed_to_give_nothing() -> None:
    can = support("ftp")
    assert (can.lock, can.atomic_rename) == (None, False)
    assert "does not know" in can.why_not and "hdfs" in can.why_not


@pytest.mark.slow
@PY4J_SOCKETS
def test_an_exclusive_create_lock_keeps_a_second_run_out_and_names_a_leftover(
    spark: SparkSession, tmp_path: Path
) -> None:
    fs = TableFS(spark, tmp_path.as_uri())
    assert fs.scheme == "file" and fs.local_path() == tmp_path
    with fs._create_lock("_ingest.lock"):
        holder = (tmp_path / "_ingest.lock").read_text()
        assert " pid " in holder
        refused = pytest.raises(TableFSError, match="another ingest into this table holds its lock")
        with refused, fs._create_lock("_ingest.lock"):
            pass
    assert not (tmp_path / "_ingest.lock").exists()  # released: deleted

    (tmp_path / "_ingest.lock").write_text("host pid 1 since then")  # a killed run's
    with (
        pytest.raises(TableFSError, match="if none is running") as info,
        fs._create_lock("_ingest.lock"),
    ):
        pass
    assert "host pid 1 since then" in str(info.value)

    # Left by a run of this host that has ended: taken over, and said so.
    ended = subprocess.Popen(["true"])
    ended.wait()
    left = f"{socket.gethostname()} pid {ended.pid} since then"
    (tmp_path / "_ingest.lock").write_text(left)
    with fs._create_lock("_ingest.lock") as taken_over:
        assert taken_over is not None and left in taken_over
        assert f" pid {os.getpid()} " in (tmp_path / "_ingest.lock").read_text()
    # One of this host that still runs is not.
    (tmp_path / "_ingest.lock").write_text(f"{socket.gethostname()} pid {os.getpid()} since then")
    with pytest.raises(TableFSError, match="holds its lock"), fs._create_lock("_ingest.lock"):
        pass


@pytest.mark.slow
@PY4J_SOCKETS
def test_files_are_written_whole_and_listed_relative_to_the_root(
    spark: SparkSession, tmp_path: Path
) -> None:
    fs = TableFS(spark, str(tmp_path))
    fs.create_text("a/b/state.json", "{}")
    assert (tmp_path / "a" / "b" / "state.json").read_text() == "{}"
    assert [e.name for e in fs.list(recursive=True)] == ["a/b/state.json"]
    assert not list(tmp_path.rglob("*.crc"))  # the job's own files carry no checksum file
    with pytest.raises(TableFSError, match=r"rename: .*does not exist"):
        fs.rename("a/missing", "a/c")
