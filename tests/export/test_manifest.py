"""The manifest: what is new, round trips, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mpbroker.export import ExportError, FileEntry, Manifest, Options, after_seq
from mpbroker.export._manifest import (
    MANIFEST_NAME,
    check_options,
    file_name,
    parse_file_name,
    parse_manifest,
    record,
    record_updates,
    source_key,
    update_file_name,
)

PATH = Path("out") / MANIFEST_NAME


def entry(name: str, rows: int, pending: int | None = 0) -> FileEntry:
    return FileEntry(name, rows, pending)


def test_a_new_segment_is_exported_from_the_start() -> None:
    assert after_seq(Manifest(Options()), "p2p-0/seg-00000001") == 0


def test_a_complete_segment_is_never_read_again() -> None:
    m = record(Manifest(Options()), "k", upto_seq=10, complete=True, written=entry("f", 10))
    assert after_seq(m, "k") is None


def test_an_active_segment_continues_after_the_highest_seq_read() -> None:
    m = record(Manifest(Options()), "k", upto_seq=10, complete=False, written=entry("a", 4))
    assert after_seq(m, "k") == 10
    m = record(m, "k", upto_seq=25, complete=True, written=entry("b", 3))
    assert after_seq(m, "k") is None
    got = m.segments["k"]
    assert (got.upto_seq, got.rows) == (25, 7)
    assert [f.name for f in got.files] == ["a", "b"]


def test_file_names_are_deterministic_per_part() -> None:
    assert file_name("p2p-0", 3, 0) == "p2p-0/seg-00000003.parquet"
    assert file_name("p2p-0", 3, 120) == "p2p-0/seg-00000003.after-120.parquet"
    assert source_key("pubsub-1", 2) == "pubsub-1/seg-00000002"
    assert (
        update_file_name("p2p-0/seg-00000003.after-120.parquet", 4)
        == "_updates/p2p-0/seg-00000003.after-120.updates-4.parquet"
    )


def test_a_row_file_name_gives_back_its_segment_and_part() -> None:
    """What adopting a row file an interrupted run did not record starts from."""
    for after in (0, 120):
        assert parse_file_name(file_name("pubsub-1", 3, after)) == ("pubsub-1/seg-00000003", after)
    for other in (
        "p2p-0/seg-00000003.after-0.parquet",
        "p2p-0/seg-3.parquet",
        "p2p-0/other.parquet",
        "seg-00000003.parquet",
        "_updates/p2p-0/seg-00000003.updates-4.parquet",
    ):
        assert parse_file_name(other) is None


def test_files_with_pending_rows_stay_open_until_none_is_pending() -> None:
    m = record(Manifest(Options()), "k", upto_seq=9, complete=True, written=entry("a", 9, 5))
    m = record(m, "j", upto_seq=3, complete=True, written=entry("b", 3, 0))
    assert [(k, f.name) for k, f in m.open_files()] == [("k", "a")]
    m = record_updates(m, "k", "a", pending=2, rows=9, update="a.u1")
    assert m.segments["k"].files[0] == FileEntry("a", 9, 2, ("a.u1",))
    m = record_updates(m, "k", "a", pending=0, rows=9, update="a.u2")
    assert m.open_files() == []
    assert m.files() == {"a", "a.u1", "a.u2", "b"}


def test_a_version_1_manifest_is_read_with_its_files_to_be_counted() -> None:
    v1 = {
        "format": "mpbroker-export",
        "manifest_version": 1,
        "schema_version": 1,
        "options": {"destination": None, "since_ms": None, "body": True},
        "segments": {
            "p2p-0/seg-00000001": {"upto_seq": 5, "complete": True, "rows": 5, "files": ["x"]}
        },
    }
    m = parse_manifest(json.dumps(v1), PATH)
    assert m.runs == 0
    assert m.segments["p2p-0/seg-00000001"].files == (FileEntry("x", 0, None),)
    assert [f.name for _, f in m.open_files()] == ["x"]


def test_round_trip() -> None:
    m = record(
        Manifest(Options("/queue/*", 5, False), runs=3),
        "k",
        upto_seq=3,
        complete=False,
        written=entry("x", 2, 1),
    )
    m = record_updates(m, "k", "x", pending=1, rows=2, update="x.u")
    assert parse_manifest(m.to_json(), PATH) == m


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "damaged manifest"),
        ('{"format": "other"}', "not an mpbroker export manifest"),
        ('{"format": "mpbroker-export", "manifest_version": 99}', "manifest version 99"),
        (
            '{"format": "mpbroker-export", "manifest_version": 2, "schema_version": 99}',
            "schema version 99",
        ),
        (
            '{"format": "mpbroker-export", "manifest_version": 2, "schema_version": 2}',
            "damaged manifest",
        ),
    ],
)
def test_bad_manifests_are_refused_naming_the_file(text: str, match: str) -> None:
    with pytest.raises(ExportError, match=match) as info:
        parse_manifest(text, PATH)
    assert info.value.path == PATH
    assert str(PATH) in str(info.value)


def test_other_options_are_refused() -> None:
    m = Manifest(Options(destination="/queue/*"))
    check_options(m, Options(destination="/queue/*"), PATH)
    with pytest.raises(ExportError, match="another --out"):
        check_options(m, Options(), PATH)


def test_the_json_names_its_versions() -> None:
    data = json.loads(Manifest(Options()).to_json())
    assert data["format"] == "mpbroker-export"
    assert data["manifest_version"] == 2
    assert data["schema_version"] == 2
    assert MANIFEST_NAME.startswith("_")  # dataset readers skip it
