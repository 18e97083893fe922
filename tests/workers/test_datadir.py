"""The data dir before anything starts: usable or not (and why), and the partitioning its
stores were made with."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from mpbroker.config import ConfigError
from mpbroker.routing import Topology
from mpbroker.workers.datadir import (
    LOCK_FILE,
    PARTITIONS_FILE,
    DataDirError,
    DataDirInUse,
    DataDirLock,
    PartitionMismatch,
    check_data_dir,
    owner_only,
    read_partitions,
    write_partitions,
)
from tests.filesystems import fill, small_tmpfs


def test_a_missing_data_dir_is_made(tmp_path: Path) -> None:
    check_data_dir(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()
    assert list((tmp_path / "a" / "b").iterdir()) == []  # the probe is gone


def test_a_data_dir_that_is_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(DataDirError) as caught:
        check_data_dir(tmp_path / "file")
    assert str(caught.value) == f"data dir {tmp_path / 'file'}: not a directory"
    with pytest.raises(DataDirError, match="cannot reach it \\(Not a directory\\)"):
        check_data_dir(tmp_path / "file" / "sub")


def test_a_store_directory_that_is_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "p2p-0").write_text("")
    with pytest.raises(DataDirError, match="p2p-0: not a directory \\(a store directory"):
        check_data_dir(tmp_path)


def test_a_read_only_filesystem_is_named(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "ro", "1m", read_only=True) as mount:
        with pytest.raises(DataDirError) as caught:
            check_data_dir(mount)
        assert str(caught.value) == f"data dir {mount}: not writable (Read-only file system)"
        with pytest.raises(DataDirError, match="cannot create it \\(Read-only file system\\)"):
            check_data_dir(mount / "sub")


def test_partitions_are_recorded_owner_only_and_read_back(tmp_path: Path) -> None:
    assert read_partitions(tmp_path) is None  # a new data dir
    write_partitions(tmp_path, Topology(3, 2, "DLQ."))
    path = tmp_path / PARTITIONS_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    record = read_partitions(tmp_path)
    assert record is not None
    assert (record.p2p_workers, record.pubsub_workers, record.dead_letter_prefix) == (3, 2, "DLQ.")
    record.check(Topology(3, 2, "DLQ."))


def test_a_data_dir_from_before_the_record_is_read_from_its_store_names(tmp_path: Path) -> None:
    for name in ("p2p-0", "p2p-1", "pubsub-2", "p2p-0-temp", "pubsub-2-temp"):
        (tmp_path / name).mkdir()
    (tmp_path / "pubsub-2-durable.db").write_text("")
    record = read_partitions(tmp_path)
    assert record is not None
    assert (record.p2p_workers, record.pubsub_workers, record.dead_letter_prefix) == (2, 1, None)
    record.check(Topology(2, 1, "anything."))  # the prefix is not known: not checked


def test_other_counts_are_refused_naming_the_setting(tmp_path: Path) -> None:
    write_partitions(tmp_path, Topology(2, 1, "DLQ."))
    record = read_partitions(tmp_path)
    assert record is not None
    with pytest.raises(PartitionMismatch) as caught:
        record.check(Topology(1, 1, "DLQ."))
    assert isinstance(caught.value, ConfigError)  # exit code 2, like any refused setting
    assert str(caught.value).startswith(
        "config: broker.p2p_workers = 1: the data dir's stores were made with 2 (recorded in "
        f"{PARTITIONS_FILE}): each destination's messages are in the store its name hashes to"
    )
    assert "Set broker.p2p_workers = 2 (or 0)" in str(caught.value)
    with pytest.raises(PartitionMismatch, match=r"broker\.pubsub_workers = 3"):
        record.check(Topology(2, 3, "DLQ."))
    with pytest.raises(PartitionMismatch, match=r"queues\.dead_letter_prefix = 'X\.'"):
        record.check(Topology(2, 1, "X."))


def test_the_dead_letter_prefix_matters_only_with_several_p2p_workers(tmp_path: Path) -> None:
    write_partitions(tmp_path, Topology(1, 1, "DLQ."))
    record = read_partitions(tmp_path)
    assert record is not None
    record.check(Topology(1, 1, "X."))


def test_a_damaged_record_is_named(tmp_path: Path) -> None:
    (tmp_path / PARTITIONS_FILE).write_text(json.dumps({"p2p_workers": 1}))
    with pytest.raises(DataDirError, match=f"{PARTITIONS_FILE}: damaged"):
        read_partitions(tmp_path)


def test_a_full_filesystem_is_usable_and_the_record_says_why_it_is_missing(
    tmp_path: Path,
) -> None:
    """The stores start on a full filesystem (their disk reserve): so does the check. The
    record cannot be written there, which is said, not raised."""
    with small_tmpfs(tmp_path / "full", "1m") as mount:
        fill(mount / "filler")
        check_data_dir(mount)
        problem = write_partitions(mount, Topology(1, 1, "DLQ."))
        assert problem == (
            f"cannot record the partitions in {mount / PARTITIONS_FILE} (No space left on device)"
        )
        assert sorted(p.name for p in mount.iterdir()) == ["filler"]  # no temporary file left
        (mount / "filler").unlink()
        assert write_partitions(mount, Topology(1, 1, "DLQ.")) is None
        before = (mount / PARTITIONS_FILE).stat().st_mtime_ns
        assert write_partitions(mount, Topology(1, 1, "DLQ.")) is None  # the same: not rewritten
        assert (mount / PARTITIONS_FILE).stat().st_mtime_ns == before


def test_owner_only_takes_group_and_other_bits_off_and_counts_what_it_changed(
    tmp_path: Path,
) -> None:
    (tmp_path / "p2p-0").mkdir(mode=0o755)
    os.chmod(tmp_path / "p2p-0", 0o755)
    (tmp_path / "p2p-0" / "seg-1.db").write_text("")
    os.chmod(tmp_path / "p2p-0" / "seg-1.db", 0o640)
    (tmp_path / "mine").write_text("")
    os.chmod(tmp_path / "mine", 0o600)
    (tmp_path / "link").symlink_to("/etc/hostname")
    os.chmod(tmp_path, 0o750)
    assert owner_only(tmp_path) == 3
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "p2p-0").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "p2p-0" / "seg-1.db").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "mine").stat().st_mode) == 0o600
    assert owner_only(tmp_path) == 0  # nothing left to do


def test_the_data_dir_lock_is_one_brokers_at_a_time(tmp_path: Path) -> None:
    lock = DataDirLock.acquire(tmp_path)
    path = tmp_path / LOCK_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == f"{os.getpid()}\n"
    # Another open of the file (as another broker's) cannot have it; it names the holder.
    with pytest.raises(DataDirInUse) as refused:
        DataDirLock.acquire(tmp_path)
    assert refused.value.pid == os.getpid()
    assert str(refused.value).startswith(f"data dir {tmp_path}: in use by another broker (pid ")
    lock.release()
    lock.release()  # idempotent
    # Free again, whatever the file says (a broker that was killed leaves it).
    path.write_text("999999999\n")
    DataDirLock.acquire(tmp_path).release()
