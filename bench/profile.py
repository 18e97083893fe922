"""Where a broker's CPU goes, per process and per step, under a bench load (py-spy).

Run: .venv/bin/python -m bench.profile [--destination /queue/bench] [--consumers 1]
     [--count 400000] [--persistent] [--rate 250] [--top 8]

It starts a broker (``mpbroker serve --port 0``, two gateways, a temporary data dir),
samples every worker with ``py-spy record --format raw`` (py-spy reads the processes from
outside: no code change, no slowdown of the sampled process beyond the pauses of its
samples) while ``mpbroker bench --port P`` drives the load, then sorts each process's
samples by the step they were in: the innermost frame of ours (or of trio, sqlite3, the
standard library) names it. It prints, per process, the share of samples of each step and
the functions with the most samples of their own.

py-spy is not a dependency of the broker: ``.venv/bin/pip install py-spy``. It needs to be
allowed to read other processes (root, or ``kernel.yama.ptrace_scope = 0``).

Exit status 0 when the bench checked out and the profiles were read; 1 otherwise; 2 when
py-spy is missing.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mpbroker.harness import BrokerProcess

# A frame's step, by the file it is in (the first rule that matches, innermost frame first).
STEPS: tuple[tuple[str, str], ...] = (
    ("stomp/_parser", "parse frames"),
    ("stomp/_encoder", "encode frames"),
    ("session/_admission", "flow control"),
    ("flow/", "flow control"),
    ("session/", "session"),
    ("records.py", "ring records (msgpack)"),
    ("shm/_park", "waiting for work (parked)"),
    ("shm/_doorbell", "doorbells"),
    ("shm/_ring", "rings"),
    ("engine/", "engines"),
    ("selector/", "engines"),
    ("stores/", "stores (SQLite)"),
    ("sqlite3/", "stores (SQLite)"),
    ("sqlite_utils/", "stores (SQLite)"),
    ("pipeline/", "pipeline"),
    ("workers/gateway", "gateway shell"),
    ("workers/", "worker shells"),
    ("trio/", "sockets and event loop (trio)"),
    ("socket.py", "sockets and event loop (trio)"),
    ("selectors.py", "sockets and event loop (trio)"),
)
OTHER = "other"


def step_of(frame: str) -> str | None:
    """The step a py-spy frame (``function (path:line)``) belongs to, or None."""
    path = frame.rpartition("(")[2]
    for marker, step in STEPS:
        if marker in path:
            return step
    return None


@dataclass
class Profile:
    """One process's samples: by step (the innermost frame that names one) and by function
    (self time)."""

    title: str
    samples: int = 0
    steps: collections.Counter[str] = field(default_factory=collections.Counter)
    functions: collections.Counter[str] = field(default_factory=collections.Counter)

    def add(self, stack: list[str], count: int) -> None:
        self.samples += count
        step = next((s for f in reversed(stack) if (s := step_of(f)) is not None), OTHER)
        self.steps[step] += count
        leaf = stack[-1]
        name, _, where = leaf.partition(" (")
        self.functions[f"{name} ({where.split(':')[0]})"] += count


def read_raw(title: str, lines: Iterable[str]) -> Profile:
    """A py-spy ``--format raw`` file (collapsed stacks: ``frame;frame;... COUNT``)."""
    profile = Profile(title)
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if stack and count.isdigit():
            profile.add(stack.split(";"), int(count))
    return profile


def render(profiles: list[Profile], top: int) -> list[str]:
    """The steps as a table (a column per process, % of its samples), then each process's
    functions with the most samples of their own."""
    steps = sorted(
        {s for p in profiles for s in p.steps},
        key=lambda s: -sum(p.steps[s] / max(p.samples, 1) for p in profiles),
    )
    width = max(len(s) for s in steps) if steps else 10
    head = f"{'step':<{width}}" + "".join(f"  {p.title:>12}" for p in profiles)
    out = [head, "-" * len(head)]
    for step in steps:
        cells = "".join(f"  {100 * p.steps[step] / max(p.samples, 1):11.1f}%" for p in profiles)
        out.append(f"{step:<{width}}{cells}")
    out.append(f"{'samples':<{width}}" + "".join(f"  {p.samples:>12}" for p in profiles))
    for p in profiles:
        out.append("")
        out.append(f"{p.title}: the {top} functions with the most samples of their own")
        for name, count in p.functions.most_common(top):
            out.append(f"  {100 * count / max(p.samples, 1):5.1f}%  {name}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.profile", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--destination", default="/queue/bench")
    parser.add_argument("--consumers", type=int, default=1)
    parser.add_argument("--count", type=int, default=400_000)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--rate", type=int, default=250, help="samples per second (py-spy)")
    parser.add_argument("--top", type=int, default=8, help="functions listed per process")
    args = parser.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("bench.profile: py-spy not found: .venv/bin/pip install py-spy", file=sys.stderr)
        return 2
    with (
        tempfile.TemporaryDirectory(prefix="mpb-profile-") as tmp,
        BrokerProcess("--gateways", "2", data_dir=Path(tmp) / "data") as broker,
    ):
        spies: list[tuple[str, Path, subprocess.Popen[bytes]]] = []
        for title, worker in sorted(broker.workers().items()):
            output = Path(tmp) / f"{title.replace(' ', '-')}.txt"
            command = [spy, "record", "--pid", str(worker.pid), "--rate", str(args.rate)]
            command += ["--format", "raw", "--output", str(output), "--nonblocking"]
            spies.append((title, output, subprocess.Popen(command, stdout=subprocess.DEVNULL)))
        bench = [sys.executable, "-m", "mpbroker", "bench", "--port", str(broker.port)]
        bench += ["--destination", args.destination, "--consumers", str(args.consumers)]
        bench += ["--count", str(args.count), "--json"]
        if args.persistent:
            bench.append("--persistent")
        done = subprocess.run(bench, capture_output=True, text=True, timeout=600)
        for _, _, spying in spies:
            spying.send_signal(signal.SIGINT)  # py-spy writes its file and exits
        for _, _, spying in spies:
            spying.wait(30)
        profiles = [
            read_raw(title, output.read_text().splitlines())
            for title, output, _ in spies
            if output.exists()
        ]
    if done.returncode != 0:
        print(done.stdout + done.stderr, file=sys.stderr)
        return 1
    result = json.loads(done.stdout)
    run = result["runs"][-1] if "runs" in result else result
    print(f"bench: {' '.join(bench[2:])}")
    print(f"received/s: {run.get('received_per_s', '?')}")
    print()
    for line in render([p for p in profiles if p.samples], args.top):
        print(line)
    return 0 if profiles else 1


if __name__ == "__main__":
    sys.exit(main())
