"""The manifest: what is new, round trips, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mpbroker.export import ExportError, Manifest, Options, after_seq
from mpbroker.export._manifest import (
    check_options,
    file_name,
    parse_manifest,
    record,
    source_key,
)

PATH = Path("out/mpbroker-export.json")


def test_a_new_segment_is_exported_from_the_start() -> None:
    assert after_seq(Manifest(Options()), "p2p-0/seg-00000001") == 0


def test_a_complete_segment_is_never_read_again() -> None:
    m = record(Manifest(Options()), "k", upto_seq=10, complete=True, rows=10, written="f")
    assert after_seq(m, "k") is None


def test_an_active_segment_continues_after_the_highest_seq_read() -> None:
    m = record(Manifest(Options()), "k", upto_seq=10, complete=False, rows=4, written="a")
    assert after_seq(m, "k") == 10
    m = record(m, "k", upto_seq=25, complete=True, rows=3, written="b")
    assert after_seq(m, "k") is None
    entry = m.segments["k"]
    assert (entry.upto_seq, entry.rows, entry.files) == (25, 7, ("a", "b"))


def test_file_names_are_deterministic_per_part() -> None:
    assert file_name("p2p-0", 3, 0) == "p2p-0/seg-00000003.parquet"
    assert file_name("p2p-0", 3, 120) == "p2p-0/seg-00000003.after-120.parquet"
    assert source_key("pubsub-1", 2) == "pubsub-1/seg-00000002"


def test_round_trip() -> None:
    m = record(
        Manifest(Options("/queue/*", 5, False)),
        "k",
        upto_seq=3,
        complete=False,
        rows=2,
        written="x",
    )
    assert parse_manifest(m.to_json(), PATH) == m


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "damaged manifest"),
        ('{"format": "other"}', "not an mpbroker export manifest"),
        ('{"format": "mpbroker-export", "manifest_version": 99}', "manifest version 99"),
        (
            '{"format": "mpbroker-export", "manifest_version": 1, "schema_version": 99}',
            "schema version 99",
        ),
        (
            '{"format": "mpbroker-export", "manifest_version": 1, "schema_version": 1}',
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
    assert data["manifest_version"] == 1
    assert data["schema_version"] == 1
