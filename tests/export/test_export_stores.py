"""The export against real store files written by MessageStore and TopicStore (no broker
process): counts and outcomes read back from the Parquet files, incremental runs, refusals."""

from __future__ import annotations

import io
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mpbroker.cli import main
from mpbroker.config import StoreSettings
from mpbroker.export import MANIFEST_NAME, ExportError, Options, Progress, export
from mpbroker.records import Message
from mpbroker.stores import MessageStore, TopicStore
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


def rows_of(out: Path) -> pa.Table:
    files = sorted(out.rglob("*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]) if files else None


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
    assert main(["export", "--data-dir", str(data), "--out", str(out)]) == 0
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
    code = main(["export", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "o")])
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
    code = main(["export", "--data-dir", str(data), "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert str(bad) in err
    assert sorted(p.name for p in out.iterdir()) == ["other.parquet"]  # nothing written


def test_an_unknown_manifest_schema_version_is_refused(
    stores: tuple[Path, MessageStore, TopicStore], tmp_path: Path
) -> None:
    data, queues, topics = stores
    fill(queues, topics, 0, 10)
    out = tmp_path / "out"
    export(data, out, Options())
    manifest = out / MANIFEST_NAME
    manifest.write_text(manifest.read_text().replace('"schema_version": 1', '"schema_version": 7'))
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
    assert main(["export", "--data-dir", str(data), "--out", str(tmp_path / "o")]) == 2
    assert "pip install -e '.[export]'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
