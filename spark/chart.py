"""Draw the ingest job's reports (``TABLE/_reports/``) as one PNG chart, for people who
would rather look than read.

    python -m spark.chart --table /srv/table --out report.png [--title "orders, March"]

Four panels: messages per minute per destination, sent->acked latency (p50/p95/p99) per
destination, the message size distribution, and the outcomes per destination. Only the
busiest destinations (by messages) get a line or a bar of their own; the rest are added up
as "other (k destinations)", and the legend says so. The CSV files are read with the
standard library (no Spark, no pandas); matplotlib draws without pyplot's global state, so
`write_chart` is safe to call from another program (`python -m spark.ingest --chart`). A
missing or damaged report is refused naming the file, exit code 2, and no PNG is written.
The PNG is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import argparse
import colorsys
import csv
import importlib.util
import os
import secrets
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "ChartError",
    "Grouping",
    "MinuteRow",
    "OutcomeRow",
    "Reports",
    "SizeRow",
    "chart_title",
    "load_reports",
    "main",
    "render",
    "reports_from_records",
    "require_matplotlib",
    "top_destinations",
    "write_chart",
    "write_reports_chart",
]

# spark.ingest's REPORTS_DIR, not imported: under `spark-submit spark/ingest.py` this module
# is imported as a plain `chart` next to the script, and `spark.ingest` may not be importable.
REPORTS_DIR: Final = "_reports"
TOP_DESTINATIONS: Final = 8
OUTCOMES: Final = ("acked", "expired", "dead_lettered", "unsubscribed", "settled", "pending")
_OUTCOME_COLORS: Final = {
    "acked": "#2ca02c",
    "expired": "#ff7f0e",
    "dead_lettered": "#d62728",
    "unsubscribed": "#9467bd",
    "settled": "#8c564b",
    "pending": "#c7c7c7",
}
# tab10 without its grey, which is kept for "other".
_PALETTE: Final = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
)
_OTHER_COLOR: Final = "#7f7f7f"
_LABEL_MAX: Final = 40
_MINUTE: Final = timedelta(minutes=1)


class ChartError(Exception):
    """The reports could not be charted; names the file and why. Nothing was written."""

    def __init__(self, path: Path | str, detail: str) -> None:
        self.path = Path(path)
        self.detail = detail
        # As given: a URI's "//" would not survive a Path.
        super().__init__(f"chart: {path}: {detail}")


@dataclass(frozen=True)
class MinuteRow:
    destination: str
    minute: datetime
    messages: int
    bytes: int
    acked: int
    latency_p50_ms: int | None
    latency_p95_ms: int | None
    latency_p99_ms: int | None
    """The latencies are None in a minute in which nothing that was sent got acked."""


@dataclass(frozen=True)
class SizeRow:
    destination: str
    size_bucket: str
    messages: int
    bytes: int


@dataclass(frozen=True)
class OutcomeRow:
    destination: str
    messages: int
    bytes: int
    acked: int
    expired: int
    dead_lettered: int
    unsubscribed: int
    pending: int
    redelivered_messages: int
    redeliveries: int
    settled: int = 0
    """Settled, how is gone (reports of an ingest before update files have no column)."""


@dataclass(frozen=True)
class Reports:
    per_minute: tuple[MinuteRow, ...]
    sizes: tuple[SizeRow, ...]
    outcomes: tuple[OutcomeRow, ...]

    def destinations(self) -> Counter[str]:
        """destination -> messages, over every destination any report names."""
        totals: Counter[str] = Counter()
        for row in self.outcomes:
            totals[row.destination] += row.messages
        for name in (r.destination for rows in (self.per_minute, self.sizes) for r in rows):
            totals[name] += 0
        return totals


# --- reading -----------------------------------------------------------------------------

_Row = TypeVar("_Row", MinuteRow, SizeRow, OutcomeRow)


def _count(text: str) -> int:
    value = int(text)  # ValueError for "", "1.5", "abc"
    if value < 0:
        raise ValueError("negative")
    return value


def _optional_count(text: str) -> int | None:
    return None if text == "" else _count(text)


def _minute(text: str) -> datetime:
    # Spark writes 2024-03-01T12:34:00.000Z (or +01:00 under another session time zone).
    value = datetime.fromisoformat(text)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# By the fields' annotations, which are strings here (from __future__ import annotations).
_PARSERS: Final[dict[str, Callable[[str], object]]] = {
    "str": str,
    "datetime": _minute,
    "int": _count,
    "int | None": _optional_count,
}


def _parse_rows(
    header: Sequence[str],
    records: Iterable[tuple[int, Sequence[str]]],
    row_type: type[_Row],
    source: Path | str,
    name: str,
) -> list[_Row]:
    """Rows of `row_type` from a report's header and its (line number, cells); ChartError
    naming `source` for a missing column or a bad cell."""
    fields_ = [f for f in fields(row_type)]
    required = [f.name for f in fields_ if f.default is MISSING]
    missing = [column for column in required if column not in header]
    if missing:
        raise ChartError(source, f"not a {name} report: no column(s) {', '.join(missing)}")
    # Extra columns are left alone: a newer ingest job may add some; a column with a
    # default may be missing: an older one wrote none.
    columns = [
        (f.name, _PARSERS[str(f.type)], header.index(f.name)) for f in fields_ if f.name in header
    ]
    rows: list[_Row] = []
    for line, cells in records:
        if len(cells) != len(header):
            raise ChartError(
                source,
                f"line {line}: {len(cells)} cells, the header has {len(header)}"
                " (truncated or damaged?)",
            )
        values: dict[str, Any] = {}
        for column, parse, i in columns:
            try:
                values[column] = parse(cells[i])
            except ValueError:
                raise ChartError(
                    source, f"line {line}: {column} {cells[i]!r} is not valid"
                ) from None
        rows.append(row_type(**values))
    return rows


def _read_report(part: Path, row_type: type[_Row]) -> list[_Row]:
    try:
        with open(part, newline="", encoding="utf-8") as fh:
            # Spark's CSV writer escapes a quote inside a quoted cell with a backslash.
            reader = csv.reader(fh, escapechar="\\", doublequote=False, strict=True)
            header = next(reader, None)
            if header is None:
                raise ChartError(part, "empty file (no header row)")
            return _parse_rows(
                header,
                ((reader.line_num, cells) for cells in reader),
                row_type,
                part,
                part.parent.name,
            )
    except csv.Error as exc:
        raise ChartError(part, f"damaged CSV ({exc})") from None
    except UnicodeDecodeError:
        raise ChartError(part, "not a text (UTF-8) CSV file") from None
    except OSError as exc:
        raise ChartError(part, exc.strerror or str(exc)) from None


def _report_files(reports_dir: Path, name: str) -> list[Path]:
    directory = reports_dir / name
    if not directory.is_dir():
        raise ChartError(directory, "missing report (not written by python -m spark.ingest?)")
    parts = sorted(directory.glob("part-*.csv"))
    if not parts:
        raise ChartError(directory, "no part-*.csv file in the report")
    return parts


def _load(reports_dir: Path, name: str, row_type: type[_Row]) -> tuple[list[_Row], Path]:
    parts = _report_files(reports_dir, name)
    # The job writes one part per report; more (another writer's) are read the same way.
    return [row for part in parts for row in _read_report(part, row_type)], parts[0]


def _check_totals(
    outcomes: Iterable[OutcomeRow],
    outcomes_file: Path,
    other: Iterable[MinuteRow | SizeRow],
    other_file: Path,
) -> None:
    # All three reports count the same table, so rows lost from one (a file cut short at a
    # line end parses cleanly) show as a total that disagrees.
    expected: Counter[str] = Counter()
    for outcome in outcomes:
        expected[outcome.destination] += outcome.messages
    got: Counter[str] = Counter()
    for row in other:
        got[row.destination] += row.messages
    for name in sorted(expected.keys() | got.keys()):
        if expected[name] != got[name]:
            raise ChartError(
                other_file,
                f"{got[name]} messages for {name!r} but {expected[name]} in {outcomes_file}"
                " (one of the two is truncated or damaged, or they are from different runs)",
            )


_ROW_TYPES: Final = {"per_minute": MinuteRow, "sizes": SizeRow, "outcomes": OutcomeRow}


def reports_from_records(
    records: Mapping[str, Sequence[Mapping[str, str]]], source: str
) -> Reports:
    """The reports from their rows as text cells by column (as the ingest job reads its CSV
    files back through Spark, from wherever the table is); ChartError naming `source`."""
    parsed: dict[str, list[Any]] = {}
    for name, row_type in _ROW_TYPES.items():
        rows = records.get(name)
        where = f"{source}/{name}"
        if rows is None:
            raise ChartError(where, "missing report")
        header = list(rows[0]) if rows else [f.name for f in fields(row_type)]
        parsed[name] = _parse_rows(
            header,
            ((i + 2, [row.get(h, "") for h in header]) for i, row in enumerate(rows)),
            row_type,
            where,
            name,
        )
    return _checked(parsed, {name: Path(source) / name for name in _ROW_TYPES})


def _checked(parsed: Mapping[str, Sequence[Any]], where: Mapping[str, Path]) -> Reports:
    """The reports parsed by name, once the other two agree with the outcomes' totals;
    `where` names each one's source for the error."""
    for other in ("per_minute", "sizes"):
        _check_totals(parsed["outcomes"], where["outcomes"], parsed[other], where[other])
    return Reports(tuple(parsed["per_minute"]), tuple(parsed["sizes"]), tuple(parsed["outcomes"]))


def load_reports(reports_dir: Path) -> Reports:
    """The three reports under `reports_dir` (TABLE/_reports); ChartError naming a bad file."""
    if not reports_dir.is_dir():
        raise ChartError(reports_dir, "no reports directory (run python -m spark.ingest first)")
    parsed: dict[str, Sequence[Any]] = {}
    where: dict[str, Path] = {}
    for name, row_type in _ROW_TYPES.items():
        parsed[name], where[name] = _load(reports_dir, name, row_type)
    return _checked(parsed, where)


# --- what to draw (no matplotlib) --------------------------------------------------------


@dataclass(frozen=True)
class Grouping:
    """The destinations drawn on their own (busiest first), and those added up as "other"."""

    top: tuple[str, ...]
    others: frozenset[str]

    @property
    def other_label(self) -> str:
        return f"other ({_counted(len(self.others), 'destination')})"

    @property
    def labels(self) -> tuple[str, ...]:
        return (*self.top, self.other_label) if self.others else self.top

    def label_of(self, destination: str) -> str:
        return self.other_label if destination in self.others else destination


def _counted(n: int, noun: str) -> str:
    """'1 message', '2 messages', '1,000 messages'."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def chart_title(reports: Reports, title: str) -> str:
    """The chart's heading: `title`, then the messages, the destinations and the minutes
    the reports cover."""
    totals = reports.destinations()
    minutes = [row.minute for row in reports.per_minute]
    span = (
        f", {min(minutes):%Y-%m-%d %H:%M} to {max(minutes):%Y-%m-%d %H:%M} UTC" if minutes else ""
    )
    return (
        f"{title}\n{_counted(sum(totals.values()), 'message')}, "
        f"{_counted(len(totals), 'destination')}{span}"
    )


def top_destinations(reports: Reports, limit: int = TOP_DESTINATIONS) -> Grouping:
    """The `limit` destinations with the most messages (ties by name), and every destination
    with a message that expired, was dead-lettered or whose outcome is lost (someone looking
    for trouble must find it: folded into "other", the only dead letters of a quiet queue
    were hidden); the rest folded."""
    ranked = sorted(reports.destinations().items(), key=lambda item: (-item[1], item[0]))
    names = [name for name, _ in ranked]
    troubled = {
        r.destination for r in reports.outcomes if r.expired or r.dead_lettered or r.settled
    }
    shown = [n for i, n in enumerate(names) if i < limit or n in troubled]
    return Grouping(tuple(shown), frozenset(names) - set(shown))


def messages_per_minute(
    reports: Reports, grouping: Grouping
) -> dict[str, list[tuple[datetime, int]]]:
    """label -> (minute, messages), ascending, with zeros where a quiet stretch starts and
    ends (a minute with no message has no row; a line drawn across it would invent some)."""
    sums: dict[str, Counter[datetime]] = defaultdict(Counter)
    for row in reports.per_minute:
        sums[grouping.label_of(row.destination)][row.minute] += row.messages
    out: dict[str, list[tuple[datetime, int]]] = {}
    for label in grouping.labels:
        points: list[tuple[datetime, int]] = []
        for minute, n in sorted(sums[label].items()):
            if points and minute - points[-1][0] > _MINUTE:
                if minute - points[-1][0] > 2 * _MINUTE:
                    points.append((points[-1][0] + _MINUTE, 0))
                points.append((minute - _MINUTE, 0))
            points.append((minute, n))
        if points:
            out[label] = points
    return out


@dataclass(frozen=True)
class LatencySeries:
    minutes: tuple[datetime, ...]
    p50: tuple[float, ...]
    p95: tuple[float, ...]
    p99: tuple[float, ...]
    """NaN where the line breaks (a gap of minutes without acks)."""


def latency_per_minute(reports: Reports, grouping: Grouping) -> dict[str, LatencySeries]:
    """Top destination -> its latency percentiles, only destinations with any acked
    message. Percentiles of several destinations cannot be added up, so "other" has none."""
    rows: dict[str, list[MinuteRow]] = defaultdict(list)
    for row in reports.per_minute:
        if row.latency_p50_ms is not None and row.destination in grouping.top:
            rows[row.destination].append(row)
    out: dict[str, LatencySeries] = {}
    nan = float("nan")
    for name in grouping.top:
        minutes: list[datetime] = []
        values: list[tuple[float, float, float]] = []
        for row in sorted(rows[name], key=lambda r: r.minute):
            if minutes and row.minute - minutes[-1] > _MINUTE:
                minutes.append(minutes[-1] + _MINUTE)
                values.append((nan, nan, nan))
            minutes.append(row.minute)
            a, b, c = (
                nan if v is None else float(v)
                for v in (row.latency_p50_ms, row.latency_p95_ms, row.latency_p99_ms)
            )
            values.append((a, b, c))
        if minutes:
            p50, p95, p99 = zip(*values, strict=True)
            out[name] = LatencySeries(tuple(minutes), p50, p95, p99)
    return out


def _bucket_key(bucket: str) -> tuple[int, int, str]:
    # "<1024" ... "<1048576", then ">=1048576"; anything else after them, by name.
    try:
        if bucket.startswith(">="):
            return (1, int(bucket[2:]), "")
        if bucket.startswith("<"):
            return (0, int(bucket[1:]), "")
    except ValueError:
        pass
    return (2, 0, bucket)


def sizes_by_bucket(reports: Reports, grouping: Grouping) -> tuple[list[str], dict[str, list[int]]]:
    """(size buckets, smallest first; label -> messages in each bucket)."""
    buckets = sorted({row.size_bucket for row in reports.sizes}, key=_bucket_key)
    position = {bucket: i for i, bucket in enumerate(buckets)}
    counts: dict[str, list[int]] = {label: [0] * len(buckets) for label in grouping.labels}
    for row in reports.sizes:
        counts[grouping.label_of(row.destination)][position[row.size_bucket]] += row.messages
    return buckets, counts


def outcomes_by_destination(reports: Reports, grouping: Grouping) -> list[OutcomeRow]:
    """One row per label (top destinations, then "other" added up), in grouping order."""
    sums: dict[str, list[int]] = {}
    for row in reports.outcomes:
        label = grouping.label_of(row.destination)
        values = [getattr(row, f.name) for f in fields(OutcomeRow)[1:]]
        if label in sums:
            sums[label] = [a + b for a, b in zip(sums[label], values, strict=True)]
        else:
            sums[label] = values
    return [OutcomeRow(label, *sums[label]) for label in grouping.labels if label in sums]


def _bucket_label(bucket: str) -> str:
    kind, bound, _ = _bucket_key(bucket)
    if kind == 2:
        return bucket
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if bound >= scale and bound % scale == 0:
            text = f"{bound // scale} {unit}"
            break
    else:
        text = f"{bound} B"
    return f"< {text}" if kind == 0 else f">= {text}"


def _text(name: str) -> str:
    # A "$" would start mathtext and a leading "_" hides a legend entry.
    if len(name) > _LABEL_MAX:
        name = name[: _LABEL_MAX - 3] + "..."
    name = _escape(name)
    return " " + name if name.startswith("_") else name


def _escape(text: str) -> str:
    return text.replace("$", r"\$")


# --- drawing ------------------------------------------------------------------------------


def _color(i: int) -> str:
    """The `i`th destination's colour: tab10's first, then hues spread by the golden ratio
    (every destination shown, however many are troubled, gets one of its own)."""
    if i < len(_PALETTE):
        return _PALETTE[i]
    red, green, blue = colorsys.hsv_to_rgb((i * 0.6180339887) % 1.0, 0.7, 0.8)
    return f"#{round(red * 255):02x}{round(green * 255):02x}{round(blue * 255):02x}"


def _colors(grouping: Grouping) -> dict[str, str]:
    colors = {name: _color(i) for i, name in enumerate(grouping.top)}
    colors[grouping.other_label] = _OTHER_COLOR
    return colors


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _time_axis(ax: Axes, minutes: Sequence[datetime]) -> None:
    import matplotlib.dates as mdates

    # matplotlib.dates has no type hints (hence the ignores); UTC whatever the rcParams say.
    locator = mdates.AutoDateLocator(tz=UTC)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=UTC))  # type: ignore[no-untyped-call]
    # One minute alone would get an axis days wide.
    ax.set_xlim(min(minutes) - _MINUTE, max(minutes) + _MINUTE)  # type: ignore[arg-type]
    ax.set_xlabel("minute (UTC)")


def _draw_messages(
    ax: Axes, series: Mapping[str, list[tuple[datetime, int]]], colors: Mapping[str, str]
) -> None:
    ax.set_title("messages per minute")
    if not series:
        _empty(ax, "no messages")
        return
    for label, points in series.items():
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, color=colors[label], marker="o" if len(points) < 60 else "", ms=3, lw=1.2)
    _time_axis(ax, [x for points in series.values() for x, _ in points])
    ax.set_ylabel("messages")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def _draw_latency(
    ax: Axes, series: Mapping[str, LatencySeries], colors: Mapping[str, str], folded: int
) -> None:
    from matplotlib.lines import Line2D

    ax.set_title("sent -> acked latency")
    if not series:
        _empty(ax, "no acked messages")
        return
    styles = (("p50", "-"), ("p95", "--"), ("p99", ":"))
    finite = [v for s in series.values() for attr, _ in styles for v in getattr(s, attr) if v == v]
    low, high = min(finite), max(finite)
    scale, unit = (1000.0, "seconds") if high >= 10_000 else (1.0, "milliseconds")
    for name, s in series.items():
        for attr, style in styles:
            ax.plot(
                s.minutes,  # type: ignore[arg-type]  # datetimes, as the converters take
                [v / scale for v in getattr(s, attr)],
                color=colors[name],
                ls=style,
                lw=1.2,
                marker="o" if len(s.minutes) < 60 else "",
                ms=3,
            )
    _time_axis(ax, [m for s in series.values() for m in s.minutes])
    # Latencies span orders of magnitude (a busy consumer vs a stuck one): log when they do.
    if low > 0 and high / low >= 100:
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, high / scale * 1.1)
    ax.set_ylabel(unit)
    ax.grid(alpha=0.3)
    handles = [Line2D([], [], color="0.2", ls=style, label=attr) for attr, style in styles]
    note = f" ({_counted(folded, 'other destination')} not shown)" if folded else ""
    ax.legend(
        handles=handles,
        title=f"percentile{note}",
        ncols=3,
        fontsize="small",
        title_fontsize="small",
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
    )


def _draw_sizes(
    ax: Axes, buckets: Sequence[str], counts: Mapping[str, list[int]], colors: Mapping[str, str]
) -> None:
    ax.set_title("message sizes")
    if not buckets:
        _empty(ax, "no messages")
        return
    positions = list(range(len(buckets)))
    bottom = [0] * len(buckets)
    for label, values in counts.items():
        ax.bar(positions, values, bottom=bottom, color=colors[label], width=0.7)
        bottom = [a + b for a, b in zip(bottom, values, strict=True)]
    ax.set_xticks(positions, [_bucket_label(b) for b in buckets])
    pad = max(0.0, (4 - len(buckets)) / 2)  # a lone bar would fill the panel
    ax.set_xlim(-0.5 - pad, len(buckets) - 0.5 + pad)
    ax.set_xlabel("stored size (body and headers)")
    ax.set_ylabel("messages")
    ax.grid(axis="y", alpha=0.3)


def _draw_outcomes(ax: Axes, rows: Sequence[OutcomeRow]) -> None:
    ax.set_title("outcomes per destination")
    if not rows:
        _empty(ax, "no messages")
        return
    positions = list(range(len(rows)))
    left = [0] * len(rows)
    for outcome in OUTCOMES:
        values = [getattr(row, outcome) for row in rows]
        ax.barh(
            positions,
            values,
            left=left,
            color=_OUTCOME_COLORS[outcome],
            label=outcome.replace("_", "-"),
            height=0.7,
        )
        left = [a + b for a, b in zip(left, values, strict=True)]
    for y, row in zip(positions, rows, strict=True):
        note = f"{row.messages:,}"
        if row.redelivered_messages:
            note += f" ({row.redelivered_messages:,} redelivered)"
        ax.text(row.messages, y, " " + note, va="center", fontsize="small")
    ax.set_yticks(positions, [_text(row.destination) for row in rows])
    ax.invert_yaxis()  # busiest on top
    ax.set_xlim(0, max(row.messages for row in rows) * 1.3 or 1)  # room for the totals
    ax.set_xlabel("messages")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(
        ncols=len(OUTCOMES),
        fontsize="small",
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
    )


def render(reports: Reports, out: Path, title: str) -> None:
    """Draw `reports` as one PNG at `out` (written under a temporary name, then renamed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    out.parent.mkdir(parents=True, exist_ok=True)  # before the drawing it would waste
    grouping = top_destinations(reports)
    colors = _colors(grouping)
    fig = Figure(figsize=(16, 10), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    try:
        (ax_msgs, ax_lat), (ax_sizes, ax_out) = fig.subplots(2, 2)
        _draw_messages(ax_msgs, messages_per_minute(reports, grouping), colors)
        _draw_latency(ax_lat, latency_per_minute(reports, grouping), colors, len(grouping.others))
        _draw_sizes(ax_sizes, *sizes_by_bucket(reports, grouping), colors)
        _draw_outcomes(ax_out, outcomes_by_destination(reports, grouping))

        fig.suptitle(_escape(chart_title(reports, title)), fontsize="large")
        if grouping.labels:
            totals = reports.destinations()
            handles = [Patch(color=colors[label], label=_text(label)) for label in grouping.labels]
            legend_title = (
                f"destinations: top {len(grouping.top)} of {len(totals)}\nby messages"
                if grouping.others
                else "destinations"
            )
            fig.legend(handles=handles, loc="outside right upper", title=legend_title)

        # Not mkstemp: its file is private (0600), a chart is for others to look at.
        tmp = out.with_name(f".{out.name}.{secrets.token_hex(4)}.tmp")
        try:
            with open(tmp, "xb") as fh:
                fig.savefig(fh, format="png")
            os.replace(tmp, out)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    finally:
        fig.clear()


def require_matplotlib() -> None:
    """ChartError saying how to install matplotlib when it is missing (checked before any
    work, so a run that asked for a chart does not end in a traceback after it)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ChartError(
            "matplotlib",
            "the chart needs matplotlib: pip install -e '.[spark]' in the mpbroker checkout"
            " (or pip install 'matplotlib>=3.8')",
        )


def write_reports_chart(reports: Reports, out: Path, title: str) -> Path:
    """Chart `reports` as a PNG at `out`; `out`. ChartError for an `out` that cannot be
    written (nothing is left half written)."""
    try:
        render(reports, out, title)
    except OSError as exc:
        raise ChartError(out, exc.strerror or str(exc)) from None
    return out


def write_chart(table: Path, out: Path, title: str = "") -> Path:
    """Chart TABLE/_reports as a PNG at `out`; `out`. ChartError (nothing written) for
    missing or damaged reports or an `out` that cannot be written. The default title names
    the table."""
    return write_reports_chart(
        load_reports(table / REPORTS_DIR), out, title or f"mpbroker reports: {table}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark.chart",
        description="Draw the reports of python -m spark.ingest (TABLE/_reports/) as a PNG.",
    )
    parser.add_argument("--table", required=True, type=Path, help="the ingest job's --output")
    parser.add_argument("--out", required=True, type=Path, help="the PNG file to write")
    parser.add_argument("--title", default="", help="default: names the table")
    args = parser.parse_args(argv)
    try:
        require_matplotlib()
        path = write_chart(args.table, args.out, args.title)
    except ChartError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
