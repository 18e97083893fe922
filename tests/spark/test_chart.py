"""The chart of the ingest reports (spark/chart.py) over report directories written here in
the exact format Spark's CSV writer uses (no Spark session): the data read back, the folding
of quiet destinations into "other", a real PNG written whole, and refusals naming the file."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from matplotlib.image import imread

from spark.chart import (
    ChartError,
    chart_title,
    latency_per_minute,
    load_reports,
    main,
    messages_per_minute,
    outcomes_by_destination,
    sizes_by_bucket,
    top_destinations,
    write_chart,
)

PER_MINUTE_HEADER = (
    "destination,minute,messages,bytes,acked,latency_p50_ms,latency_p95_ms,latency_p99_ms"
)
SIZES_HEADER = "destination,size_bucket,messages,bytes"
OUTCOMES_HEADER = (
    "destination,messages,bytes,acked,expired,dead_lettered,unsubscribed,pending,"
    "redelivered_messages,redeliveries"
)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# What spark.ingest wrote for tests.spark.test_ingest.make_export, line for line.
REAL_PER_MINUTE = [
    "/queue/a,1970-01-01T00:16:00.000Z,40,8990,20,999980,999999,1000000",
    "/queue/b,1970-01-01T00:16:00.000Z,40,8990,0,,,",
    "/topic/t,1970-01-01T00:16:00.000Z,40,8990,8,999980,1000000,1000000",
]
REAL_SIZES = ["/queue/a,<1024,40,8990", "/queue/b,<1024,40,8990", "/topic/t,<1024,40,8990"]
REAL_OUTCOMES = [
    "/queue/a,40,8990,20,0,0,0,20,3,3",
    "/queue/b,40,8990,0,40,0,0,0,0,0",
    "/topic/t,40,8990,8,0,0,0,32,0,0",
]


def write_report(reports: Path, name: str, header: str, lines: Sequence[str]) -> Path:
    """One report directory as Spark leaves it: a part file with a header, and _SUCCESS."""
    directory = reports / name
    directory.mkdir(parents=True)
    part = directory / f"part-00000-{uuid.uuid4()}-c000.csv"
    part.write_text("".join(f"{line}\n" for line in (header, *lines)), encoding="utf-8")
    (directory / "_SUCCESS").write_bytes(b"")
    return part


def write_reports(
    table: Path,
    per_minute: Sequence[str] = REAL_PER_MINUTE,
    sizes: Sequence[str] = REAL_SIZES,
    outcomes: Sequence[str] = REAL_OUTCOMES,
) -> dict[str, Path]:
    reports = table / "_reports"
    return {
        "per_minute": write_report(reports, "per_minute", PER_MINUTE_HEADER, per_minute),
        "sizes": write_report(reports, "sizes", SIZES_HEADER, sizes),
        "outcomes": write_report(reports, "outcomes", OUTCOMES_HEADER, outcomes),
    }


def many_destinations(table: Path, n: int = 12) -> None:
    """n queues, /queue/q00 the busiest (n + 1 messages a minute ... 2), over three minutes
    with a gap; only the even ones acked anything."""
    per_minute, sizes, outcomes = [], [], []
    for i in range(n):
        name, k = f"/queue/q{i:02}", n + 1 - i
        for minute in (0, 1, 5):
            latency = f"{10 * (i + 1)},{20 * (i + 1)},{30 * (i + 1)}" if i % 2 == 0 else ",,"
            acked = k if i % 2 == 0 else 0
            per_minute.append(
                f"{name},1970-01-01T00:{minute:02}:00.000Z,{k},{k * 100},{acked},{latency}"
            )
        sizes.append(f"{name},<1024,{2 * k},{2 * k * 100}")
        sizes.append(f"{name},>=1048576,{k},{k * 2_000_000}")
        acked = 3 * k if i % 2 == 0 else 0
        outcomes.append(
            f"{name},{3 * k},{3 * k * 100},{acked},0,0,0,{3 * k - acked},{i % 3},{i % 3}"
        )
    write_reports(table, per_minute, list(reversed(sizes)), outcomes)


def only_file(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_load_reads_spark_format(tmp_path: Path) -> None:
    write_reports(tmp_path)
    reports = load_reports(tmp_path / "_reports")
    assert reports.destinations() == {"/queue/a": 40, "/queue/b": 40, "/topic/t": 40}
    assert {r.destination: r.messages for r in reports.per_minute} == reports.destinations()
    by_name = {r.destination: r for r in reports.per_minute}
    assert by_name["/queue/a"].minute == datetime(1970, 1, 1, 0, 16, tzinfo=UTC)
    assert by_name["/queue/a"].latency_p99_ms == 1_000_000
    queue_b = by_name["/queue/b"]  # nothing acked: empty latency cells
    assert (queue_b.acked, queue_b.latency_p50_ms, queue_b.latency_p99_ms) == (0, None, None)
    outcomes = {r.destination: r for r in reports.outcomes}
    assert (outcomes["/queue/b"].expired, outcomes["/queue/a"].redelivered_messages) == (40, 3)
    assert {(r.destination, r.size_bucket, r.messages) for r in reports.sizes} == {
        ("/queue/a", "<1024", 40),
        ("/queue/b", "<1024", 40),
        ("/topic/t", "<1024", 40),
    }
    grouping = top_destinations(reports)
    assert grouping.labels == ("/queue/a", "/queue/b", "/topic/t")  # ties by name, no "other"
    assert set(latency_per_minute(reports, grouping)) == {"/queue/a", "/topic/t"}


def test_quoted_destination_as_spark_escapes_it(tmp_path: Path) -> None:
    # Spark quotes a cell with a comma or a quote and escapes the quote with a backslash.
    odd = '"/queue/odd,\\"name\\""'
    write_reports(
        tmp_path,
        [f"{odd},2024-03-01T12:34:00.000Z,2,200,1,5,6,7"],
        [f"{odd},<1024,2,200"],
        [f"{odd},2,200,1,0,0,0,1,0,0"],
    )
    reports = load_reports(tmp_path / "_reports")
    assert reports.destinations() == {'/queue/odd,"name"': 2}


def test_the_title_counts_messages_and_destinations_in_words(tmp_path: Path) -> None:
    """The heading under the title: singular for one (one message, one destination), and
    the minutes the reports cover."""
    one = tmp_path / "one"
    write_reports(
        one,
        ["/queue/a,1970-01-01T00:16:00.000Z,1,225,1,5,5,5"],
        ["/queue/a,<1024,1,225"],
        ["/queue/a,1,225,1,0,0,0,0,0,0"],
    )
    assert chart_title(load_reports(one / "_reports"), "orders") == (
        "orders\n1 message, 1 destination, 1970-01-01 00:16 to 1970-01-01 00:16 UTC"
    )
    write_reports(tmp_path / "three")
    assert chart_title(load_reports(tmp_path / "three" / "_reports"), "") == (
        "\n120 messages, 3 destinations, 1970-01-01 00:16 to 1970-01-01 00:16 UTC"
    )
    many_destinations(tmp_path / "many", 9)
    grouping = top_destinations(load_reports(tmp_path / "many" / "_reports"))
    assert grouping.other_label == "other (1 destination)"


def test_quiet_destinations_fold_into_other(tmp_path: Path) -> None:
    many_destinations(tmp_path, 12)
    reports = load_reports(tmp_path / "_reports")
    grouping = top_destinations(reports)
    assert grouping.top == tuple(f"/queue/q{i:02}" for i in range(8))
    assert grouping.others == {f"/queue/q{i:02}" for i in range(8, 12)}
    assert grouping.other_label == "other (4 destinations)"
    assert grouping.labels[-1] == "other (4 destinations)"

    series = messages_per_minute(reports, grouping)
    assert list(series) == list(grouping.labels)
    other_k = sum(12 + 1 - i for i in range(8, 12))
    minute = [datetime(1970, 1, 1, 0, m, tzinfo=UTC) for m in range(6)]
    # A quiet stretch (minutes 2..4) is drawn as zeros at its ends, not as a slope.
    assert series["other (4 destinations)"] == [
        (minute[0], other_k),
        (minute[1], other_k),
        (minute[2], 0),
        (minute[4], 0),
        (minute[5], other_k),
    ]
    assert sum(n for points in series.values() for _, n in points) == sum(
        r.messages for r in reports.per_minute
    )

    # Percentiles cannot be added up: "other" and the never-acked destinations have none.
    latency = latency_per_minute(reports, grouping)
    assert list(latency) == ["/queue/q00", "/queue/q02", "/queue/q04", "/queue/q06"]
    q00 = latency["/queue/q00"]
    assert q00.p50[:2] == (10.0, 10.0) and q00.p99[-1] == 30.0
    assert q00.p50[2] != q00.p50[2]  # NaN: the line breaks over the gap

    buckets, counts = sizes_by_bucket(reports, grouping)
    assert buckets == ["<1024", ">=1048576"]  # by size, whatever order the rows came in
    assert counts["other (4 destinations)"] == [2 * other_k, other_k]

    rows = outcomes_by_destination(reports, grouping)
    assert [r.destination for r in rows] == list(grouping.labels)
    other = rows[-1]
    assert other.messages == 3 * other_k
    assert other.acked + other.pending == other.messages
    assert other.redelivered_messages == sum(i % 3 for i in range(8, 12))

    assert top_destinations(reports, limit=20).others == frozenset()


def test_a_quiet_destination_with_dead_letters_or_expiry_is_never_folded(tmp_path: Path) -> None:
    """The quietest of nine destinations is the only one whose messages were dead-lettered
    (another one's expired): both are drawn on their own, however quiet."""
    many_destinations(tmp_path, 12)
    outcomes = tmp_path / "_reports" / "outcomes"
    (part,) = outcomes.glob("part-*.csv")
    # destination,messages,bytes,acked,expired,dead_lettered,unsubscribed,pending,...
    changed = {
        "/queue/q09": "/queue/q09,12,1200,0,1,0,0,11,0,0",
        "/queue/q11": "/queue/q11,6,600,0,0,1,0,5,2,2",
    }
    lines = [changed.get(line.split(",")[0], line) for line in part.read_text().splitlines()]
    part.write_text("\n".join(lines) + "\n")
    grouping = top_destinations(load_reports(tmp_path / "_reports"))
    assert grouping.top == (*(f"/queue/q{i:02}" for i in range(8)), "/queue/q09", "/queue/q11")
    assert grouping.others == {"/queue/q08", "/queue/q10"}


def test_reports_read_back_through_spark_records_chart_the_same(tmp_path: Path) -> None:
    """The ingest's --chart reads its reports through Spark (any filesystem), as text cells
    by column; a newer column (settled) is read, and its absence in older reports is 0."""
    from spark.chart import reports_from_records

    def records(header: str, lines: Sequence[str]) -> list[dict[str, str]]:
        names = header.split(",")
        return [dict(zip(names, line.split(","), strict=True)) for line in lines]

    with_settled = [line + ",2" for line in REAL_OUTCOMES]
    reports = reports_from_records(
        {
            "per_minute": records(PER_MINUTE_HEADER, REAL_PER_MINUTE),
            "sizes": records(SIZES_HEADER, REAL_SIZES),
            "outcomes": records(OUTCOMES_HEADER + ",settled", with_settled),
        },
        "hdfs://nn/table/_reports",
    )
    assert [r.settled for r in reports.outcomes] == [2, 2, 2]
    write_reports(tmp_path)
    assert load_reports(tmp_path / "_reports").outcomes[0].settled == 0
    bad = records(PER_MINUTE_HEADER, REAL_PER_MINUTE)
    bad[0]["messages"] = "many"
    with pytest.raises(ChartError, match="messages 'many' is not valid") as info:
        reports_from_records(
            {"per_minute": bad, "sizes": [], "outcomes": []}, "hdfs://nn/table/_reports"
        )
    assert "hdfs://nn/table/_reports/per_minute" in str(info.value)


def test_main_writes_a_png_and_nothing_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "table"
    write_reports(table)
    out_dir = tmp_path / "charts"
    out = out_dir / "report.png"
    assert main(["--table", str(table), "--out", str(out), "--title", "orders"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    image = imread(out)
    height, width = image.shape[:2]
    assert height >= 500 and width >= 800
    assert image.std() > 0.05  # drawn on, not a blank page
    assert only_file(out_dir) == ["report.png"]  # no temporary file left

    # Again over it, with many destinations and nothing acked at all.
    many = tmp_path / "many"
    many_destinations(many, 30)
    lines = (many / "_reports" / "per_minute").glob("part-*.csv")
    (part,) = lines
    part.write_text(
        "\n".join(
            ",".join([*line.split(",")[:4], "0,,,"]) if i else line
            for i, line in enumerate(part.read_text().splitlines())
        )
        + "\n"
    )
    assert write_chart(many, out) == out
    assert out.read_bytes() != data
    assert imread(out).shape[:2] == (height, width)
    assert only_file(out_dir) == ["report.png"]


def test_missing_reports_dir_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.png"
    assert main(["--table", str(tmp_path / "table"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "table" / "_reports") in err
    assert "spark.ingest" in err
    assert not out.exists()

    write_reports(tmp_path / "table")
    for path in (tmp_path / "table" / "_reports" / "sizes").iterdir():
        path.unlink()
    assert main(["--table", str(tmp_path / "table"), "--out", str(out)]) == 2
    assert str(tmp_path / "table" / "_reports" / "sizes") in capsys.readouterr().err
    assert only_file(tmp_path) == ["table"]


@pytest.mark.parametrize(
    ("report", "damage", "detail"),
    [
        # cut in the middle of the last row
        ("per_minute", lambda b: b[:-12], "cells"),
        # cut inside a quoted cell
        ("outcomes", lambda b: b + b'"/queue/c,40,8', "damaged CSV"),
        # binary garbage
        ("sizes", lambda b: b"\x89\xff\x00\x17garbage" + b, "UTF-8"),
        # a number that is not one
        ("outcomes", lambda b: b.replace(b",40,8990,0,40", b",40,8990,zero,40"), "acked 'zero'"),
        # whole rows lost: parses cleanly, caught by the totals across reports
        ("sizes", lambda b: b.rsplit(b"\n", 2)[0] + b"\n", "truncated"),
        # not the report it should be
        ("per_minute", lambda b: SIZES_HEADER.encode() + b"\n", "no column"),
        ("outcomes", lambda b: b"", "empty"),
    ],
)
def test_damaged_report_is_refused_naming_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    report: str,
    damage: Callable[[bytes], bytes],
    detail: str,
) -> None:
    table = tmp_path / "table"
    part = write_reports(table)[report]
    part.write_bytes(damage(part.read_bytes()))
    out = tmp_path / "report.png"
    assert main(["--table", str(table), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(part) in err
    assert detail in err
    assert only_file(tmp_path) == ["table"]
    with pytest.raises(ChartError) as info:
        write_chart(table, out)
    assert info.value.path == part


def test_unwritable_out_is_refused(tmp_path: Path) -> None:
    write_reports(tmp_path / "table")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ChartError) as info:
        write_chart(tmp_path / "table", blocker / "report.png")
    assert str(blocker) in str(info.value)
    assert only_file(tmp_path) == ["a-file", "table"]


def test_without_matplotlib_a_chart_is_refused_in_one_line_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from spark.ingest import main as ingest_main

    write_reports(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    assert main(["--table", str(tmp_path), "--out", str(tmp_path / "c.png")]) == 2
    argv = ["--input", str(tmp_path), "--output", str(tmp_path / "t"), "--chart", "c.png"]
    assert ingest_main(argv) == 2  # before Spark starts: nothing written
    for line in capsys.readouterr().err.strip().splitlines():
        assert "the chart needs matplotlib: pip install -e '.[spark]'" in line
    assert not (tmp_path / "t").exists() and not (tmp_path / "c.png").exists()
