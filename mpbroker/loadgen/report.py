"""Results of runs, as a table for people and a JSON line for scripts.

Rates, all over wall-clock time on one shared clock:

- *sent/s*: messages sent / (first send -> RECEIPT of the last message, slowest producer);
- *recv/s*: deliveries / (first send -> last delivery), the headline number;
- *total/s*: (messages sent + deliveries) / (first send -> last delivery);
- *MB/s*: body bytes delivered / (first send -> last delivery), in 10^6 bytes.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .scenario import Scenario
from .tally import CheckResult

__all__ = [
    "BASELINE",
    "RunResult",
    "by_server",
    "format_json",
    "format_table",
    "median_rates",
    "ratios",
]

#: The server name of runs against the baseline server; other runs get ratios against it.
BASELINE = "baseline"


@dataclass(frozen=True, slots=True)
class RunResult:
    """One scenario run against one server."""

    server: str
    scenario: Scenario
    sent: int
    check: CheckResult
    #: Seconds from the first send to the RECEIPT of the last message.
    send_s: float
    #: Seconds from the first send to the last delivery.
    elapsed_s: float
    #: ERROR frames and failures of processes, one line each.
    errors: tuple[str, ...] = ()
    #: Why the run was cut short (a stall, a failed process), or "".
    aborted: str = ""
    #: time.monotonic() when the run began (orders runs in reports).
    started: float = 0.0
    #: Process id of the server, when the bench started it.
    server_pid: int | None = None
    #: CPU seconds the producer processes used during the run.
    producer_cpu_s: float = 0.0
    #: CPU seconds the consumer processes used during the run.
    consumer_cpu_s: float = 0.0
    #: CPU seconds the server and its child processes used during the run (None when the
    #: bench did not start the server, or /proc is not readable).
    server_cpu_s: float | None = None
    #: Memory of the server and its child processes once every delivery arrived (summed
    #: PSS; None as for ``server_cpu_s``).
    server_memory_bytes: int | None = None
    #: ``server_cpu_s`` by process (mpbroker's by role: "gateway 0", "p2p 0"), for those
    #: that ran from the start of the run to its end.
    server_cpu_by_process: dict[str, float] = field(default_factory=dict)
    #: Consumer socket reads that brought messages (see :attr:`messages_per_read`).
    consumer_reads: int = 0

    @property
    def received(self) -> int:
        return self.check.received

    @property
    def ok(self) -> bool:
        return self.check.ok and not self.errors and not self.aborted

    @property
    def client_cpu_s(self) -> float:
        """CPU seconds of the bench's own processes: what the load generator took from the
        machine the server runs on."""
        return self.producer_cpu_s + self.consumer_cpu_s

    @property
    def messages_per_read(self) -> float:
        """Deliveries per consumer socket read: how many frames the server writes at once."""
        return self.received / self.consumer_reads if self.consumer_reads else 0.0

    @property
    def server_us_per_delivery(self) -> float | None:
        """Server CPU microseconds per delivery: what a message costs the broker all the
        way (a topic's per subscriber that got it)."""
        if self.server_cpu_s is None or not self.received:
            return None
        return self.server_cpu_s / self.received * 1e6

    @property
    def server_us_per_delivery_by_process(self) -> dict[str, float]:
        """`server_us_per_delivery` of each server process (those using any CPU), the
        busiest first: where the broker's time goes."""
        if not self.received:
            return {}
        busy = [(name, s) for name, s in self.server_cpu_by_process.items() if s > 0]
        busy.sort(key=lambda item: -item[1])
        return {name: seconds / self.received * 1e6 for name, seconds in busy}

    @property
    def sent_rate(self) -> float:
        return _rate(self.sent, self.send_s)

    @property
    def received_rate(self) -> float:
        return _rate(self.received, self.elapsed_s)

    @property
    def total_rate(self) -> float:
        return _rate(self.sent + self.received, self.elapsed_s)

    @property
    def mb_rate(self) -> float:
        return _rate(self.received * self.scenario.size_bytes, self.elapsed_s) / 1e6

    def as_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "server_pid": self.server_pid,
            "scenario": self.scenario.label,
            "sent": self.sent,
            "received": self.received,
            "expected": self.check.expected,
            "missing": self.check.missing,
            "duplicated": self.check.duplicated,
            "reordered": self.check.reordered,
            "foreign": self.check.foreign,
            "send_s": round(self.send_s, 4),
            "elapsed_s": round(self.elapsed_s, 4),
            "sent_per_s": round(self.sent_rate),
            "received_per_s": round(self.received_rate),
            "total_per_s": round(self.total_rate),
            "mb_per_s": round(self.mb_rate, 3),
            "all_arrived": self.check.ok,
            "ok": self.ok,
            "producer_cpu_s": round(self.producer_cpu_s, 3),
            "consumer_cpu_s": round(self.consumer_cpu_s, 3),
            "server_cpu_s": None if self.server_cpu_s is None else round(self.server_cpu_s, 3),
            "server_us_per_delivery": (
                None
                if self.server_us_per_delivery is None
                else round(self.server_us_per_delivery, 2)
            ),
            "server_memory_mib": (
                None
                if self.server_memory_bytes is None
                else round(self.server_memory_bytes / 2**20, 1)
            ),
            "server_us_per_delivery_by_process": {
                name: round(us, 2) for name, us in self.server_us_per_delivery_by_process.items()
            },
            "messages_per_read": round(self.messages_per_read, 1),
            "errors": list(self.errors),
            "aborted": self.aborted,
        }


def _rate(amount: int, seconds: float) -> float:
    return amount / seconds if seconds > 0 else 0.0


def median_rates(runs: Sequence[RunResult]) -> dict[str, float]:
    """Median sent, received and total rates of repeated runs of one server.

    The median, not the mean: on a shared machine one run that collided with someone
    else's job should not move the result.
    """
    return {
        "sent": statistics.median(run.sent_rate for run in runs),
        "received": statistics.median(run.received_rate for run in runs),
        "total": statistics.median(run.total_rate for run in runs),
    }


def ratios(runs: Sequence[RunResult], baseline: Sequence[RunResult]) -> dict[str, float]:
    """Median rates of ``runs`` divided by those of ``baseline`` (0 where it measured 0)."""
    ours = median_rates(runs)
    theirs = median_rates(baseline)
    return {key: ours[key] / theirs[key] if theirs[key] > 0 else 0.0 for key in ours}


def by_server(runs: Sequence[RunResult]) -> dict[str, list[RunResult]]:
    """Runs grouped by server name, in order of first appearance."""
    groups: dict[str, list[RunResult]] = {}
    for run in runs:
        groups.setdefault(run.server, []).append(run)
    return groups


_COLUMNS = (
    ("server", "<"),
    ("scenario", "<"),
    ("sent", ">"),
    ("received", ">"),
    ("elapsed s", ">"),
    ("sent/s", ">"),
    ("recv/s", ">"),
    ("total/s", ">"),
    ("MB/s", ">"),
)


def format_table(runs: Sequence[RunResult]) -> str:
    """The runs as an aligned table, check and CPU lines per run, medians of repeated
    runs, and the ratios of every other server's (median) rates to the baseline's."""
    rows = [
        (
            run.server,
            run.scenario.label,
            f"{run.sent}",
            f"{run.received}",
            f"{run.elapsed_s:.3f}",
            f"{run.sent_rate:,.0f}",
            f"{run.received_rate:,.0f}",
            f"{run.total_rate:,.0f}",
            f"{run.mb_rate:.2f}",
        )
        for run in runs
    ]
    headers = tuple(name for name, _ in _COLUMNS)
    widths = [max(len(r[i]) for r in (headers, *rows)) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        parts = [
            f"{cell:{align}{width}}"
            for cell, (_, align), width in zip(cells, _COLUMNS, widths, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [line(headers)]
    out += [line(row) for row in rows]
    out.append("")
    for run in runs:
        verdict = "ok" if run.ok else "FAILED"
        out.append(f"{run.server}: {verdict}: {run.check.summary()}; {_cpu_summary(run)}")
        by_process = run.server_us_per_delivery_by_process
        if len(by_process) > 1:
            parts = ", ".join(f"{name} {us:.2f}" for name, us in by_process.items())
            out.append(f"{run.server}: server us/delivery by process: {parts}")
        if run.aborted:
            out.append(f"{run.server}: aborted: {run.aborted}")
        out += [f"{run.server}: error: {error}" for error in run.errors]
    groups = by_server(runs)
    for server, group in groups.items():
        if len(group) > 1:
            m = median_rates(group)
            out.append(
                f"{server}: median of {len(group)} runs: sent {m['sent']:,.0f}/s,"
                f" received {m['received']:,.0f}/s, total {m['total']:,.0f}/s"
            )
    baseline = groups.get(BASELINE)
    if baseline is not None:
        for server, group in groups.items():
            if server == BASELINE:
                continue
            r = ratios(group, baseline)
            median = " (medians)" if len(group) > 1 or len(baseline) > 1 else ""
            out.append(
                f"{server}/baseline{median}: sent x{r['sent']:.2f}, received x{r['received']:.2f},"
                f" total x{r['total']:.2f}"
            )
    return "\n".join(out)


def format_json(runs: Sequence[RunResult]) -> str:
    """One JSON line: every run, medians per server, ratios to the baseline, overall ok."""
    groups = by_server(runs)
    document: dict[str, Any] = {
        "runs": [run.as_dict() for run in runs],
        "medians": {
            server: {k: round(v) for k, v in median_rates(group).items()}
            for server, group in groups.items()
        },
        "ok": all(run.ok for run in runs),
    }
    baseline = groups.get(BASELINE)
    if baseline is not None:
        document["ratios"] = {
            server: {k: round(v, 3) for k, v in ratios(group, baseline).items()}
            for server, group in groups.items()
            if server != BASELINE
        }
    return json.dumps(document, sort_keys=True)


def _cpu_summary(run: RunResult) -> str:
    # Per delivery (a topic's: per subscriber that got the message), as brokers are
    # compared; the clients' figure in the same unit says what the load generator took.
    per = max(1, run.received)
    server = (
        "server CPU unknown"
        if run.server_cpu_s is None
        else f"server {run.server_cpu_s:.2f} CPU-s ({run.server_cpu_s / per * 1e6:.1f} us/delivery)"
    )
    memory = (
        ""
        if run.server_memory_bytes is None
        else f"; server memory {run.server_memory_bytes / 2**20:.0f} MiB"
    )
    return (
        f"CPU: {server}, clients {run.client_cpu_s:.2f} CPU-s"
        f" ({run.client_cpu_s / per * 1e6:.1f} us/delivery){memory};"
        f" {run.messages_per_read:.0f} msgs/read"
    )
