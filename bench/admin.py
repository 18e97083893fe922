"""The admin API with many destinations: what `GET /flow`, `GET /status` and `GET /metrics`
cost, and what publishing the snapshots costs the pipelines.

Run: .venv/bin/python -m bench.admin [--destinations 10000] [--requests 5]
         [--metrics-max-destinations N] [--dashboard SCREENSHOT.png]

Starts a broker (one gateway), puts one message in each of `destinations` queues and a
subscriber on each of as many topics, waits until `GET /flow` lists every one, then
times `GET /flow`, `GET /flow?limit=100`, `GET /status`, `GET /metrics` (with
`admin.metrics_max_destinations` as given, default the broker's; also the samples of a
scrape) and what the dashboard polls (`GET /flow?sort=backlog&order=desc&offset=0&limit=50`,
the same with a filter, and `GET /status?limit=0`): median of `requests`, and the bytes of
each. `--dashboard` also opens the dashboard in a headless Chromium (tests/browser.py: from
a checkout, with the test extras), times its first rows and its requests, and saves a
screenshot. For the p2p and pubsub worker it reports what their last snapshot took to
build and publish (`publish_ms`), how often they publish at that cost, and their CPU time
over 10 s with nothing else going on: all of it is the admin snapshots.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request
from typing import Any

from mpbroker.admin import stats_period_ms
from mpbroker.harness import BrokerProcess, RawClient
from mpbroker.stomp import Frame, encode_frame

_BATCH = 1000
# An admin.stats_interval_ms this long: only the idle workers' CPU, without snapshots.
_BASELINE_MS = 60_000


def _get(broker: BrokerProcess, path: str) -> tuple[float, bytes]:
    """Seconds and bytes of one request."""
    started = time.perf_counter()
    with urllib.request.urlopen(f"{broker.admin_url}{path}", timeout=120) as reply:
        data: bytes = reply.read()
    return time.perf_counter() - started, data


def _fill(broker: BrokerProcess, count: int) -> tuple[RawClient, RawClient]:
    """A message in each of `count` queues, a subscriber on each of `count` topics."""
    producer = RawClient(broker.host, broker.port, timeout=120)
    producer.connect()
    subscriber = RawClient(broker.host, broker.port, timeout=120)
    subscriber.connect()
    for start in range(0, count, _BATCH):
        numbers = range(start, min(start + _BATCH, count))
        producer.send_bytes(
            b"".join(
                encode_frame(Frame("SEND", {"destination": f"/queue/bench.{n:05d}"}, b"x" * 100))
                for n in numbers
            )
        )
        subscriber.send_bytes(
            b"".join(
                encode_frame(
                    Frame("SUBSCRIBE", {"destination": f"/topic/bench.{n:05d}", "id": str(n)})
                )
                for n in numbers
            )
        )
        producer.send("SEND", {"destination": "/queue/bench.00000", "receipt": str(start)})
        producer.expect("RECEIPT", str(start))
        subscriber.send("SUBSCRIBE", {"destination": "/topic/x", "id": "x", "receipt": "s"})
        subscriber.expect("RECEIPT", "s")
        subscriber.send("UNSUBSCRIBE", {"id": "x"})
    return producer, subscriber


def _wait_listed(broker: BrokerProcess, expected: int) -> float:
    """Seconds until `GET /flow` lists `expected` destinations."""
    started = time.monotonic()
    while True:
        _, data = _get(broker, "/flow?limit=0")
        flow = json.loads(data)
        if flow["destinations_not_shown"] >= expected:
            return time.monotonic() - started
        if time.monotonic() - started > 120:
            raise TimeoutError(f"/flow shows {flow['destinations_not_shown']} of {expected}")
        time.sleep(0.2)


def _samples(text: bytes) -> int:
    """The samples in a Prometheus text exposition (its lines that are not comments)."""
    return sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))


def _pipelines(broker: BrokerProcess) -> dict[str, dict[str, Any]]:
    _, data = _get(broker, "/status")
    return {
        w["title"]: w["stats"]
        for w in json.loads(data)["workers"]
        if w["role"] in ("p2p", "pubsub") and w["stats"]
    }


_FIRST_ROWS_JS = "return document.querySelectorAll('#destinations tbody tr td.name').length"
# What the page's own requests took (Resource Timing), the newest of each kind.
_REQUESTS_JS = """
const last = {};
for (const e of performance.getEntriesByType('resource')) {
  const kind = new URL(e.name).pathname;
  if (kind === '/flow' || kind === '/status') last[kind] = [e.duration, e.transferSize];
}
return last;
"""


def _dashboard(broker: BrokerProcess, screenshot: str) -> None:
    """The dashboard with every destination: time to its first rows, its requests, and a
    screenshot."""
    from tests.browser import chromium, console_errors  # a checkout's test helper

    with chromium(height=1300) as driver:
        started = time.perf_counter()
        driver.get(f"{broker.admin_url}/")
        while not driver.execute_script(_FIRST_ROWS_JS):
            if time.perf_counter() - started > 60:
                raise TimeoutError("the dashboard showed no destination in 60 s")
            time.sleep(0.05)
        print(f"dashboard: first rows {(time.perf_counter() - started) * 1000:.0f} ms after load")
        time.sleep(7)  # two refreshes more: the chart and the steady state
        for path, (duration, size) in sorted(driver.execute_script(_REQUESTS_JS).items()):
            print(f"dashboard: its last {path} took {duration:.0f} ms, {size / 1024:.1f} KiB")
        errors = console_errors(driver)
        print(f"dashboard: {len(errors)} console errors{': ' if errors else ''}{errors or ''}")
        driver.save_screenshot(screenshot)
        print(f"dashboard: screenshot {screenshot}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--destinations", type=int, default=10000)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument(
        "--dashboard",
        metavar="PNG",
        help="open the dashboard in a headless Chromium, time it, save a screenshot here",
    )
    parser.add_argument(
        "--stats-interval-ms",
        type=int,
        default=500,
        help=f"admin.stats_interval_ms; from {_BASELINE_MS} on, only the idle workers' CPU "
        "is measured: the baseline without snapshots",
    )
    parser.add_argument(
        "--metrics-max-destinations",
        type=int,
        default=None,
        help="admin.metrics_max_destinations (default: the broker's)",
    )
    args = parser.parse_args()
    count = args.destinations
    interval = args.stats_interval_ms
    config = f"[admin]\nstats_interval_ms = {interval}\n"
    if args.metrics_max_destinations is not None:
        config += f"metrics_max_destinations = {args.metrics_max_destinations}\n"
    with BrokerProcess("--gateways", "1", config=config) as broker:
        started = time.monotonic()
        clients = _fill(broker, count)
        print(f"{count} queues and {count} topics filled in {time.monotonic() - started:.1f} s")
        if interval < _BASELINE_MS:
            waited = _wait_listed(broker, 2 * count)
            print(f"/flow listed all {2 * count} destinations {waited:.1f} s later")
            for path in (
                "/flow",
                "/flow?limit=100",
                "/status",
                "/metrics",
                "/flow?sort=backlog&order=desc&offset=0&limit=50",
                "/flow?sort=backlog&order=desc&offset=0&limit=50&filter=bench.0999",
                "/status?limit=0",
            ):
                runs = [_get(broker, path) for _ in range(args.requests)]
                seconds = statistics.median(t for t, _ in runs)
                size = len(runs[-1][1])
                samples = f", {_samples(runs[-1][1])} samples" if path == "/metrics" else ""
                print(
                    f"GET {path}: {seconds * 1000:.0f} ms, {size / 2**20:.2f} MiB ({size} B)"
                    + samples
                )
            if args.dashboard:
                _dashboard(broker, args.dashboard)
            time.sleep(2)  # publish_ms is the previous snapshot's: let one more come
            for title, stats in _pipelines(broker).items():
                cost = stats.get("publish_ms", 0.0)
                period = stats_period_ms(interval, cost)
                print(f"{title}: a snapshot costs {cost:.1f} ms, published every {period} ms")
        else:
            time.sleep(2)  # the engines settle; no snapshot comes
        workers = broker.workers()
        before = {t: workers[t].cpu_times() for t in ("p2p 0", "pubsub 0")}
        time.sleep(10)
        for title, times in before.items():
            after = workers[title].cpu_times()
            used = (after.user + after.system) - (times.user + times.system)
            print(f"{title}: {used * 100 / 10:.1f} % of a core while idle (10 s)")
        for client in clients:
            client.close()


if __name__ == "__main__":
    main()
