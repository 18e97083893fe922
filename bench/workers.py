"""Throughput of 1 against 2 p2p workers (``broker.p2p_workers``), the load spread over queues.

Run: .venv/bin/python -m bench.workers [--queues 4] [--count 50000] [--repeat 3] [--persistent]

``mpbroker bench`` drives one destination per run, so each run starts one broker
(``mpbroker serve --port 0 --admin-port -1`` with ``[broker] p2p_workers = K`` and
``gateways = 2``, a fresh temporary data directory) and then ``--queues`` concurrent
``mpbroker bench --port P --destination /queue/NAME --producers 1 --consumers 1 --count N
--size 100 --json`` processes against it, one per queue. The queue names are picked so that
they split evenly between two p2p workers (a queue belongs to worker
``crc32(NAME) % K``, mpbroker/routing.py); with K = 1 the same names all go to the one worker.

Per run it reports:

- msgs/s (sum): the sum of the benches' ``received_per_s``, each measured from its first
  SEND to its last delivery; it overstates the aggregate when the benches do not overlap
  (each takes a second or so to start its processes),
- msgs/s (span): messages delivered over the union of the benches' windows (a bench's window
  ends when it exits and is its ``elapsed_s`` long; the teardown before the exit is about
  the same for each, so the union's length holds); this one cannot overstate the overlap,
- (per run only) wall msgs/s: messages over the time from launching the benches to the last
  exit, start-up and teardown included,
- broker CPU µs/msg: user + system CPU seconds of the supervisor and every live descendant
  (psutil), read before and after the load, over the messages delivered,
- clients CPU µs/msg: the same for the bench processes and their producers and consumers
  (``RUSAGE_CHILDREN`` of this process across the load: the broker is still running then,
  so it is not in it).

K = 1 and K = 2 alternate, ``--repeat`` runs each; the table shows medians and the ratios
K=2/K=1 (above 1 for msgs/s and below 1 for CPU/msg favour two workers). ``--persistent``
adds a second scenario with persistent messages. The load average is printed before and
after every run: the machine is shared, and the load generator runs on the same cores as the
broker.

Exit status 0 when every bench checked out and every broker stopped cleanly with nothing
left in /dev/shm; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import psutil

from mpbroker.harness import BrokerProcess, ServerError

__all__ = [
    "BENCH",
    "RunResult",
    "broker_cpu_seconds",
    "machine_line",
    "main",
    "queue_names",
    "run_once",
    "start_broker",
    "stop_broker",
]

BENCH = [sys.executable, "-m", "mpbroker", "bench"]
STARTUP_TIMEOUT_S = 60.0
# Workers finish starting after the ready line; let them settle before measuring.
SETTLE_S = 1.0
# The default 256 MiB budget refuses two p2p workers with the default store watermarks; the
# same budget for both K (it sets the MemWatch levels too), far above what the runs use.
MAX_MEMORY = 512 * 2**20


def queue_names(count: int, workers: int = 2, prefix: str = "w") -> list[str]:
    """``count`` queue names (without ``/queue/``), as even as possible over ``workers``
    p2p workers: the first names whose ``crc32 % workers`` still has room."""
    quota = [count // workers + (1 if i < count % workers else 0) for i in range(workers)]
    names: list[str] = []
    n = 0
    while len(names) < count:
        name = f"{prefix}.{n:03d}"
        owner = zlib.crc32(name.encode()) % workers
        if quota[owner]:
            quota[owner] -= 1
            names.append(name)
        n += 1
    return names


def broker_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every live descendant."""
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def start_broker(p2p_workers: int) -> BrokerProcess:
    """``mpbroker serve`` with ``p2p_workers`` p2p workers and 2 gateways, on a free port,
    with a temporary data directory (the harness removes it when the broker stops)."""
    config = (
        f"[broker]\np2p_workers = {p2p_workers}\ngateways = 2\n"
        f"[memory]\nmax_memory = {MAX_MEMORY}\n"
    )
    return BrokerProcess(config=config, admin=False).start(STARTUP_TIMEOUT_S)


def stop_broker(broker: BrokerProcess) -> list[str]:
    """SIGTERM and wait; the problems found (exit status, /dev/shm leftovers)."""
    try:
        broker.stop_checked()
    except ServerError as exc:
        return [str(exc)]
    return []


@dataclass(frozen=True, slots=True)
class RunResult:
    workers: int
    persistent: bool
    received_per_s: float
    span_per_s: float
    wall_per_s: float
    delivered: int
    broker_cpu_s: float
    clients_cpu_s: float
    load_before: str
    load_after: str
    problems: tuple[str, ...]

    @property
    def broker_us_per_msg(self) -> float:
        return self.broker_cpu_s / self.delivered * 1e6 if self.delivered else float("nan")

    @property
    def clients_us_per_msg(self) -> float:
        return self.clients_cpu_s / self.delivered * 1e6 if self.delivered else float("nan")


def _bench_command(port: int, name: str, count: int, persistent: bool) -> list[str]:
    command = [
        *BENCH,
        "--port",
        str(port),
        "--destination",
        f"/queue/{name}",
        "--producers",
        "1",
        "--consumers",
        "1",
        "--count",
        str(count),
        "--size",
        "100",
        "--json",
    ]
    return [*command, "--persistent"] if persistent else command


def run_once(workers: int, names: list[str], count: int, persistent: bool) -> RunResult:
    """One broker with ``workers`` p2p workers, one concurrent bench per queue."""
    load_before = _loadavg()
    broker = start_broker(workers)
    problems: list[str] = []
    received_per_s = 0.0
    delivered = 0
    span_s = 0.0
    try:
        time.sleep(SETTLE_S)
        cpu_before = broker_cpu_seconds(broker.pid)
        clients_before = _children_cpu_seconds()
        started = time.monotonic()
        benches = [
            subprocess.Popen(
                _bench_command(broker.port, name, count, persistent),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in names
        ]
        outputs: list[tuple[str, str]] = [("", "")] * len(benches)
        exited = [0.0] * len(benches)

        def wait(i: int) -> None:
            outputs[i] = benches[i].communicate()
            exited[i] = time.monotonic()

        waiters = [threading.Thread(target=wait, args=(i,)) for i in range(len(benches))]
        for waiter in waiters:
            waiter.start()
        for waiter in waiters:
            waiter.join()
        wall_s = time.monotonic() - started
        cpu_after = broker_cpu_seconds(broker.pid)
        clients_cpu_s = _children_cpu_seconds() - clients_before
        windows: list[tuple[float, float]] = []
        for name, bench, (out, err), end in zip(names, benches, outputs, exited, strict=True):
            try:
                report = json.loads(out.strip().splitlines()[-1])
                run = report["runs"][0]
            except (IndexError, ValueError, KeyError):
                problems.append(f"{name}: no JSON (exit {bench.returncode}): {err.strip()}")
                continue
            if bench.returncode != 0 or not report.get("ok"):
                problems.append(f"{name}: not ok (exit {bench.returncode}): {run.get('errors')}")
            received_per_s += float(run["received_per_s"])
            delivered += int(run["received"])
            # The bench measured its first SEND to its last delivery, then tore down its
            # processes and exited; the teardown is about the same for each, so shifting
            # every window by it leaves their union's length as it was.
            windows.append((end - float(run["elapsed_s"]), end))
        if windows:
            span_s = max(e for _, e in windows) - min(b for b, _ in windows)
    finally:
        problems.extend(stop_broker(broker))
    return RunResult(
        workers=workers,
        persistent=persistent,
        received_per_s=received_per_s,
        span_per_s=delivered / span_s if span_s > 0 else 0.0,
        wall_per_s=delivered / wall_s if wall_s > 0 else 0.0,
        delivered=delivered,
        broker_cpu_s=cpu_after - cpu_before,
        clients_cpu_s=clients_cpu_s,
        load_before=load_before,
        load_after=_loadavg(),
        problems=tuple(problems),
    )


def machine_line() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0))
    ram = psutil.virtual_memory().total / 2**30
    return f"machine: {model}, {cores} usable cores, {ram:.1f} GiB RAM, Python {platform.python_version()}"


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _table(results: list[RunResult], queues: int, count: int) -> list[str]:
    rows = [
        "| scenario | p2p_workers | msgs/s (sum) | msgs/s (span) | broker CPU µs/msg "
        "| clients CPU µs/msg | runs (msgs/s) |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for persistent in sorted({r.persistent for r in results}):
        scenario = f"{queues} queues x 1->1, {count} x 100 B{', persistent' if persistent else ''}"
        medians: dict[int, tuple[float, float, float, float]] = {}
        for k in (1, 2):
            runs = [r for r in results if r.persistent == persistent and r.workers == k]
            if not runs:
                continue
            medians[k] = (
                _median([r.received_per_s for r in runs]),
                _median([r.span_per_s for r in runs]),
                _median([r.broker_us_per_msg for r in runs]),
                _median([r.clients_us_per_msg for r in runs]),
            )
            rate, span, broker, clients = medians[k]
            each = ", ".join(f"{r.received_per_s:,.0f}" for r in runs)
            rows.append(
                f"| {scenario} | {k} | {rate:,.0f} | {span:,.0f} | {broker:.1f} "
                f"| {clients:.1f} | {each} |"
            )
        if 1 in medians and 2 in medians:
            one, two = medians[1], medians[2]
            ratios = [b / a if a else float("nan") for a, b in zip(one, two, strict=True)]
            rows.append(
                f"| {scenario} | ratio 2/1 | x{ratios[0]:.2f} | x{ratios[1]:.2f} "
                f"| x{ratios[2]:.2f} | x{ratios[3]:.2f} | |"
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=4, help="concurrent queues (default 4)")
    parser.add_argument(
        "--count", type=int, default=50000, help="messages per producer (default 50000)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per K (default 3)")
    parser.add_argument(
        "--persistent", action="store_true", help="a second scenario with persistent messages"
    )
    args = parser.parse_args()
    if args.queues < 1 or args.count < 1 or args.repeat < 1:
        parser.error("--queues, --count and --repeat must be at least 1")
    names = queue_names(args.queues)
    owners = [zlib.crc32(n.encode()) % 2 for n in names]
    print(machine_line())
    print(
        f"queues: {', '.join(f'{n} (worker {o} of 2)' for n, o in zip(names, owners, strict=True))}"
    )
    print(f"load average at start: {_loadavg()}", flush=True)
    results: list[RunResult] = []
    scenarios = [False, True] if args.persistent else [False]
    for persistent in scenarios:
        for repeat in range(args.repeat):
            for k in (1, 2):
                result = run_once(k, names, args.count, persistent)
                results.append(result)
                print(
                    f"{'persistent' if persistent else 'non-persistent'} run {repeat + 1} K={k}: "
                    f"{result.received_per_s:,.0f} msgs/s (sum), {result.span_per_s:,.0f} (span), "
                    f"{result.wall_per_s:,.0f} (wall), "
                    f"broker {result.broker_us_per_msg:.1f} µs/msg, "
                    f"clients {result.clients_us_per_msg:.1f} µs/msg, "
                    f"{result.delivered} delivered; "
                    f"load {result.load_before} -> {result.load_after}",
                    flush=True,
                )
                for problem in result.problems:
                    print(f"  problem: {problem}", flush=True)
    print(f"load average at end: {_loadavg()}")
    print()
    print("\n".join(_table(results, args.queues, args.count)))
    failed = [p for r in results for p in r.problems]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
