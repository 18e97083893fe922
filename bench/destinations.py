"""What destinations cost the broker in memory, and whether their number stays bounded.

``python -m bench.destinations [--queues 10000] [--topics 10000] [--max-memory 256MiB]
[--body 10] [--gateways 1] [--config FILE] [--give-up-after N] [--reference] [--json]``
starts a broker on free loopback ports with a temporary data directory
(:class:`mpbroker.harness.BrokerProcess`), warms it up, then:

0. with ``--reference``, sends as many messages to one queue and makes as many
   subscriptions to one topic: what the messages and subscriptions cost without
   destinations of their own;
1. sends one non-persistent message of ``--body`` bytes to each of ``--queues`` new queues
   (``/queue/dest-N``), each with a receipt, pipelined in batches;
2. subscribes to each of ``--topics`` new topics (``/topic/dest-N``), held by connections of
   1000 subscriptions each.

A refusal is an ERROR frame, which closes its connection: once one comes, every later
destination is tried alone, on a connection of its own (a topic: and, once its receipt came,
subscribed to again on a holder connection, so nothing held is lost when a later one is
refused). ``--give-up-after N`` stops a step after N refusals in a row (0: never).

After each step it asks ``GET /status`` (so the admin thread's share is counted), then
reports the PSS of every broker process (psutil ``memory_full_info``: the supervisor and
all its descendants) and the size of its /dev/shm entries (which MemWatch counts whole: the
stats spill files grow with the destinations), what each grew by and by how much per
destination made; the highest total PSS seen while it ran (sampled every 0.5 s); what
MemWatch and the pipelines published in ``GET /status``; and the ERRORs' texts (one line
per kind, the destination left out). Then it stops the broker with SIGTERM and checks that
nothing is left. Exit status 0 when it measured and left nothing behind, else 1 (refusals
are results, not failures).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench.unitcost import connect, pss_by_process
from mpbroker.harness import (
    BrokerClosed,
    BrokerProcess,
    FrameTimeout,
    RawClient,
    ServerError,
    StompError,
)
from mpbroker.loadgen.control import describe
from mpbroker.shm import SHM_DIR

__all__ = ["main", "measure"]

_TIMEOUT_S = 60.0
_BATCH = 500
_HOLDER_SUBSCRIPTIONS = 1000
_WARMUP = 20


def _say(text: str) -> None:
    print(f"destinations: {text}", file=sys.stderr, flush=True)


class _Peak(threading.Thread):
    """The highest summed PSS of the broker's processes, sampled every 0.5 s."""

    def __init__(self, server: BrokerProcess) -> None:
        super().__init__(name="pss-peak", daemon=True)
        self.server = server
        self.peak = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            total = 0
            with contextlib.suppress(psutil.Error, ServerError):
                for process in self.server.processes():
                    with contextlib.suppress(psutil.Error):
                        total += int(process.memory_full_info().pss)
            self.peak = max(self.peak, total)


class _Tally:
    """What one step made of its destinations."""

    def __init__(self) -> None:
        self.created = 0
        self.refused = 0
        self.errors: dict[str, int] = {}
        self.in_a_row = 0
        self.first_refused: str | None = None

    def refusal(self, frame_message: str, destination: str) -> None:
        self.refused += 1
        self.in_a_row += 1
        # One line per kind of ERROR: the destination it names is left out.
        key = frame_message.replace(destination, "<destination>")
        self.errors[key] = self.errors.get(key, 0) + 1
        if self.first_refused is None:
            self.first_refused = destination

    def success(self) -> None:
        self.created += 1
        self.in_a_row = 0

    def summary(self) -> dict[str, Any]:
        return {
            "created": self.created,
            "refused": self.refused,
            "first_refused": self.first_refused,
            "errors": self.errors,
        }


def _send(conn: RawClient, command: str, headers: dict[str, str], body: bytes = b"") -> bool:
    """Write one frame; False when the broker closed the connection (after an ERROR)."""
    try:
        conn.send(command, headers, body)
    except OSError:
        return False
    return True


def _answers(conn: RawClient, receipts: set[str]) -> tuple[set[str], tuple[str, str] | None]:
    """Read until every receipt in `receipts` came or an ERROR did: the receipts that came,
    and the ERROR's (receipt-id, message) if one did (the connection is then closed)."""
    came: set[str] = set()
    deadline = time.monotonic() + _TIMEOUT_S
    while came != receipts:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise FrameTimeout(f"{len(receipts - came)} receipts did not come")
        try:
            frames = conn.read(remaining)
        except (BrokerClosed, ConnectionResetError):
            return came, ("", "connection closed")
        for frame in frames or []:
            if frame.command == "RECEIPT":
                came.add(frame.headers.get("receipt-id", ""))
            elif frame.command == "ERROR":
                return came, (
                    frame.headers.get("receipt-id", ""),
                    frame.headers.get("message", ""),
                )
    return came, None


def _make_queues(server: BrokerProcess, names: list[str], body: bytes, give_up: int) -> _Tally:
    """One message to each queue: pipelined until the first ERROR, then one at a time."""
    tally = _Tally()
    conn: RawClient | None = connect(server, _TIMEOUT_S)
    at = 0
    alone = False
    while at < len(names) and not (give_up and tally.in_a_row >= give_up):
        if conn is None:
            conn = connect(server, _TIMEOUT_S)
        batch = names[at : at + (1 if alone else _BATCH)]
        for i, name in enumerate(batch):
            headers = {"destination": name, "persistent": "false", "receipt": str(at + i)}
            if not _send(conn, "SEND", headers, body):
                break  # refused and closed: the answers say which
        came, error = _answers(conn, {str(at + i) for i in range(len(batch))})
        # In order: everything before the first unanswered one was taken.
        done = 0
        while done < len(batch) and str(at + done) in came:
            tally.success()
            done += 1
        if error is not None:
            conn.close()
            conn = None
            if alone or error[0] == str(at + done):
                tally.refusal(error[1], names[at + done])
                done += 1
            alone = True
        at += done
    if conn is not None:
        with contextlib.suppress(OSError, AssertionError, BrokerClosed):
            conn.disconnect()
        conn.close()
    return tally


def _make_topics(
    server: BrokerProcess, names: list[str], give_up: int, holders: list[RawClient]
) -> _Tally:
    """Subscribe to each topic, held by `holders` (appended to): a thousand per connection
    until the first ERROR, then each tried alone first."""
    tally = _Tally()
    at = 0
    sub_id = 0
    while at < len(names):
        chunk = names[at : at + _HOLDER_SUBSCRIPTIONS]
        holder = connect(server, _TIMEOUT_S)
        for i, name in enumerate(chunk):
            headers = {"destination": name, "id": str(sub_id + i), "receipt": str(sub_id + i)}
            if not _send(holder, "SUBSCRIBE", headers):
                break
        _came, error = _answers(holder, {str(sub_id + i) for i in range(len(chunk))})
        sub_id += len(chunk)
        if error is None:
            holders.append(holder)
            for _ in chunk:
                tally.success()
            at += len(chunk)
            continue
        # The chunk's connection is gone with its subscriptions: each of them, and every
        # later one, alone.
        holder.close()
        break
    alone: RawClient | None = None  # holds those subscribed to one at a time
    while at < len(names) and not (give_up and tally.in_a_row >= give_up):
        name = names[at]
        probe = connect(server, _TIMEOUT_S)
        _send(probe, "SUBSCRIBE", {"destination": name, "id": "p", "receipt": "p"})
        _came, error = _answers(probe, {"p"})
        if error is not None:
            probe.close()
            tally.refusal(error[1], name)
        else:
            if alone is None or sub_id % _HOLDER_SUBSCRIPTIONS == 0:
                alone = connect(server, _TIMEOUT_S)
                holders.append(alone)
            alone.send("SUBSCRIBE", {"destination": name, "id": str(sub_id), "receipt": "h"})
            alone.expect("RECEIPT", "h")
            sub_id += 1
            probe.disconnect()
            probe.close()
            tally.success()
        at += 1
    return tally


def _status(server: BrokerProcess) -> dict[str, Any]:
    if not server.admin_url:
        return {}
    with urllib.request.urlopen(f"{server.admin_url}/status?limit=0", timeout=30) as response:
        page: dict[str, Any] = json.load(response)
    return page


def _status_summary(page: dict[str, Any]) -> dict[str, Any]:
    memory = page.get("memory") or {}
    pipelines = {}
    for worker in page.get("workers", []):
        stats = worker.get("stats") or {}
        if worker.get("role") in ("p2p", "pubsub"):
            pipelines[worker["title"]] = {
                k: v
                for k, v in stats.items()
                if k.startswith("destinations") or k.startswith("max_destinations")
            }
    return {
        "memwatch_used_bytes": memory.get("used_bytes"),
        "memwatch_level": memory.get("level"),
        "memwatch_percent": memory.get("percent"),
        "pipelines": pipelines,
        "destinations": page.get("destinations"),
    }


def _delta(before: dict[str, int], after: dict[str, int], count: int) -> dict[str, Any]:
    return {
        title: {
            "grew": after.get(title, 0) - before.get(title, 0),
            "per_destination": (after.get(title, 0) - before.get(title, 0)) // count
            if count
            else None,
        }
        for title in after
    }


def measure(
    queues: int,
    topics: int,
    *,
    body: int = 10,
    gateways: int = 1,
    config: str = "",
    give_up_after: int = 0,
    reference: bool = False,
) -> dict[str, Any]:
    """Start a broker, make the destinations, measure, stop it; see the module's docstring."""
    server = BrokerProcess(gateways=gateways, admin=True, config=config or None)
    holders: list[RawClient] = []
    result: dict[str, Any] = {"queues": queues, "topics": topics, "body": body, "steps": {}}
    seen: list[psutil.Process] = []
    peak: _Peak | None = None
    started = time.monotonic()

    def step(name: str, count: int, make: Callable[[], _Tally]) -> None:
        before = result["pss"]
        tally = make()
        _status(server)  # the admin thread reads every snapshot: its share is counted
        after = result["pss"] = pss_by_process(server)
        made = tally.created if count < 0 else count
        result["steps"][name] = {
            **tally.summary(),
            "pss": after,
            "delta": _delta(before, after, made),
        }
        grew = after["total + /dev/shm"] - before["total + /dev/shm"]
        _say(
            f"{name}: {tally.created} made, {tally.refused} refused: "
            f"+{grew / 2**20:.1f} MiB PSS and /dev/shm ({grew // max(1, made)} B each)"
        )

    try:
        server.start()
        _say(f"broker (pid {server.pid}) ready on {server.host}:{server.port}")
        seen = server.processes()
        # Warm up every path the steps take, so imports and caches are not counted.
        _make_queues(server, [f"/queue/warm-{i}" for i in range(_WARMUP)], b"w", 0)
        _make_topics(server, [f"/topic/warm-{i}" for i in range(_WARMUP)], 0, holders)
        peak = _Peak(server)
        peak.start()
        _status(server)
        result["pss"] = result["idle_pss"] = pss_by_process(server)
        _say(f"idle: {result['idle_pss']['total'] / 2**20:.1f} MiB PSS")
        if reference:
            # What the messages and subscriptions cost without destinations of their own.
            step(
                "messages to one queue",
                queues,
                lambda: _make_queues(server, ["/queue/one"] * queues, b"x" * body, 0),
            )
            step(
                "subscriptions to one topic",
                topics,
                lambda: _make_topics(server, ["/topic/one"] * topics, 0, holders),
            )
        step(
            "queues",
            -1,
            lambda: _make_queues(
                server, [f"/queue/dest-{i}" for i in range(queues)], b"x" * body, give_up_after
            ),
        )
        step(
            "topic subscriptions",
            -1,
            lambda: _make_topics(
                server, [f"/topic/dest-{i}" for i in range(topics)], give_up_after, holders
            ),
        )
        time.sleep(1.5)  # a MemWatch reading and a stats snapshot past the last step
        result["status"] = _status_summary(_status(server))
        result["final_pss"] = result["pss"]["total"]
    finally:
        if peak is not None:
            peak.stopping.set()
            peak.join()
            result["peak_pss"] = peak.peak
        for conn in holders:
            conn.close()
        with contextlib.suppress(psutil.Error):
            if server.process is not None:
                seen += [p for p in server.processes() if p not in seen]
        status = server.stop()
    result["seconds"] = round(time.monotonic() - started, 1)
    _gone, alive = psutil.wait_procs(seen, timeout=5)
    left = [f"pid {p.pid}" for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    left += [f"{SHM_DIR}/{n}" for n in server.shm_entries()]
    result["left_behind"] = left
    result["stop_status"] = status
    result["ok"] = not left and status == 0
    return result


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f} MiB"


def format_result(r: dict[str, Any]) -> str:
    lines = [f"idle broker: {_mib(r['idle_pss']['total'])} PSS"]
    for name, st in r["steps"].items():
        lines.append(
            f"{name}: {st['created']} made, {st['refused']} refused; PSS after "
            f"{_mib(st['pss']['total'])}, /dev/shm {_mib(st['pss']['/dev/shm'])}"
        )
        for title, d in st["delta"].items():
            each = "" if d["per_destination"] is None else f"  ({d['per_destination']} B each)"
            lines.append(f"    {title:<18} {d['grew'] / 2**20:+8.2f} MiB{each}")
        for message, count in st["errors"].items():
            lines.append(f"    ERROR x{count}: {message}")
    lines.append(f"highest PSS seen: {_mib(r.get('peak_pss'))}")
    status = r.get("status") or {}
    if status:
        lines.append(
            f"MemWatch: {_mib(status.get('memwatch_used_bytes'))}, level "
            f"{status.get('memwatch_level')} ({status.get('memwatch_percent')} %)"
        )
        if status.get("destinations"):
            lines.append(f"destinations: {status['destinations']}")
    lines.append(f"{r['seconds']} s")
    lines.append("LEFT BEHIND: " + "; ".join(r["left_behind"]) if r["left_behind"] else "ok")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.destinations",
        description="Start a broker, make many queues (one message each) and topic "
        "subscriptions (one topic each), and measure what they cost in memory (PSS) and "
        "whether the broker refuses them past its limit; stop it and check nothing is left.",
    )
    parser.add_argument("--queues", type=int, default=10000, help="default 10000")
    parser.add_argument("--topics", type=int, default=10000, help="default 10000")
    parser.add_argument("--body", type=int, default=10, help="body bytes (default 10)")
    parser.add_argument("--gateways", type=int, default=1, help="default 1")
    parser.add_argument("--max-memory", help="memory.max_memory (default: the broker's)")
    parser.add_argument("--config", type=Path, help="a config file to start from")
    parser.add_argument(
        "--give-up-after",
        type=int,
        default=0,
        metavar="N",
        help="stop a step after N refusals in a row (default 0: try every destination)",
    )
    parser.add_argument(
        "--reference",
        action="store_true",
        help="first measure as many messages to one queue and subscriptions to one topic "
        "(what they cost without destinations of their own)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args(argv)
    if min(args.queues, args.topics, args.body, args.give_up_after) < 0 or args.gateways < 1:
        parser.error("counts must not be negative, and --gateways at least 1")
    config = args.config.read_text(encoding="utf-8") if args.config else ""
    if args.max_memory:
        config = f'[memory]\nmax_memory = "{args.max_memory}"\n' + config
    try:
        result = measure(
            args.queues,
            args.topics,
            body=args.body,
            gateways=args.gateways,
            config=config,
            give_up_after=args.give_up_after,
            reference=args.reference,
        )
    except (ServerError, OSError, FrameTimeout, StompError) as exc:
        _say(f"aborted: {describe(exc)}")
        return 1
    print(json.dumps(result) if args.json else format_result(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
