"""``mpbroker bench --filters`` and ``--filter-targets``: the selector study.

It repeats Henjes, Menth and Himmler, "Impact of Complex Filters on the Message Throughput of
the ActiveMQ JMS Server" (ITC 2007) against one broker: one producer publishes to a topic, and
``n`` subscriptions (spread over a few connections) carry selectors of one kind with ``m``
components, ``r`` of which select each message (:mod:`mpbroker.loadgen.filters`). Each point
measures the messages published and fully delivered per second and the server's CPU per
message; :mod:`mpbroker.loadgen.model` fits ``B = t_rcv + n*m*t_fltr + r*t_tx`` to them.

``--filter-targets`` measures the two targets of the selector work, against the same broker:

1. a topic with 10,000 subscribers whose simple filters never match, plus one that matches
   every message, against that one subscriber alone: at least 0.8 of its throughput;
2. a queue with 100 consumers with disjoint ``ID = 'k<j>'`` selectors (the messages' IDs
   cycle over the 100 values), against one consumer without a selector: at least 0.5.

Ratios are printed with whether they are met, never asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mpbroker.harness import BrokerProcess, ServerError

from .cpu import listening_server_pid
from .filterproc import FilterPoint
from .filterrun import FilterRunResult, run_point
from .filters import KINDS, NO_FILTER, FilterPlan, parse_int_list, parse_kinds
from .model import PAPER_ACTIVEMQ, Fit, ModelPoint, fit
from .scenario import ACK_MODES, Scenario, check_counts
from .wire import BODY_HEADER_BYTES

__all__ = [
    "FilterOptions",
    "Target",
    "add_filter_arguments",
    "filter_options_from_args",
    "format_report",
    "run_filters",
    "targets",
]

TOPIC = "/topic/bench.filters"
QUEUE = "/queue/bench.filters"
#: The fewest messages a point sends before its time budget may stop it.
MIN_COUNT = 200
#: Target 1: non-matching subscribers next to the one that matches.
TARGET_NONMATCHING = 10_000
#: Target 2: queue consumers with disjoint selectors.
TARGET_QUEUE_CONSUMERS = 100

_DEFAULTS = Scenario()
# Options of the plain bench that mean nothing here (their defaults, to tell them apart).
_NOT_HERE: dict[str, tuple[str, object]] = {
    "--baseline": ("baseline", False),
    "--producers": ("producers", _DEFAULTS.producers),
    "--consumers": ("consumers", _DEFAULTS.consumers),
    "--destination": ("destination", _DEFAULTS.destination),
    "--ack": ("ack", _DEFAULTS.ack),
    "--ack-every": ("ack_every", None),
}


def add_filter_arguments(parser: argparse.ArgumentParser) -> None:
    """The option group of the filter study."""
    group = parser.add_argument_group(
        "selector study (Henjes et al., ITC 2007)",
        "One producer publishes to a topic; N subscriptions over a few connections carry JMS"
        " selectors of one kind, R of them select each message. Reports msgs/s, server CPU per"
        " message and the fit of B = t_rcv + n*m*t_fltr + r*t_tx. --count is the most"
        " messages per point; --size, --persistent, --prefetch, --receipt-every,"
        " --max-in-flight, --max-backlog, --repeat, --timeout, --port, --gateways and --json"
        " apply as usual.",
    )
    group.add_argument(
        "--filters",
        action="store_true",
        help="run the study: every --filter-subscribers x --filter-kinds x --replication point",
    )
    group.add_argument(
        "--filter-targets",
        action="store_true",
        help=f"measure the selector targets: a topic with {TARGET_NONMATCHING:,} non-matching"
        " subscribers plus one matching against that one alone (>= 0.8), and a queue with"
        f" {TARGET_QUEUE_CONSUMERS} consumers with disjoint selectors against one plain"
        " consumer (>= 0.5); with --filters, after the study",
    )
    group.add_argument(
        "--filter-subscribers",
        default="1,10,100,1000,10000",
        metavar="N,N,...",
        help="subscriber counts n (default %(default)s)",
    )
    group.add_argument(
        "--filter-kinds",
        default=",".join(KINDS),
        metavar="KIND,...",
        help="selector kinds: simple (ID = 'k<i>'), and (ID = 'k<i>' AND a1 = 'x' ...), or"
        " (ID = 'k<i>' OR ID = 'k<i+n>' ...), in (ID IN ('k<i>', 'k<i+n>', ...))"
        " (default %(default)s)",
    )
    group.add_argument(
        "--filter-components",
        type=int,
        default=5,
        metavar="M",
        help="components m of and/or/in selectors; simple ones have 1 (default %(default)s)",
    )
    group.add_argument(
        "--replication",
        default="1",
        metavar="R,R,...",
        help="replication grades r: subscribers that select each message; two or more"
        " grades let the fit separate t_tx from t_rcv; points with r > n are skipped"
        " (default %(default)s)",
    )
    group.add_argument(
        "--filter-connections",
        type=int,
        default=4,
        metavar="C",
        help="subscriber connections (one process each) the subscriptions are spread over"
        " (default %(default)s)",
    )
    group.add_argument(
        "--filter-seconds",
        type=float,
        default=10.0,
        metavar="S",
        help="a point stops sending after S seconds once it sent"
        f" {MIN_COUNT} messages, so slow points stay short (default %(default)g)",
    )


@dataclass(frozen=True, slots=True)
class FilterOptions:
    """The filter study the options describe."""

    study: bool
    targets: bool
    subscribers: tuple[int, ...]
    kinds: tuple[str, ...]
    components: int
    replication: tuple[int, ...]
    connections: int
    budget_s: float
    count: int
    repeat: int
    size_bytes: int
    persistent: bool
    prefetch: int
    receipt_every: int
    max_in_flight: int
    max_backlog: int
    stall_timeout_s: float

    def point(self, plan: FilterPlan, destination: str) -> FilterPoint:
        return FilterPoint(
            plan=plan,
            destination=destination,
            connections=min(self.connections, plan.subscribers),
            count=self.count,
            min_count=min(MIN_COUNT, self.count),
            budget_s=self.budget_s,
            size_bytes=self.size_bytes,
            persistent=self.persistent,
            prefetch=self.prefetch,
            receipt_every=self.receipt_every,
            max_in_flight=self.max_in_flight,
            max_backlog=self.max_backlog,
            stall_timeout_s=self.stall_timeout_s,
        )

    def grid(self) -> list[FilterPlan]:
        """The study's plans: per replication grade, per kind, n ascending (r > n skipped).
        Messages carry the properties of the widest AND filter at every point."""
        plans = []
        for r in self.replication:
            for kind in self.kinds:
                m = 1 if kind == "simple" else self.components
                for n in self.subscribers:
                    if r <= n:
                        plans.append(FilterPlan(n, kind, m, r, message_components=self.components))
        return plans


def filter_options_from_args(args: argparse.Namespace) -> FilterOptions:
    """The filter study of ``args``; ``ValueError`` says which option is wrong."""
    for option, (dest, default) in _NOT_HERE.items():
        if getattr(args, dest) != default:
            raise ValueError(f"{option} does not apply to --filters or --filter-targets")
    subscribers = parse_int_list("--filter-subscribers", args.filter_subscribers)
    kinds = parse_kinds("--filter-kinds", args.filter_kinds)
    replication = parse_int_list("--replication", args.replication)
    check_counts(
        {
            "--filter-components": args.filter_components,
            "--filter-connections": args.filter_connections,
        },
        args,
    )
    if args.filter_seconds <= 0:
        raise ValueError(f"--filter-seconds must be positive, got {args.filter_seconds:g}")
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {args.timeout:g}")
    if args.size < BODY_HEADER_BYTES:
        raise ValueError(f"--size must be at least {BODY_HEADER_BYTES} bytes, got {args.size}")
    if args.gateways is not None and args.port is not None:
        raise ValueError("--gateways applies to a broker the bench starts, not with --port")
    if args.filters and max(replication) > max(subscribers):
        raise ValueError(
            f"--replication {max(replication)} exceeds every --filter-subscribers value"
        )
    if args.ack not in ACK_MODES:  # pragma: no cover - argparse checks the choices
        raise ValueError(f"--ack {args.ack!r}")
    return FilterOptions(
        study=args.filters,
        targets=args.filter_targets,
        subscribers=subscribers,
        kinds=kinds,
        components=args.filter_components,
        replication=replication,
        connections=args.filter_connections,
        budget_s=args.filter_seconds,
        count=args.count,
        repeat=args.repeat,
        size_bytes=args.size,
        persistent=args.persistent,
        prefetch=args.prefetch,
        receipt_every=args.receipt_every,
        max_in_flight=args.max_in_flight,
        max_backlog=args.max_backlog,
        stall_timeout_s=args.timeout,
    )


# -- measuring --------------------------------------------------------------------------------


@dataclass(eq=False)
class Measured:
    """The runs of one point (``--repeat`` of them); figures are medians."""

    point: FilterPoint
    runs: list[FilterRunResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.runs) and all(run.ok for run in self.runs)

    @property
    def message_rate(self) -> float:
        return statistics.median(run.message_rate for run in self.runs) if self.runs else 0.0

    @property
    def delivery_rate(self) -> float:
        return statistics.median(run.delivery_rate for run in self.runs) if self.runs else 0.0

    @property
    def server_us(self) -> float | None:
        values = [run.server_us_per_message for run in self.runs]
        known = [v for v in values if v is not None]
        return statistics.median(known) if known and len(known) == len(values) else None

    @property
    def client_us(self) -> float:
        return statistics.median(r.client_us_per_message for r in self.runs) if self.runs else 0.0

    @property
    def subscribe_s(self) -> float:
        return max((run.subscribe_s for run in self.runs), default=0.0)

    @property
    def sent(self) -> int:
        return sum(run.sent for run in self.runs)

    def as_dict(self) -> dict[str, Any]:
        us = self.server_us
        return {
            "label": self.point.plan.label,
            "destination": self.point.destination,
            "kind": self.point.plan.kind,
            "n": self.point.plan.subscribers,
            "m": self.point.plan.filter_components,
            "r": self.point.plan.replication,
            "messages_per_s": round(self.message_rate, 1),
            "deliveries_per_s": round(self.delivery_rate, 1),
            "server_us_per_message": None if us is None else round(us, 2),
            "client_us_per_message": round(self.client_us, 2),
            "subscribe_s": round(self.subscribe_s, 3),
            "ok": self.ok,
            "runs": [run.as_dict() for run in self.runs],
        }


@dataclass(frozen=True, slots=True)
class Target:
    """A target: ``subject`` must reach ``minimum`` times the throughput of ``reference``."""

    name: str
    subject: Measured
    reference: Measured
    minimum: float

    @property
    def ratio(self) -> float:
        ref = self.reference.message_rate
        return self.subject.message_rate / ref if ref > 0 else 0.0

    @property
    def cpu_ratio(self) -> float | None:
        """The same ratio on the server's CPU: reference us/msg over subject us/msg (what the
        throughputs would be if the server had the cores to itself)."""
        ours, theirs = self.subject.server_us, self.reference.server_us
        return theirs / ours if ours and theirs else None

    @property
    def met(self) -> bool:
        return self.subject.ok and self.reference.ok and self.ratio >= self.minimum

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "subject": self.subject.as_dict(),
            "reference": self.reference.as_dict(),
            "ratio": round(self.ratio, 3),
            "cpu_ratio": None if self.cpu_ratio is None else round(self.cpu_ratio, 3),
            "minimum": self.minimum,
            "met": self.met,
        }


def targets(options: FilterOptions) -> list[tuple[str, float, FilterPoint, FilterPoint]]:
    """The two targets: name, minimum ratio, subject point, reference point."""
    n = TARGET_NONMATCHING + 1
    q = TARGET_QUEUE_CONSUMERS
    return [
        (
            f"topic: {TARGET_NONMATCHING:,} non-matching simple filters + 1 matching,"
            " against the matching one alone",
            0.8,
            options.point(FilterPlan(n, "simple"), TOPIC),
            options.point(FilterPlan(1, "simple"), TOPIC),
        ),
        (
            f"queue: {q} consumers with disjoint ID selectors (IDs cycle over {q} values),"
            " against one consumer without a selector",
            0.5,
            options.point(FilterPlan(q, "simple", keys=q), QUEUE),
            options.point(FilterPlan(1, NO_FILTER), QUEUE),
        ),
    ]


def _say(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


Runner = Callable[[FilterPoint], FilterRunResult]


def _measure(points: Sequence[FilterPoint], repeat: int, run: Runner) -> list[Measured]:
    """Run each point ``repeat`` times, alternating between them (so a burst of someone
    else's load hits all alike)."""
    measured = [Measured(point) for point in points]
    for repetition in range(repeat):
        for entry in measured:
            of = f" ({repetition + 1}/{repeat})" if repeat > 1 else ""
            label = f"{entry.point.destination} {entry.point.plan.label}"
            _say(f"running {label}{of}")
            result = run(entry.point)
            _say(
                f"  {result.sent} sent, {result.message_rate:,.0f} msgs/s"
                + (
                    ""
                    if result.server_us_per_message is None
                    else f", server {result.server_us_per_message:,.1f} us/msg"
                )
                + ("" if result.ok else f": FAILED: {result.check.summary()} {result.aborted}")
            )
            entry.runs.append(result)
    return measured


@dataclass(frozen=True, slots=True)
class Study:
    grid: list[Measured]
    targets: list[Target]

    @property
    def ok(self) -> bool:
        everything = [*self.grid, *(m for t in self.targets for m in (t.subject, t.reference))]
        return bool(everything) and all(m.ok for m in everything)


def study(options: FilterOptions, run: Runner) -> Study:
    """Run what ``options`` ask for with ``run``: the grid (one point at a time, each
    repeated), then the targets (subject and reference alternating)."""
    grid = [options.point(plan, TOPIC) for plan in options.grid()] if options.study else []
    measured = []
    for point in grid:
        measured += _measure([point], options.repeat, run)
    found: list[Target] = []
    if options.targets:
        for name, minimum, subject, reference in targets(options):
            ref, subj = _measure([reference, subject], options.repeat, run)
            found.append(Target(name, subj, ref, minimum))
    return Study(measured, found)


# -- fitting and reporting --------------------------------------------------------------------


def fits(grid: Sequence[Measured]) -> dict[str, dict[str, Fit | str]]:
    """Least-squares fits per kind and over all points: on the server's CPU per message
    (``"server CPU"``, when known) and on 1 / throughput (``"wall clock"``). A fit that
    cannot be made is the reason instead."""
    good = [m for m in grid if m.ok and m.message_rate > 0]
    groups: dict[str, list[Measured]] = {}
    for m in good:
        groups.setdefault(m.point.plan.kind, []).append(m)
    if len(groups) > 1:
        groups["all"] = good
    out: dict[str, dict[str, Fit | str]] = {}
    for basis in ("server CPU", "wall clock"):
        per: dict[str, Fit | str] = {}
        for kind, members in groups.items():
            points = []
            for m in members:
                plan = m.point.plan
                if basis == "server CPU":
                    us = m.server_us
                    if us is None:
                        break
                    if us <= 0:
                        # /proc counts CPU in ticks of 10 ms: a short point may show none.
                        per[kind] = (
                            f"no server CPU measured at {plan.label} (too few messages for"
                            " /proc's 10 ms ticks: raise --count or --filter-seconds)"
                        )
                        break
                    seconds = us / 1e6
                else:
                    seconds = 1.0 / m.message_rate
                points.append(
                    ModelPoint(plan.subscribers, plan.filter_components, plan.replication, seconds)
                )
            else:
                try:
                    per[kind] = fit(points)
                except ValueError as exc:
                    per[kind] = str(exc)
        if per:
            out[basis] = per
    return out


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    widths = [max(len(r[i]) for r in (headers, *rows)) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            f"{c:<{w}}" if i < left else f"{c:>{w}}"
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def _format_fit(result: Fit | str) -> list[str]:
    if isinstance(result, str):
        return ["-", "-", "-", "-", result]
    tx = "-" if result.t_tx is None else f"{result.t_tx * 1e6:,.2f}"
    rcv = f"{result.t_rcv * 1e6:,.2f}"
    note = f"t_rcv includes r*t_tx (r={result.folded_r})" if result.folded_r is not None else ""
    return [rcv, f"{result.t_fltr * 1e9:,.3f}", tx, f"{result.rms_error:.0%}", note]


def format_report(result: Study, *, repeat: int) -> str:
    """The study as text: per-point table, n x kind summary, fits, paper figures, targets."""
    out: list[str] = []
    median = f" (medians of {repeat} runs)" if repeat > 1 else ""
    if result.grid:
        out.append(f"selector study on {TOPIC}{median}")
        rows = [
            [
                m.point.plan.kind,
                str(m.point.plan.filter_components),
                f"{m.point.plan.subscribers:,}",
                str(m.point.plan.replication),
                f"{m.sent:,}",
                f"{m.message_rate:,.0f}",
                f"{m.delivery_rate:,.0f}",
                _us(m.server_us),
                _us(m.client_us),
                f"{m.subscribe_s:.2f}",
                "ok" if m.ok else "FAILED",
            ]
            for m in result.grid
        ]
        out += _table(
            [
                "kind",
                "m",
                "n",
                "r",
                "sent",
                "msgs/s",
                "deliv/s",
                "server us/msg",
                "client us/msg",
                "subscribe s",
                "check",
            ],
            rows,
        )
        out.append("")
        out += _pivot(result.grid)
        out.append("")
        out += _fit_lines(result.grid)
    for target in result.targets:
        if out:
            out.append("")
        out += _target_lines(target, median)
    problems = [
        (m, run)
        for m in [*result.grid, *(x for t in result.targets for x in (t.subject, t.reference))]
        for run in m.runs
        if not run.ok
    ]
    out.append("")
    if not problems:
        runs = sum(len(m.runs) for m in result.grid) + sum(
            len(t.subject.runs) + len(t.reference.runs) for t in result.targets
        )
        out.append(
            f"ok: in all {runs} runs every selected delivery arrived exactly once (in order on"
            " the topic) and no subscriber got a message its selector rejects"
        )
    for m, run in problems:
        out.append(f"FAILED: {m.point.destination} {m.point.plan.label}: {run.check.summary()}")
        if run.aborted:
            out.append(f"  aborted: {run.aborted}")
        out += [f"  error: {e}" for e in run.errors]
    return "\n".join(out)


def _pivot(grid: Sequence[Measured]) -> list[str]:
    """n down, kind across: msgs/s (server us/msg), per replication grade."""
    out: list[str] = []
    for r in sorted({m.point.plan.replication for m in grid}):
        members = [m for m in grid if m.point.plan.replication == r]
        kinds = [k for k in KINDS if any(m.point.plan.kind == k for m in members)]
        ns = sorted({m.point.plan.subscribers for m in members})
        cell = {(m.point.plan.kind, m.point.plan.subscribers): m for m in members}
        rows = []
        for n in ns:
            row = [f"{n:,}"]
            for kind in kinds:
                m = cell.get((kind, n))
                row.append("-" if m is None else f"{m.message_rate:,.0f} ({_us(m.server_us)})")
            rows.append(row)
        components = {m.point.plan.kind: m.point.plan.components for m in members}
        headers = [f"n (r={r})"] + [
            kind if kind == "simple" else f"{kind} m={components[kind]}" for kind in kinds
        ]
        out.append("msgs/s (server us/msg):")
        out += _table(headers, rows)
    return out


def _fit_lines(grid: Sequence[Measured]) -> list[str]:
    out = [
        "model B = t_rcv + n*m*t_fltr + r*t_tx, least squares on relative errors over the"
        " points above (t_fltr per filter component and subscriber):"
    ]
    rows = []
    for basis, per in fits(grid).items():
        for kind, result in per.items():
            rows.append([basis, kind, *_format_fit(result)])
    out += _table(
        ["fitted on", "kind", "t_rcv us", "t_fltr ns", "t_tx us", "rms error", "note"],
        rows,
        left=2,
    )
    paper = PAPER_ACTIVEMQ["t_fltr"]
    out.append(
        f"ActiveMQ 4.0 (Henjes et al., ITC 2007): t_fltr ~ {paper * 1e9:.0f} ns per filter"
        f" component and message, throughput falling linearly in n: at n*m = 10,000 that is"
        f" {paper * 1e4 * 1e3:.1f} ms per message, at most {1 / (paper * 1e4):,.0f} msgs/s"
    )
    return out


def _target_lines(target: Target, median: str) -> list[str]:
    subject, reference = target.subject, target.reference
    verdict = "met" if target.met else "NOT MET"
    if not (subject.ok and reference.ok):
        verdict += " (a run failed its check)"
    return [
        f"target: {target.name}{median}",
        f"  subject:   {subject.message_rate:,.0f} msgs/s, server {_us(subject.server_us)}"
        f" us/msg, subscribe {subject.subscribe_s:.2f} s",
        f"  reference: {reference.message_rate:,.0f} msgs/s, server {_us(reference.server_us)}"
        " us/msg",
        f"  ratio {target.ratio:.2f} (target >= {target.minimum}): {verdict}",
        "  on server CPU (reference us/msg / subject us/msg): "
        + ("-" if target.cpu_ratio is None else f"{target.cpu_ratio:.2f}"),
    ]


def format_json(result: Study) -> str:
    document: dict[str, Any] = {
        "points": [m.as_dict() for m in result.grid],
        "fits": {
            basis: {
                kind: (
                    value
                    if isinstance(value, str)
                    else {
                        "t_rcv_s": value.t_rcv,
                        "t_fltr_s": value.t_fltr,
                        "t_tx_s": value.t_tx,
                        "rms_error": value.rms_error,
                        "points": value.points,
                    }
                )
                for kind, value in per.items()
            }
            for basis, per in fits(result.grid).items()
        },
        "paper_activemq": PAPER_ACTIVEMQ,
        "targets": [t.as_dict() for t in result.targets],
        "ok": result.ok,
    }
    return json.dumps(document, sort_keys=True)


def run_filters(args: argparse.Namespace) -> int:
    """``mpbroker bench --filters`` / ``--filter-targets``: returns the exit status."""
    try:
        options = filter_options_from_args(args)
        if args.server_pid is not None and args.port is None:
            raise ValueError(
                "--server-pid applies with --port (a broker the bench starts is known)"
            )
    except ValueError as exc:
        _say(str(exc))
        return 2
    broker: BrokerProcess | None = None
    pid: int | None
    failure = ""
    result = Study([], [])
    try:
        if args.port is None:
            broker = BrokerProcess(gateways=args.gateways, admin=False)
            broker.start()
            _say(f"mpbroker (pid {broker.pid}) ready on {broker.host}:{broker.port}")
            host, port, pid, name = broker.host, broker.port, broker.pid, "mpbroker"
        else:
            pid = args.server_pid or listening_server_pid(args.port)
            host, port, name = args.host, args.port, f"{args.host}:{args.port}"

        def run(point: FilterPoint) -> FilterRunResult:
            return run_point(point, host, port, server=name, server_pid=pid)

        result = study(options, run)
    except ServerError as exc:
        failure = str(exc)
    finally:
        if broker is not None:
            try:
                broker.stop_checked()
            except ServerError as exc:
                failure = failure or str(exc)
    if failure:
        _say(failure)
    if result.grid or result.targets:
        print(format_json(result) if args.json else format_report(result, repeat=options.repeat))
    return 0 if result.ok and not failure else 1
