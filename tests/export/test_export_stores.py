"""The export against real store files written by MessageStore and TopicStore (no broker
process): counts and outcomes read back from the Parquet files, incremental runs, refusals."""

from __future__ import annotations

import fcntl
import io
import json
import stat
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mpbroker.cli import main
from mpbroker.config import StoreSettings
from mpbroker.export import MANIFEST_NAME, ExportError, Options, Progress, _run, export
from mpbroker.export._manifest import LOCK_NAME
from mpbroker.records import Message
from mpbroker.stores import MessageStore, TopicStore
from tests.commands import EXPORT_IN_PROCESS
from tests.factories import make_message

# Small segments, so a few dozen messages make several sealed ones; archive on, so retired
# segments stay readable.
SETTINGS = StoreSettings(segment_max_bytes=8192, segment_max_age_s=0, archive=True)


def message(i: int, destination: str, expires_ms: int = 0) -> Message:
    """Message i of a destination, as these tests write them."""
    return make_message(
        f"{destination}-{i}",
        destination,
        headers={"n": str(i), "content-type": "text/plain"},
        body=b"x" * 200,
        timestamp_ms=1_000_000 + i,
        persistent=True,
        expires_ms=expires_ms,
    )


def export_files(out: Path, kind: bytes) -> list[Path]:
    """The export's files of one kind (b"rows" or b"updates"), by their metadata."""
    return [
        f
        for f in sorted(out.rglob("*.parquet"))
        if (pq.read_schema(f).metadata or {}).get(b"mpbroker.export.kind", b"rows") == kind
    ]


def rows_of(out: Path) -> pa.Table:
    files = export_files(out, b"rows")
    return pa.concat_tables([pq.read_table(f) for f in files]) if files else None


def current(out: Path) -> dict[tuple[str, int], dict[str, object]]:
    """(store, seq) -> row, with the update files applied (as the ingest applies them)."""
    rows = {(r["store"], r["seq"]): r for r in rows_of(out).to_pylist()}
    for f in export_files(out, b"updates"):
        for u in pq.read_table(f).to_pylist():
            row = rows[(u["store"], u["seq"])]
            assert (row["message_id"], row["destination"]) == (u["message_id"], u["destination"])
            row.update(outcome=u["outcome"], settled_at=u["settled_at"])
            row["redeliveries"] = u["redeliveries"]
    return rows


def counts(table: pa.Table) -> Counter[tuple[str, str]]:
    d = table.to_pydict()
    return Counter(zip(d["destination"], d["outcome"], strict=True))


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[Path, MessageStore, TopicStore]]:
    data = tmp_path / "data"
    queues = MessageStore.open(data / "p2p-0", SETTINGS)
    topics = TopicStore(data / "pubsub-0", data / "pubsub-0-durable.db", SETTINGS)
    topics.recover(0)
    topics.subscribe("s1", "/topic/t")
    try:
        yield data, queues, topics
    finally:
        queues.close()
        topics.close()


def fill(queues: MessageStore, topics: TopicStore, start: int, n: int) -> None:
    """n messages to each of /queue/a and /queue/b, and n to /topic/t (durable 's1')."""
    seqs_a = queues.append([message(i, "/queue/a") for i in range(start, start + n)])
    queues.append([message(i, "/queue/b", expires_ms=5) for i in range(start, start + n)])
    queues.settle(seqs_a[: n // 2], "acked", 2_000_000)
    topic_seqs = topics.append([(message(i, "/topic/t"), ["s1"]) for i in range(start, start + n)])
    topics.ack([("s1", s) for s in topic_seqs[: n // 4]], "acked", 2_000_000)


def test_export_counts_outcomes_and_is_incremental(
    stores: tuple[Path, MessageStore, TopicStore], tmp_path: Path
) -> None:
    data, queues, topics = stores
    for start in range(0, 40, 10):  # several transactions, several segments
        fill(queues, topics, start, 10)
    queues.settle(queues.expired(10, 1000), "expired", 3_000_000)
    assert len(queues.segments()) > 2
    assert any((data / "p2p-0" / "archive").iterdir())  # retired segments are exported too
    queues.record_delivery(queues.live_seqs()[:3])
    out = tmp_path / "out"

    first = export(data, out, Options())
    table = rows_of(out)
    assert counts(table) == {
        ("/queue/a", "acked"): 20,
        ("/queue/a", "pending"): 20,
        ("/queue/b", "expired"): 40,
        ("/topic/t", "acked"): 4 * (10 // 4),
        ("/topic/t", "pending"): 40 - 4 * (10 // 4),
    }
    assert first.rows == 120
    d = table.to_pydict()
    assert set(d["kind"]) == {"queue", "topic"}
    assert all(d["persistent"])
    assert {h["content-type"] for h in map(dict, d["headers"])} == {"text/plain"}
    topic_pending = [
        p
        for p, o, k in zip(d["pending_subscriptions"], d["outcome"], d["kind"], strict=True)
        if k == "topic" and o == "pending"
    ]
    assert set(topic_pending) == {1}
    assert sorted(d["redeliveries"]).count(1) == 3
    assert len(set(zip(d["store"], d["seq"], strict=True))) == 120  # no duplicate rows

    again = export(data, out, Options())
    assert (again.rows, again.files_written) == (0, 0)
    assert again.segments_skipped > 0

    # The broker "keeps running": more rows in the active segments, then only those come.
    fill(queues, topics, 100, 4)
    third = export(data, out, Options())
    assert third.rows == 12
    assert len(rows_of(out)) == 132
    d = rows_of(out).to_pydict()
    assert len(set(zip(d["store"], d["seq"], strict=True))) == 132


def test_filters_and_no_body(stores: tuple[Path, MessageStore, TopicStore], tmp_path: Path) -> None:
    data, queues, topics = stores
    fill(queues, topics, 0, 10)
    out = tmp_path / "out"
    summary = export(data, out, Options(destination="/queue/*", since_ms=1_000_005, body=False))
    assert set(summary.destinations) == {"/queue/a", "/queue/b"}
    table = rows_of(out)
    assert "body" not in table.column_names
    assert min(table.column("timestamp").to_pylist()).timestamp() * 1000 >= 1_000_005
    with pytest.raises(ExportError, match="another --out"):
        export(data, out, Options())


def test_cli_exports_and_prints_a_summary(
    stores: tuple[Path, MessageStore, TopicStore],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data, queues, topics = stores
    fill(queues, topics, 0, 10)
    out = tmp_path / "out"
    assert main(["export", "--data-dir", str(data), "--out", str(out), *EXPORT_IN_PROCESS]) == 0
    text = capsys.readouterr().out
    assert "/queue/a" in text
    assert "total" in text
    assert (out / MANIFEST_NAME).exists()


def test_progress_bar_on_a_terminal_only(
    stores: tuple[Path, MessageStore, TopicStore], tmp_path: Path
) -> None:
    data, queues, topics = stores
    fill(queues, topics, 0, 10)

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    progress = Progress(terminal)
    summary = export(data, tmp_path / "out", Options(), progress)
    progress.done()
    last = terminal.getvalue().rstrip("\n").split("\r")[-1]
    total = summary.files_written + summary.segments_skipped
    assert last == f"export [{'#' * 30}] {total}/{total} segments, {summary.rows} rows"
    assert Progress.line(1, 4, 1234) == f"export [{'#' * 7}{'-' * 23}] 1/4 segments, 1,234 rows"

    piped = io.StringIO()  # a log file or a pipe: no carriage-return noise
    export(data, tmp_path / "out2", Options(), Progress(piped))
    assert piped.getvalue() == ""


def test_not_a_store_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "something").write_text("x")
    code = main(
        [
            "export",
            "--data-dir",
            str(tmp_path / "data"),
            "--out",
            str(tmp_path / "o"),
            *EXPORT_IN_PROCESS,
        ]
    )
    assert code == 2
    assert "not an mpbroker data directory" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kind", ["foreign", "damaged"])
def test_a_bad_parquet_file_in_out_is_refused(
    stores: tuple[Path, MessageStore, TopicStore],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
) -> None:
    data, queues, topics = stores
    fill(queues, topics, 0, 10)
    out = tmp_path / "out"
    out.mkdir()
    bad = out / "other.parquet"
    if kind == "foreign":
        pq.write_table(pa.table({"a": [1, 2]}), bad)
    else:
        bad.write_bytes(b"PAR1 not really")
    code = main(["export", "--data-dir", str(data), "--out", str(out), *EXPORT_IN_PROCESS])
    assert code == 2
    err = capsys.readouterr().err
    assert str(bad) in err
    # Nothing written (but the lock file the run held).
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME, "other.parquet"]


def test_an_unknown_manifest_schema_version_is_refused(
    stores: tuple[Path, MessageStore, TopicStore], tmp_path: Path
) -> None:
    data, queues, topics = stores
    fill(queues, topics, 0, 10)
    out = tmp_path / "out"
    export(data, out, Options())
    manifest = out / MANIFEST_NAME
    manifest.write_text(manifest.read_text().replace('"schema_version": 2', '"schema_version": 7'))
    with pytest.raises(ExportError, match="schema version 7") as info:
        export(data, out, Options())
    assert info.value.path == manifest


def test_a_stopped_brokers_files_are_read_without_side_files(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with MessageStore.open(data / "p2p-0", SETTINGS) as queues:
        queues.append([message(i, "/queue/a") for i in range(30)])
    before = sorted(p.relative_to(data) for p in data.rglob("*"))
    summary = export(data, tmp_path / "out", Options())
    assert summary.rows == 30
    assert sorted(p.relative_to(data) for p in data.rglob("*")) == before


def test_without_pyarrow_the_command_says_how_to_install_it(
    stores: tuple[Path, MessageStore, TopicStore],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data, queues, topics = stores
    fill(queues, topics, 0, 2)
    # None in sys.modules makes `import pyarrow` raise ImportError.
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    assert (
        main(["export", "--data-dir", str(data), "--out", str(tmp_path / "o"), *EXPORT_IN_PROCESS])
        == 2
    )
    assert "pip install -e '.[export]'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_outcomes_found_later_are_exported_as_updates(
    stores: tuple[Path, MessageStore, TopicStore], tmp_path: Path
) -> None:
    data, queues, topics = stores
    fill(queues, topics, 0, 10)
    out = tmp_path / "out"
    export(data, out, Options())
    pending_a = [seq for seq in queues.live_seqs() if seq <= 10]
    assert len(pending_a) == 5
    # Since: two acked after a redelivery, one dead-lettered; the topic's backlog acked.
    queues.record_delivery(pending_a[:2])
    queues.settle(pending_a[:2], "acked", 5_000_000)
    queues.settle(pending_a[2:3], "dead-lettered", 5_000_001)
    topics.ack([("s1", seq) for seq in topics.messages.live_seqs()], "acked", 5_000_002)

    second = export(data, out, Options())
    assert second.outcomes_found == {"acked": 2 + 8, "dead-lettered": 1}
    assert second.still_pending == 2 + 10  # /queue/a's other two, /queue/b's (not expired)
    assert any("earlier rows settled since: 11" in line for line in second.lines())
    now = current(out)
    assert Counter((r["destination"], r["outcome"]) for r in now.values()) == {
        ("/queue/a", "acked"): 7,
        ("/queue/a", "dead-lettered"): 1,
        ("/queue/a", "pending"): 2,
        ("/queue/b", "pending"): 10,
        ("/topic/t", "acked"): 10,
    }
    assert {now[("p2p-0", seq)]["redeliveries"] for seq in pending_a[:2]} == {1}

    # Nothing new: no update file, and the outcomes found stay found.
    third = export(data, out, Options())
    assert (third.update_files, sum(third.outcomes_found.values())) == (0, 0)
    queues.settle(queues.expired(10, 1000), "expired", 6_000_000)
    fourth = export(data, out, Options())
    assert fourth.outcomes_found == {"expired": 10}
    assert Counter(r["outcome"] for r in current(out).values())["pending"] == 2


def test_the_export_directory_reads_as_a_pyarrow_dataset(
    stores: tuple[Path, MessageStore, TopicStore], tmp_path: Path
) -> None:
    """The manifest, the update files (under _updates/) and temporary files are skipped
    (leading '_' and '.'): the row files read as one dataset; the updates as another."""
    import pyarrow.dataset as ds

    data, queues, topics = stores
    fill(queues, topics, 0, 10)
    out = tmp_path / "out"
    export(data, out, Options())
    (out / "p2p-0" / ".seg-00000009.parquet.tmp").write_bytes(b"half written")
    rows = ds.dataset(out, format="parquet", exclude_invalid_files=False)
    assert rows.count_rows() == 30
    queues.settle(queues.live_seqs(), "acked", 5_000_000)
    export(data, out, Options())
    assert export_files(out, b"updates")
    assert all(f.relative_to(out).parts[0] == "_updates" for f in export_files(out, b"updates"))
    rows = ds.dataset(out, format="parquet")
    assert rows.count_rows() == 30
    assert "body" in rows.schema.names
    updates = ds.dataset(out / "_updates", format="parquet")
    assert updates.count_rows() == 15  # every pending queue row, acked


def test_rows_of_a_segment_deleted_before_their_outcome_was_read_are_settled(
    tmp_path: Path,
) -> None:
    """Without store.archive, a segment whose messages are all settled is deleted, and with
    it the settlements it held; an export that had its rows as pending marks them
    'settled' (how is gone) and says so. Settlements held by a later segment are found."""
    data = tmp_path / "data"
    settings = StoreSettings(segment_max_bytes=1 << 20, segment_max_age_s=0, archive=False)
    out = tmp_path / "out"
    with MessageStore.open(data / "p2p-0", settings) as queues:
        first = queues.append([message(i, "/queue/a") for i in range(20)])
        export(data, out, Options())
        queues.settle(first[:15], "acked", 5_000_000)  # recorded in segment 1 itself
        queues.roll()
        queues.settle(first[15:], "expired", 5_000_001)  # recorded in segment 2
        assert not (data / "p2p-0" / "seg-00000001.db").exists()  # retired, deleted
        summary = export(data, out, Options())
    assert summary.outcomes_found == {"settled": 15, "expired": 5}
    assert Counter(r["outcome"] for r in current(out).values()) == {"settled": 15, "expired": 5}
    assert any("warning: 15 rows are 'settled'" in line for line in summary.lines())


def test_an_interrupted_runs_leftovers_are_removed(
    stores: tuple[Path, MessageStore, TopicStore], tmp_path: Path
) -> None:
    data, queues, topics = stores
    fill(queues, topics, 0, 10)
    out = tmp_path / "out"
    export(data, out, Options())
    queues.settle(queues.live_seqs(), "acked", 5_000_000)
    export(data, out, Options())
    update = export_files(out, b"updates")[0]
    stray = update.with_name(update.name.replace("updates-2", "updates-9"))
    stray.write_bytes(update.read_bytes())  # written by a run killed before recording it
    half = out / "p2p-0" / ".seg-00000001.parquet.tmp"
    half.write_bytes(b"PAR1")
    old_style = out / "p2p-0" / "seg-00000001.parquet.tmp"  # an earlier version's name
    old_style.write_bytes(b"PAR1")
    export(data, out, Options())
    assert not stray.exists() and not half.exists() and not old_style.exists()
    assert update.exists()


def test_an_export_directory_of_an_earlier_version_is_carried_on(
    stores: tuple[Path, MessageStore, TopicStore], tmp_path: Path
) -> None:
    """Manifest version 1 (named mpbroker-export.json) and schema version 1 files: the next
    run renames the manifest, counts the old files' pending rows and finds their outcomes."""
    data, queues, topics = stores
    fill(queues, topics, 0, 10)
    out = tmp_path / "out"
    export(data, out, Options())
    # Turn the directory into what version 1 left: files without a kind, schema version 1.
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    for path in export_files(out, b"rows"):
        table = pq.read_table(path)
        pq.write_table(
            table.replace_schema_metadata({b"mpbroker.export.schema_version": b"1"}), path
        )
    v1 = {
        **manifest,
        "manifest_version": 1,
        "schema_version": 1,
        "segments": {
            key: {
                "upto_seq": e["upto_seq"],
                "complete": e["complete"],
                "rows": sum(f["rows"] for f in e["files"]),
                "files": [f["name"] for f in e["files"]],
            }
            for key, e in manifest["segments"].items()
        },
    }
    del v1["runs"]
    (out / MANIFEST_NAME).unlink()
    (out / "mpbroker-export.json").write_text(json.dumps(v1))

    queues.settle(queues.live_seqs(), "acked", 5_000_000)
    summary = export(data, out, Options())
    assert not (out / "mpbroker-export.json").exists()
    assert json.loads((out / MANIFEST_NAME).read_text())["manifest_version"] == 2
    assert summary.outcomes_found["acked"] == 5 + 10
    assert Counter(r["outcome"] for r in current(out).values())["pending"] == 10 - 2


class Killed(BaseException):
    """What a test raises where a run is killed."""


def kill_before_recording_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next run dies after its first row file is renamed into place, before the manifest
    records it (as if killed there)."""

    def killed(*args: object, **kwargs: object) -> None:
        raise Killed

    monkeypatch.setattr(_run, "record", killed)


def garble(path: Path, column: str = "seq") -> None:
    """Flip every byte of `column`'s pages in the file's first row group: the footer stays
    whole (the file passes as an export file), those pages cannot be read."""
    group = pq.ParquetFile(path).metadata.row_group(0)
    chunk = next(
        group.column(i)
        for i in range(group.num_columns)
        if group.column(i).path_in_schema == column
    )
    data = bytearray(path.read_bytes())
    for i in range(chunk.data_page_offset, chunk.data_page_offset + chunk.total_compressed_size):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def interrupted_export(
    stores: tuple[Path, MessageStore, TopicStore], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Ten messages of each kind, then an export killed after renaming its first row file
    into place, before recording it; its --out."""
    data, queues, topics = stores
    fill(queues, topics, 0, 10)
    out = tmp_path / "out"
    kill_before_recording_a_file(monkeypatch)
    with pytest.raises(Killed):
        export(data, out, Options())
    monkeypatch.undo()
    return out


def test_a_row_file_an_interrupted_run_did_not_record_is_adopted(
    stores: tuple[Path, MessageStore, TopicStore], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ingest may take in a row file its run did not record (killed before the manifest):
    the next run keeps it as it is and writes the outcomes found since as updates."""
    data, queues, _ = stores
    out = interrupted_export(stores, tmp_path, monkeypatch)
    first = out / "p2p-0" / "seg-00000001.parquet"
    taken_in = first.read_bytes()  # what an ingest read meanwhile
    assert "p2p-0/seg-00000001" not in json.loads((out / MANIFEST_NAME).read_text())["segments"]
    pending = pq.read_table(first).to_pydict()["outcome"].count("pending")
    assert pending > 0
    half = out / "p2p-0" / ".seg-00000002.parquet.tmp"  # a file being written: discarded
    half.write_bytes(b"PAR1 half")

    queues.settle(queues.live_seqs(), "acked", 5_000_000)
    summary = export(data, out, Options())
    assert first.read_bytes() == taken_in
    assert not half.exists()
    assert summary.outcomes_found["acked"] >= pending
    entry = json.loads((out / MANIFEST_NAME).read_text())["segments"]["p2p-0/seg-00000001"]
    adopted = entry["files"][0]
    assert adopted["name"] == "p2p-0/seg-00000001.parquet"
    assert adopted["rows"] == pq.read_metadata(first).num_rows
    assert adopted["pending"] == 0 and len(adopted["updates"]) == 1
    d = rows_of(out).to_pydict()
    assert len(d["seq"]) == len(set(zip(d["store"], d["seq"], strict=True))) == 30  # none twice
    assert {r["outcome"] for r in current(out).values() if r["store"] == "p2p-0"} == {"acked"}


@pytest.mark.parametrize("case", ["damaged", "not the next"])
def test_an_unrecorded_row_file_that_cannot_be_adopted_is_refused(
    stores: tuple[Path, MessageStore, TopicStore],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
) -> None:
    data = stores[0]
    out = interrupted_export(stores, tmp_path, monkeypatch)
    bad = out / "p2p-0" / "seg-00000001.parquet"
    if case == "damaged":
        garble(bad)
    else:
        bad = bad.rename(bad.with_name("seg-00000001.after-3.parquet"))
    content = bad.read_bytes()
    manifest = (out / MANIFEST_NAME).read_text()
    with pytest.raises(ExportError, match="damaged" if case == "damaged" else "not the next") as e:
        export(data, out, Options())
    assert e.value.path == bad
    assert bad.read_bytes() == content
    assert (out / MANIFEST_NAME).read_text() == manifest


def run_export_command(data: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """`mpbroker export` as a process of its own, as a person (or the timer) runs it."""
    command = [sys.executable, "-m", "mpbroker", "export", "--data-dir", str(data)]
    return subprocess.run(
        [*command, "--out", str(out)], capture_output=True, text=True, timeout=120
    )


def assert_refused_in_one_line(run: subprocess.CompletedProcess[str], *words: str) -> None:
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert all(w in lines[0] for w in words), lines[0]


@pytest.mark.parametrize(
    ("kind", "damage"),
    [("rows", "missing"), ("rows", "damaged"), ("updates", "missing"), ("updates", "damaged")],
)
def test_a_missing_or_damaged_earlier_file_is_named_in_one_line(
    stores: tuple[Path, MessageStore, TopicStore], tmp_path: Path, kind: str, damage: str
) -> None:
    """A file an earlier run wrote and this one reads (a row file with rows still pending,
    its update files): exit code 2 and the file named, no traceback."""
    data, queues, topics = stores
    fill(queues, topics, 0, 10)
    out = tmp_path / "out"
    export(data, out, Options())
    live = queues.live_seqs()
    queues.settle(live[: len(live) // 2], "acked", 5_000_000)  # some stay pending
    export(data, out, Options())
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    files = [f for e in manifest["segments"].values() for f in e["files"] if f["pending"]]
    names = (
        [f["name"] for f in files] if kind == "rows" else [u for f in files for u in f["updates"]]
    )
    victim = out / names[0]
    if damage == "missing":
        victim.unlink()
    else:
        garble(victim)
    run = run_export_command(data, out)
    assert_refused_in_one_line(run, str(victim), damage)


def test_a_second_export_into_the_same_out_is_refused_at_once(
    stores: tuple[Path, MessageStore, TopicStore], tmp_path: Path
) -> None:
    """While an export holds OUT's lock, another refuses at once and touches nothing: it
    would delete the files the first is writing and take its run number."""
    data, queues, topics = stores
    fill(queues, topics, 0, 10)
    out = tmp_path / "out"
    export(data, out, Options())
    lock = out / LOCK_NAME
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    (out / "p2p-0" / ".seg-00000009.parquet.tmp").write_bytes(b"PAR1 being written")
    fill(queues, topics, 100, 4)  # something new to export
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with lock.open("rb") as held:  # the running export's lock
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        run = run_export_command(data, out)
    assert_refused_in_one_line(run, str(out), "another mpbroker export is running")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert export(data, out, Options()).rows == 12  # once it is done
