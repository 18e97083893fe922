"""Memory soak: producers flooding queues and topics, consumers at 10 %, default config.

Run: .venv/bin/python -m bench.memsoak [--minutes 10] [--producers 10] [--queues 10]
     [--topics 10] [--size 1000] [--consumer-speed 0.1] [--consumers 2] [--json]

Starts a broker with the default configuration (``memory.max_memory`` 256 MiB, no watermark
changed) on free loopback ports, its admin API included, with a temporary data directory.
Every producer process sends non-persistent messages round robin to ``/queue/memsoak-N`` and
``/topic/memsoak-N``, with a receipt on every SEND and a bounded window; a refused SEND (ERROR)
is counted and the producer reconnects. The consumer processes (``--consumers``, each with a
share of the destinations: one subscription per queue and one subscriber per topic, all
subscribed before the first SEND) drain at full speed during calibration, then acknowledge at
``--consumer-speed`` of the rate the producers reached. This is :mod:`bench.soak` with more
destinations and the broker's default limits: producers, consumers, the PSS sampler and the
reconciliation are the same.

Every second it records the summed PSS of all broker processes and, from ``GET /status``, the
MemWatch level and the p2p workers' temp store (paging, messages, bytes, disk usage, full);
it reads the broker's log for flow stops, paging and memory-level lines. At the end the
producers stop, the consumers drain at full speed and every message is reconciled: each
accepted queue message received exactly once, each accepted topic message exactly once by its
topic's subscriber.

Exit status 0 when nothing was lost or duplicated, no process failed and the summed PSS never
went above ``max_memory``; 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from mpbroker.config import Config
from mpbroker.harness import BrokerProcess
from mpbroker.loadgen.control import describe
from mpbroker.loadgen.wire import BODY_HEADER_BYTES

from .soak import (
    BrokerLog,
    MemorySampler,
    Options,
    Phases,
    SoakRun,
    mib,
    parse_soak_args,
    producer_lines,
    run_and_report,
)

__all__ = ["destinations", "format_summary", "main"]

#: The first minute of production, whose accepted rate the rate while paging is compared to.
FIRST_MINUTE_S = 60.0

_POLL_S = 1.0
_POLL_TIMEOUT_S = 2.0
_PAGING_START = "paging non-persistent messages to the temp store"
_PAGING_STOP = "paging stopped:"
_MEMORY_LEVEL = re.compile(r"memory level (\d+): ")
_MEMORY_BACK = "memory back to level 0"


def destinations(queues: int, topics: int) -> tuple[str, ...]:
    """The soak's destinations: queues first, then topics."""
    return tuple(
        [f"/queue/memsoak-{i}" for i in range(queues)]
        + [f"/topic/memsoak-{i}" for i in range(topics)]
    )


def consumer_groups(n_destinations: int, consumers: int) -> tuple[tuple[int, ...], ...]:
    """Destination ``i`` to consumer ``i % consumers``: queues and topics spread alike."""
    consumers = min(consumers, n_destinations)
    return tuple(tuple(range(c, n_destinations, consumers)) for c in range(consumers))


class _MemSoakLog(BrokerLog):
    """The soak's log counts, plus paging and memory levels."""

    def __init__(self) -> None:
        super().__init__()
        self.paging_starts = 0
        self.paging_stops = 0
        self.memory_warnings = 0
        self.max_logged_level = 0
        self.back_to_level_0 = 0

    def feed_more(self, line: str, now: float) -> bool:
        if _PAGING_START in line:
            self.paging_starts += 1
        elif _PAGING_STOP in line:
            self.paging_stops += 1
        elif match := _MEMORY_LEVEL.search(line):
            self.memory_warnings += 1
            self.max_logged_level = max(self.max_logged_level, int(match.group(1)))
        elif _MEMORY_BACK in line:
            self.back_to_level_0 += 1
        else:
            return False
        return True


@dataclass(frozen=True, slots=True)
class _TempStore:
    """The temp stores of all p2p workers together."""

    paging: bool
    messages: int
    bytes: int
    usage_bytes: int
    full: bool


@dataclass(frozen=True, slots=True)
class _StatusSample:
    """One reading of the admin API (None: not published), with the producers' progress."""

    at: float
    #: Messages accepted so far, over all producers.
    accepted: int
    level: int | None
    percent: float | None
    used_bytes: int | None
    max_memory: int | None
    temp_store: _TempStore | None


def _temp_store(status: dict[str, Any]) -> _TempStore | None:
    stores = [
        w["stats"]["temp_store"]
        for w in status.get("workers", [])
        if isinstance(w.get("stats"), dict) and isinstance(w["stats"].get("temp_store"), dict)
    ]
    if not stores:
        return None  # not published (yet): a broker without flow-to-disk
    return _TempStore(
        paging=any(s.get("paging") for s in stores),
        messages=sum(int(s.get("messages", 0)) for s in stores),
        bytes=sum(int(s.get("bytes", 0)) for s in stores),
        usage_bytes=sum(int(s.get("usage_bytes", 0)) for s in stores),
        full=any(s.get("full") for s in stores),
    )


def _reading(at: float, accepted: int, status: dict[str, Any] | None) -> _StatusSample:
    memory = status.get("memory") if status else None
    if not isinstance(memory, dict):
        memory = {}
    return _StatusSample(
        at=at,
        accepted=accepted,
        level=memory.get("level"),
        percent=memory.get("percent"),
        used_bytes=memory.get("used_bytes"),
        max_memory=memory.get("max_memory"),
        temp_store=_temp_store(status) if status else None,
    )


class _StatusPoller(threading.Thread):
    """Every second: the admin API's ``/status`` and the producers' accepted count."""

    def __init__(self, url: str | None, soak: SoakRun) -> None:
        super().__init__(name="memsoak-status", daemon=True)
        self.url = url
        self.soak = soak
        self.finish = threading.Event()
        self.lock = threading.Lock()
        self.samples: list[_StatusSample] = []
        self.errors = 0
        self.first_error = ""

    def poll(self) -> dict[str, Any] | None:
        if self.url is None:
            return None
        try:
            with urllib.request.urlopen(self.url + "/status", timeout=_POLL_TIMEOUT_S) as reply:
                data = json.loads(reply.read())
        except (OSError, urllib.error.URLError, ValueError) as exc:
            self.errors += 1
            if not self.first_error:
                self.first_error = describe(exc)
            return None
        return data if isinstance(data, dict) else None

    def run(self) -> None:
        while not self.finish.is_set():
            status = self.poll()
            # The count after the request: a slow answer must not shift throughput earlier.
            sample = _reading(time.monotonic(), self.soak.accepted(), status)
            with self.lock:
                self.samples.append(sample)
            self.finish.wait(_POLL_S)

    def latest(self) -> _StatusSample | None:
        with self.lock:
            return self.samples[-1] if self.samples else None

    def between(self, start: float, end: float) -> list[_StatusSample]:
        with self.lock:
            return [s for s in self.samples if start <= s.at <= end]


def _rate(count: int, seconds: float) -> int | None:
    return round(count / seconds) if seconds > 0 else None


class _MemSoakRun(SoakRun):
    name = "memsoak"

    def __init__(self, options: Options, minutes: float, calibrate_s: float, share: float) -> None:
        self.log_: _MemSoakLog = _MemSoakLog()
        super().__init__(options, minutes, calibrate_s, consumer_share=share, log=self.log_)
        defaults = Config()
        self.max_memory = defaults.memory.max_memory
        self.throttle_level = defaults.memory.throttle_level
        self.poller: _StatusPoller | None = None
        self.admin_url: str | None = None

    def start_broker(self) -> BrokerProcess:
        # The default configuration, a temporary data dir, the admin API on a free port.
        server = BrokerProcess(on_line=self.log.feed).start()
        self.admin_url = server.admin_url
        if self.admin_url is None:
            self.say("the broker did not log its admin API address: no MemWatch figures")
        return server

    def on_started(self, server: BrokerProcess, started: float) -> None:
        self.poller = _StatusPoller(self.admin_url, self)
        self.poller.start()

    def close(self) -> None:
        if self.poller is not None:
            self.poller.finish.set()
            self.poller.join(_POLL_TIMEOUT_S + 1)

    def _paging(self, sample: _StatusSample) -> bool:
        """Paging to the temp store, or at MemWatch's throttle level."""
        throttled = (
            self.throttle_level > 0
            and sample.level is not None
            and sample.level >= self.throttle_level
        )
        return throttled or (sample.temp_store is not None and sample.temp_store.paging)

    def progress_line(self, elapsed: float, sampler: MemorySampler) -> str:
        line = super().progress_line(elapsed, sampler)
        sample = self.poller.latest() if self.poller is not None else None
        if sample is None or sample.level is None:
            return line + "; no MemWatch figures"
        line += f"; MemWatch level {sample.level} ({sample.percent} %)"
        temp = sample.temp_store
        if temp is not None:
            line += (
                f", {'paging' if temp.paging else 'not paging'}: {temp.messages:,} messages"
                f" in the temp store ({mib(temp.usage_bytes):.1f} MiB on disk)"
            )
        return line

    def summarize(self, phases: Phases, sampler: MemorySampler) -> dict[str, Any]:
        options = self.options
        poller = self.poller
        samples = poller.between(phases.started, phases.drain[1]) if poller is not None else []
        published = [s for s in samples if s.level is not None]
        max_memory = next(
            (s.max_memory for s in published if s.max_memory is not None), self.max_memory
        )
        with sampler.lock:
            above = [(t, v) for t, v in sampler.samples if v > max_memory]
        messages = self.message_summary()
        by_kind = {kind: r.as_dict() for kind, r in self.reconciliation().items()}
        counts = phases.soak_counts
        soak_s = phases.soak[1] - phases.soak[0]

        # Time at each level and paging, from consecutive readings (each holds until the next).
        level_s: collections.defaultdict[int, float] = collections.defaultdict(float)
        paging_s = throttled_s = full_s = 0.0
        for before, after in itertools.pairwise(published):
            dt = after.at - before.at
            assert before.level is not None
            level_s[before.level] += dt
            if self.throttle_level and before.level >= self.throttle_level:
                throttled_s += dt
            if before.temp_store is not None:
                paging_s += dt if before.temp_store.paging else 0.0
                full_s += dt if before.temp_store.full else 0.0
        temp = [s.temp_store for s in published if s.temp_store is not None]

        # Throughput: the first minute of production against the soak's seconds spent
        # paging or throttled (and the rest).
        first_end = min(phases.started + FIRST_MINUTE_S, phases.soak[1])
        in_first = [s for s in samples if s.at <= first_end]
        first_minute = (
            _rate(in_first[-1].accepted, in_first[-1].at - phases.started) if in_first else None
        )
        soak = [s for s in published if s.at <= phases.soak[1]]
        paging_count = paging_time = other_count = other_time = 0.0
        for before, after in itertools.pairwise(soak):
            if self._paging(before):
                paging_count += after.accepted - before.accepted
                paging_time += after.at - before.at
            else:
                other_count += after.accepted - before.accepted
                other_time += after.at - before.at
        paging_rate = _rate(int(paging_count), paging_time)

        summary: dict[str, Any] = {
            "command": {
                "minutes": self.minutes,
                "producers": options.producers,
                "queues": sum(1 for d in options.destinations if d.startswith("/queue/")),
                "topics": sum(1 for d in options.destinations if d.startswith("/topic/")),
                "consumers": options.consumers,
                "size": options.size,
                "consumer_speed": self.consumer_share,
                "calibrate_seconds": self.calibrate_s,
            },
            "max_memory_mib": round(mib(max_memory), 1),
            **self.phase_summary(phases),
            "soak_accepted_rate": round(counts["accepted"] / soak_s),
            "soak_refused": counts["refused"],
            "soak_consumer_rate": round(counts["received"] / soak_s),
            "throughput": {
                "first_minute_s": round(first_end - phases.started, 1),
                "first_minute_rate": first_minute,
                "paging_or_throttled_s": round(paging_time, 1),
                "paging_or_throttled_rate": paging_rate,
                "otherwise_s": round(other_time, 1),
                "otherwise_rate": _rate(int(other_count), other_time),
                "ratio": round(paging_rate / first_minute, 3)
                if paging_rate is not None and first_minute
                else None,
            },
            **messages,
            "by_kind": by_kind,
            **self.memory_summary(phases, sampler),
            "above_max_memory": bool(above),
            "samples_above_max_memory": len(above),
            "first_above_at_s": round(above[0][0] - phases.started, 1) if above else None,
            "memwatch": {
                "published": bool(published),
                "max_level": max((s.level for s in published if s.level is not None), default=None),
                "seconds_by_level": {str(k): round(v, 1) for k, v in sorted(level_s.items())},
                "throttle_level": self.throttle_level,
                "throttled_s": round(throttled_s, 1),
                "peak_used_mib": round(
                    mib(max((s.used_bytes or 0 for s in published), default=0)), 1
                ),
                "peak_percent": max((s.percent or 0.0 for s in published), default=None),
                "warnings_logged": self.log_.memory_warnings,
                "max_logged_level": self.log_.max_logged_level,
                "back_to_level_0_logged": self.log_.back_to_level_0,
            },
            "temp_store": {
                "published": bool(temp),
                "paging_s": round(paging_s, 1),
                "paging_starts_logged": self.log_.paging_starts,
                "paging_stops_logged": self.log_.paging_stops,
                "peak_usage_mib": round(mib(max((t.usage_bytes for t in temp), default=0)), 1),
                "peak_messages": max((t.messages for t in temp), default=0),
                "peak_bytes_mib": round(mib(max((t.bytes for t in temp), default=0)), 1),
                "full_s": round(full_s, 1),
            },
            "status_polls": len(samples),
            "status_errors": poller.errors if poller is not None else 0,
            "first_status_error": poller.first_error if poller is not None else "",
            **self.log.summary(),
        }
        summary["within_max_memory"] = not above
        summary["ok"] = messages["lossless"] and not above and not self.failures
        return summary


def _mib_or_dash(value: Any) -> str:
    return "-" if value is None else f"{value:,}"


def format_summary(s: dict[str, Any]) -> str:
    """The summary as text."""
    c = s["command"]
    t = s["throughput"]
    m = s["memwatch"]
    p = s["temp_store"]
    limit = s["max_memory_mib"]
    lines = [
        f"memory soak: {c['producers']} producers, {c['size']}-byte non-persistent messages"
        f" round robin to {c['queues']} queues and {c['topics']} topics; {c['consumers']}"
        f" consumer processes at {100 * c['consumer_speed']:g} % of the calibrated rate;"
        f" default config (max_memory {limit:g} MiB)",
        f"duration: {s['duration_s']:g} s (soak {s['soak_s']:g} s, drain {s['drain_s']:g} s)",
        f"producers: {s['calibrated_rate']:,} msgs/s accepted at full speed (calibration);"
        f" during the soak {s['soak_accepted_rate']:,}/s accepted, {s['soak_refused']:,}"
        " refused",
        f"throughput: first {t['first_minute_s']:g} s {_mib_or_dash(t['first_minute_rate'])}"
        f" msgs/s accepted; while paging or throttled {_mib_or_dash(t['paging_or_throttled_rate'])}"
        f"/s over {t['paging_or_throttled_s']:g} s"
        + (f" (x{t['ratio']:.2f})" if t["ratio"] is not None else "")
        + f"; otherwise {_mib_or_dash(t['otherwise_rate'])}/s over {t['otherwise_s']:g} s",
        f"consumers: {s['consumer_target_rate']:,} msgs/s target, {s['soak_consumer_rate']:,}/s"
        f" during the soak; drained the last {s['drained']:,} at {s['drain_rate']:,}/s",
        f"messages: sent {s['sent']:,} = accepted {s['accepted']:,} + refused {s['refused']:,}"
        f" + dropped behind a refusal {s['dropped']:,} + unknown {s['unknown']:,};"
        f" received {s['received']:,}",
    ]
    for kind, r in s["by_kind"].items():
        lines.append(
            f"  {kind}s: accepted {r['accepted']:,}, refused {r['refused']:,}, dropped"
            f" {r['dropped']:,}; lost {r['lost']:,}, duplicates {r['duplicates']:,}, delivered"
            f" without being accepted {r['delivered_not_accepted']:,}"
        )
    lines += [
        f"  redelivered {s['redelivered']:,}, on the wrong subscription {s['misrouted']:,},"
        f" foreign {s['foreign']:,}",
        f"broker memory ({s['memory_kind']}, {s['broker_processes']} processes): idle"
        f" {s['idle_mib']} MiB, peak {s['peak_mib']} MiB at {s['peak_at_s']:g} s"
        + (
            f" ABOVE max_memory {limit:g} MiB in {s['samples_above_max_memory']} samples"
            f" (first at {s['first_above_at_s']:g} s)"
            if s["above_max_memory"]
            else f" (within max_memory {limit:g} MiB)"
        )
        + f"; at the soak's end {s['soak_end_mib']} MiB, after the drain"
        f" {s['after_drain_mib']} MiB; peak of the summed RSS {s['peak_rss_sum_mib']} MiB",
        "  at the peak: "
        + ", ".join(f"{role} {size}" for role, size in s["peak_parts_mib"].items()),
    ]
    if m["published"]:
        lines.append(
            f"MemWatch: max level {m['max_level']} (seconds by level {m['seconds_by_level']});"
            f" at throttle level {m['throttle_level']} or above {m['throttled_s']:g} s; its own"
            f" measure (USS + shared memory) peaked at {m['peak_used_mib']} MiB"
            f" ({m['peak_percent']} %); {m['warnings_logged']} level warnings logged"
        )
    else:
        lines.append(
            f"MemWatch: no figures from the admin API ({s['status_errors']} failed polls"
            f"{': ' + s['first_status_error'] if s['first_status_error'] else ''})"
        )
    if p["published"]:
        lines.append(
            f"paging: {p['paging_s']:g} s paging ({p['paging_starts_logged']} starts,"
            f" {p['paging_stops_logged']} stops logged); temp store peak {p['peak_usage_mib']}"
            f" MiB on disk, {p['peak_messages']:,} messages ({p['peak_bytes_mib']} MiB) paged"
            f" out at most; full for {p['full_s']:g} s"
        )
    else:
        lines.append(
            f"paging: the p2p workers publish no temp store figures"
            f" ({p['paging_starts_logged']} paging starts logged)"
        )
    lines += [
        f"flow control: {s['flow_stops']} stops, {s['flow_starts']} starts; longest stop"
        f" {s['longest_flow_stop_s']:g} s",
    ]
    lines += producer_lines(s)
    if s["ok"]:
        lines.append("ok: nothing lost, never above max_memory")
    else:
        why = [] if s["lossless"] else ["messages lost, duplicated or unaccounted for"]
        why += [f"above max_memory {limit:g} MiB"] if s["above_max_memory"] else []
        why += ["a process failed"] if s["failures"] else []
        lines.append(f"FAILED: {'; '.join(why)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.memsoak",
        description="Memory soak: producers flooding queues and topics, consumers at 10 %% of"
        " their rate, default config; reports the broker's summed PSS against max_memory,"
        " MemWatch levels, paging, throughput and that nothing was lost.",
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="soak length (default 10)")
    parser.add_argument("--producers", type=int, default=10, help="producer processes (default 10)")
    parser.add_argument("--queues", type=int, default=10, help="queues (default 10)")
    parser.add_argument("--topics", type=int, default=10, help="topics (default 10)")
    parser.add_argument("--size", type=int, default=1000, help="body bytes (default 1000)")
    parser.add_argument(
        "--consumer-speed",
        type=float,
        default=0.1,
        help="the consumers' share of the calibrated rate (default 0.1)",
    )
    parser.add_argument(
        "--consumers",
        type=int,
        default=2,
        help="consumer processes, each subscribed to a share of the destinations (default 2)",
    )
    args = parse_soak_args(parser, argv)
    if args.queues < 0 or args.topics < 0 or args.queues + args.topics < 1:
        parser.error("--queues and --topics must not be negative, and not both 0")
    if args.consumers < 1:
        parser.error("--consumers must be at least 1")
    if not 0 < args.consumer_speed <= 1:
        parser.error("--consumer-speed must be above 0 and at most 1")
    if args.size < BODY_HEADER_BYTES:
        parser.error(f"--size must be at least {BODY_HEADER_BYTES}")
    names = destinations(args.queues, args.topics)
    options = Options(
        destinations=names,
        consumer_groups=consumer_groups(len(names), args.consumers),
        size=args.size,
        persistent=False,
        producers=args.producers,
        send_timeout_ms=Config().flow.send_timeout_ms,
    )
    run = _MemSoakRun(options, args.minutes, args.calibrate_seconds, args.consumer_speed)
    return run_and_report(run, format_summary if not args.json else None)


if __name__ == "__main__":
    raise SystemExit(main())
