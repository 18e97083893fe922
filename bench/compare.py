"""Before and after: the issue's three scenarios against two versions of the broker, in turns.

Run: .venv/bin/python -m bench.compare --before REV[+compiled] [--after REV|.[+compiled]]
[--rounds 3] [--scenario queue,topic,persistent] [--count N] [--json]

A change that saves a microsecond per message is smaller than what this shared two-core
machine drifts by between two runs minutes apart (the same bench has measured 2.3 and 3.4
CPU-s). So the versions take turns: every round runs each scenario once against each
version, in an order that alternates from round to round, and the table shows medians.
``--before`` is a git revision, exported with ``git archive`` into a temporary directory;
``--after`` is another revision, or by default this checkout as it is (uncommitted changes
included). Either may end in ``+compiled``: its hot modules are then compiled with mypyc
(the wheel ``pip wheel`` builds of the exported tree, unpacked; docs/benchmarks.md,
"Compiled modules"). The broker runs with its version's tree first on ``PYTHONPATH``, from a
temporary working directory, so nothing of another version can be imported.

The scenarios are the performance issue's: 100-byte non-persistent messages from one
producer to one queue consumer (``queue``), to four topic subscribers (``topic``), and
persistent messages to one queue consumer with a receipt every 1,000 (``persistent``; the
RECEIPT comes after the group commit). Per scenario and version: received msgs/s, the
server's CPU per delivery (user + system of all its processes over the messages delivered),
and its memory once every delivery arrived (summed PSS).

Exit status 0 when every run checked out, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpbroker.harness import BrokerProcess, ServerError

__all__ = ["SCENARIOS", "Sample", "main", "table"]

REPO = Path(__file__).resolve().parent.parent

#: name -> (`mpbroker bench` arguments, messages sent by default)
SCENARIOS: dict[str, tuple[list[str], int]] = {
    "queue": (["--destination", "/queue/bench", "--consumers", "1"], 200_000),
    "topic": (["--destination", "/topic/bench", "--consumers", "4"], 100_000),
    "persistent": (["--destination", "/queue/bench", "--persistent"], 100_000),
}


@dataclass
class Sample:
    """What the runs of one scenario against one version measured."""

    rates: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    memory_mib: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def add(self, run: dict[str, Any]) -> None:
        if not run.get("ok"):
            self.failures.append(run.get("aborted") or "; ".join(run.get("errors", [])) or "?")
            return
        self.rates.append(float(run["received_per_s"]))
        if run.get("server_us_per_delivery") is not None:
            self.cpu_us.append(float(run["server_us_per_delivery"]))
        if run.get("server_memory_mib") is not None:
            self.memory_mib.append(float(run["server_memory_mib"]))


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


_PIP_WHEEL = (sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps")
_TREE_FILES = ("mpbroker", "setup.py", "pyproject.toml", "README.md", "LICENSE")


def _version(spec: str, parent: Path) -> Path:
    """The directory to put first on PYTHONPATH for `spec`: a git revision, or "." for
    this checkout as it is, either with "+compiled" to build its hot modules in place."""
    rev, _, flavour = spec.partition("+")
    if flavour not in ("", "compiled"):
        raise SystemExit(f"compare: unknown flavour {flavour!r} in {spec!r} (only +compiled)")
    target = parent / f"v{len(list(parent.iterdir()))}"
    target.mkdir()
    if rev == ".":
        for name in _TREE_FILES:
            source = REPO / name
            if source.is_dir():
                shutil.copytree(
                    source, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.so")
                )
            elif source.exists():
                shutil.copy2(source, target / name)
    else:
        listing = subprocess.run(
            ["git", "-C", str(REPO), "ls-tree", "--name-only", rev],
            capture_output=True,
            text=True,
        )
        if listing.returncode != 0:
            raise SystemExit(f"compare: {rev!r} is not a revision of this repository")
        names = listing.stdout.split()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", rev]
            + [n for n in _TREE_FILES if n in names],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    if flavour == "compiled":
        if not (target / "setup.py").exists():
            raise SystemExit(f"compare: {rev} has no setup.py: it cannot be compiled")
        # The wheel a user would install, unpacked: its compiled modules next to the pure
        # ones (and the group's shared library, mpbroker/_native__mypyc).
        wheels = target / "wheel"
        build = subprocess.run(
            [*_PIP_WHEEL, "--wheel-dir", str(wheels), str(target)],
            capture_output=True,
            text=True,
        )
        built = list(wheels.glob("*.whl"))
        if build.returncode != 0 or not built:
            raise SystemExit(f"compare: building {spec} failed:\n{build.stderr[-2000:]}")
        installed = target / "installed"
        with zipfile.ZipFile(built[0]) as wheel:
            wheel.extractall(installed)
        if not list(installed.glob("mpbroker/**/*.so")):
            raise SystemExit(f"compare: the wheel of {spec} has no compiled module")
        return installed
    return target


def _run(tree: Path, scenario: str, count: int | None) -> dict[str, Any]:
    """One bench run: a fresh broker of the version in `tree`, loaded by this checkout's
    load generator (the same load for every version)."""
    broker = BrokerProcess(admin=False, env=dict(os.environ, PYTHONPATH=str(tree)))
    try:
        broker.start()
    except ServerError as exc:
        return {"ok": False, "aborted": f"the broker did not start: {exc}"}
    try:
        command = [sys.executable, "-m", "mpbroker", "bench", "--json"]
        arguments, default_count = SCENARIOS[scenario]
        command += ["--port", str(broker.port), *arguments, "--count", str(count or default_count)]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        done = subprocess.run(command, env=env, capture_output=True, text=True)
    finally:
        broker.stop()
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            runs: list[dict[str, Any]] = json.loads(line).get("runs", [])
            if runs:
                run = runs[-1]
                if run.get("server_cpu_s") is not None and run.get("received"):
                    run["server_us_per_delivery"] = run["server_cpu_s"] / run["received"] * 1e6
                return run
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"ok": False, "aborted": f"exit {done.returncode}: {tail[0]}"}


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ratio(after: float | None, before: float | None) -> str:
    return "-" if after is None or not before else f"x{after / before:.2f}"


def table(results: dict[str, dict[str, Sample]], labels: tuple[str, str]) -> str:
    """The medians per scenario, before and after, with the after/before ratios."""
    before, after = labels
    lines = [
        "| scenario | version | received/s | server µs/delivery | server MiB | runs |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for scenario, by_version in results.items():
        for label in (before, after):
            sample = by_version[label]
            lines.append(
                f"| {scenario} | {label} | {_cell(_median(sample.rates), 0)}"
                f" | {_cell(_median(sample.cpu_us), 2)} | {_cell(_median(sample.memory_mib), 0)}"
                f" | {len(sample.rates)}{f' ({len(sample.failures)} failed)' if sample.failures else ''} |"
            )
        b, a = by_version[before], by_version[after]
        lines.append(
            f"| {scenario} | after/before | {_ratio(_median(a.rates), _median(b.rates))}"
            f" | {_ratio(_median(a.cpu_us), _median(b.cpu_us))}"
            f" | {_ratio(_median(a.memory_mib), _median(b.memory_mib))} | |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare",
        description="The issue's scenarios against two versions of the broker, in turns.",
    )
    parser.add_argument(
        "--before",
        required=True,
        help='git revision to compare against; "." is this checkout; "+compiled" after either'
        " builds its hot modules with mypyc first",
    )
    parser.add_argument(
        "--after", default=".", help='the same kinds of version (default: ".", this checkout)'
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs per scenario and version")
    parser.add_argument(
        "--scenario",
        default=",".join(SCENARIOS),
        help=f"comma-separated, of {', '.join(SCENARIOS)} (default: all)",
    )
    parser.add_argument(
        "--count", type=int, help="messages per run (default: 200,000 for queue, else 100,000)"
    )
    parser.add_argument("--json", action="store_true", help="every run's figures as JSON too")
    args = parser.parse_args(argv)
    scenarios = [s.strip() for s in args.scenario.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r}")
    if args.rounds < 1 or (args.count is not None and args.count < 1):
        parser.error("--rounds and --count must be at least 1")
    labels = (args.before, args.after)
    if labels[0] == labels[1]:
        parser.error("--before and --after name the same version")
    results = {s: {labels[0]: Sample(), labels[1]: Sample()} for s in scenarios}
    raw: list[dict[str, Any]] = []
    print(
        f"machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()},"
        f" Python {platform.python_version()}; load average before:"
        f" {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="mpbroker-compare-") as scratch:
        base = Path(scratch)
        (base / "trees").mkdir()
        # Every process runs from here: `python -m` puts its working directory first on
        # sys.path, where this checkout's mpbroker would shadow the version's.
        os.chdir(base)
        trees = {label: _version(label, base / "trees") for label in labels}
        for round_ in range(args.rounds):
            order = list(labels) if round_ % 2 == 0 else list(reversed(labels))
            for scenario in scenarios:
                for label in order:
                    run = _run(trees[label], scenario, args.count)
                    results[scenario][label].add(run)
                    raw.append({"round": round_, "version": label, "scenario": scenario, **run})
                    print(
                        f"round {round_ + 1} {scenario:10} {label:14}"
                        f" {run.get('received_per_s', '-')!s:>8}/s"
                        f" {_cell(run.get('server_us_per_delivery'), 2):>6} µs/delivery"
                        f" {run.get('server_memory_mib', '-')!s:>6} MiB"
                        + ("" if run.get("ok") else f"  FAILED: {run.get('aborted', '')}"),
                        flush=True,
                    )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(table(results, labels))
    if args.json:
        print(json.dumps(raw))
    ok = all(not sample.failures for by in results.values() for sample in by.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
