"""What one more connection, subscription or waiting message costs the broker in memory.

``python -m bench.unitcost [--connections 1000] [--subscriptions 2000] [--messages 20000]
[--size 100] [--json]`` starts a broker (one gateway, the default pipelines) on free loopback
ports with a temporary data directory (:class:`mpbroker.harness.BrokerProcess`), warms it up
(a few connections, subscriptions and messages, all gone again), then measures three steps,
each from the summed PSS of every broker process (the supervisor and all its descendants)
just before it, so what one step allocated is never reused by the next:

1. ``--connections`` idle STOMP connections (CONNECT, no heart-beats), kept open;
2. ``--subscriptions`` subscriptions on one more connection, half to queues and half to
   topics, each to its own destination, with their consumer windows idle (nothing sent);
3. ``--messages`` non-persistent messages of ``--size`` body bytes sent to one queue nobody
   consumes (the last with a receipt, so all of them are in the queue when it comes back).

Per unit: the PSS growth of the step divided by its count (for messages, minus the body:
the cost *beyond* it). These are the constants of ``mpbroker config estimate`` in
:mod:`mpbroker.memory`. Each step is sampled a few times after a pause and the median taken:
a Python process grows in arenas, so small counts give noisy figures; use the defaults.

Stops the broker with SIGTERM and checks that none of its processes and none of its
/dev/shm entries is left. Exit status 0 when it measured and left nothing behind, else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from typing import Any

import psutil

from bench.fixedcost import _title
from mpbroker.harness import BrokerProcess, FrameTimeout, RawClient, ServerError, StompError
from mpbroker.loadgen.control import describe
from mpbroker.shm import SHM_DIR

__all__ = ["connect", "main", "measure", "pss_by_process", "shm_bytes"]

_TIMEOUT_S = 30.0
_SETTLE_S = 2.0
_SAMPLES = 3
_WARMUP = 20


def _say(text: str) -> None:
    print(f"unitcost: {text}", file=sys.stderr, flush=True)


def shm_bytes(server: BrokerProcess) -> int:
    """The size of the broker's /dev/shm entries (MemWatch counts them whole): the rings
    and blocks, and the stats spill files, which grow with the destinations."""
    total = 0
    for name in server.shm_entries():
        with contextlib.suppress(OSError):
            total += os.stat(os.path.join(SHM_DIR, name)).st_size
    return total


def pss_by_process(server: BrokerProcess) -> dict[str, int]:
    """PSS by process title (median of a few samples after a pause); "total" their sum,
    "/dev/shm" the size of the broker's entries there, "total + /dev/shm" both."""
    time.sleep(_SETTLE_S)
    samples: dict[str, list[int]] = {}
    for n in range(_SAMPLES):
        if n:
            time.sleep(0.3)
        total = 0
        for process in server.processes():
            with contextlib.suppress(psutil.Error):
                pss = int(process.memory_full_info().pss)
                samples.setdefault(_title(process), []).append(pss)
                total += pss
        shm = shm_bytes(server)
        samples.setdefault("total", []).append(total)
        samples.setdefault("/dev/shm", []).append(shm)
        samples.setdefault("total + /dev/shm", []).append(total + shm)
    return {title: int(statistics.median(values)) for title, values in samples.items()}


def _pss(server: BrokerProcess) -> int:
    """The summed PSS of the broker's processes: the median of a few samples after a pause."""
    return pss_by_process(server)["total"]


def connect(server: BrokerProcess, timeout_s: float = _TIMEOUT_S) -> RawClient:
    """A RawClient CONNECTed to `server`, waiting up to `timeout_s` for each answer."""
    conn = RawClient(server.host, server.port, timeout_s, send_timeout=None)
    conn.connect()
    return conn


def _subscribe(conn: RawClient, destinations: list[str], first_id: int) -> None:
    """SUBSCRIBE to each destination; the last one with a receipt, awaited."""
    for i, destination in enumerate(destinations):
        headers = {"destination": destination, "id": str(first_id + i), "ack": "client-individual"}
        if i == len(destinations) - 1:
            headers["receipt"] = f"sub-{first_id + i}"
        conn.send("SUBSCRIBE", headers)
    if destinations:
        conn.expect("RECEIPT", f"sub-{first_id + len(destinations) - 1}")


def _send(conn: RawClient, destination: str, count: int, size: int, tag: str) -> None:
    """`count` non-persistent SENDs; the last with a receipt, awaited."""
    body = b"x" * size
    for i in range(count):
        headers = {"destination": destination, "persistent": "false"}
        if i == count - 1:
            headers["receipt"] = tag
        conn.send("SEND", headers, body)
    conn.expect("RECEIPT", tag)


def _warm_up(server: BrokerProcess) -> None:
    """Every code path the steps use once, so imports and caches are not counted."""
    conns = [connect(server) for _ in range(_WARMUP)]
    _subscribe(conns[0], [f"/queue/warm-{i}" for i in range(_WARMUP)], 0)
    _subscribe(conns[1], [f"/topic/warm-{i}" for i in range(_WARMUP)], 0)
    _send(conns[2], "/queue/warm-msgs", 200, 100, "warm")
    for conn in conns:
        conn.disconnect()
        conn.close()


def measure(connections: int, subscriptions: int, messages: int, size: int) -> dict[str, Any]:
    """Start a broker, measure the three steps, stop it; see the module's docstring."""
    server = BrokerProcess(gateways=1, admin=False)
    open_conns: list[RawClient] = []
    result: dict[str, Any] = {
        "connections": connections,
        "subscriptions": subscriptions,
        "messages": messages,
        "message_body_bytes": size,
    }
    seen: list[psutil.Process] = []
    try:
        server.start()
        _say(f"broker (pid {server.pid}) ready on {server.host}:{server.port}")
        seen = server.processes()
        _warm_up(server)

        before = _pss(server)
        result["idle_pss"] = before
        open_conns = [connect(server) for _ in range(connections)]
        after = _pss(server)
        result["per_connection"] = (after - before) // connections
        _say(f"{connections} connections: +{after - before} bytes")

        before = after
        holder = connect(server)
        open_conns.append(holder)
        half = subscriptions // 2
        _subscribe(holder, [f"/queue/unitcost-{i}" for i in range(half)], 0)
        _subscribe(holder, [f"/topic/unitcost-{i}" for i in range(subscriptions - half)], half)
        after = _pss(server)
        # The connection that holds them is one more connection: not a subscription's cost.
        grew = after - before - result["per_connection"]
        result["per_subscription"] = grew // subscriptions
        _say(f"{subscriptions} subscriptions: +{after - before} bytes")

        before = after
        producer = connect(server)
        open_conns.append(producer)
        _send(producer, "/queue/unitcost-waiting", messages, size, "sent")
        after = _pss(server)
        grew = after - before - result["per_connection"]
        result["per_message"] = grew // messages - size
        _say(f"{messages} messages of {size} bytes: +{after - before} bytes")
    finally:
        for conn in open_conns:
            conn.close()
        with contextlib.suppress(psutil.Error):
            if server.process is not None:
                seen += [p for p in server.processes() if p not in seen]
        status = server.stop()
    _gone, alive = psutil.wait_procs(seen, timeout=5)
    left = [f"pid {p.pid}" for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    left += [f"{SHM_DIR}/{n}" for n in server.shm_entries()]
    result["left_behind"] = left
    result["stop_status"] = status
    result["ok"] = not left and status == 0
    return result


def format_result(r: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"idle broker (1 gateway): {r['idle_pss'] / 2**20:.1f} MiB PSS",
            f"per connection:   {r['per_connection']:>7} bytes  ({r['connections']} idle)",
            f"per subscription: {r['per_subscription']:>7} bytes  ({r['subscriptions']}, "
            "half queues, half topics, windows idle)",
            f"per message:      {r['per_message']:>7} bytes beyond its body  ({r['messages']} "
            f"non-persistent messages of {r['message_body_bytes']} bytes waiting in a queue)",
            "LEFT BEHIND: " + "; ".join(r["left_behind"]) if r["left_behind"] else "ok",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.unitcost",
        description="Start a broker and measure the memory (PSS) one more connection, "
        "subscription and waiting message costs; stop it and check that nothing is left.",
    )
    parser.add_argument("--connections", type=int, default=1000, help="default 1000")
    parser.add_argument("--subscriptions", type=int, default=2000, help="default 2000")
    parser.add_argument("--messages", type=int, default=20000, help="default 20000")
    parser.add_argument("--size", type=int, default=100, help="body bytes (default 100)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args(argv)
    if min(args.connections, args.subscriptions, args.messages, args.size) < 1:
        parser.error("every count and --size must be at least 1")
    try:
        result = measure(args.connections, args.subscriptions, args.messages, args.size)
    except (ServerError, OSError, FrameTimeout, StompError) as exc:
        _say(f"aborted: {describe(exc)}")
        return 1
    print(json.dumps(result) if args.json else format_result(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
