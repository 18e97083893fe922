"""Durable replay speed: a subscriber returning to a backlog of persistent topic messages.

Run: .venv/bin/python -m bench.replay [--count 100000] [--size 100] [--gateways 1]

Starts a broker, creates a durable subscription and leaves, publishes `count` persistent
messages to its topic (with receipts, so all are stored), then measures how fast the
returning subscriber receives the whole backlog (client acks every 500 messages), and, as a
baseline in the same run, how fast the same number of messages is consumed from a plain
persistent queue backlog. It also reports the pubsub worker's memory (USS) before the
publish and while the backlog waits for the absent subscriber: the backlog stays on disk.
"""

from __future__ import annotations

import argparse
import time

from mpbroker.harness import BrokerProcess, RawClient
from mpbroker.stomp import Frame, encode_frame

_ACK_EVERY = 500
_RECEIPT_EVERY = 1000


def _publish(conn: RawClient, destination: str, count: int, size: int) -> None:
    body = b"x" * size
    sent = 0
    while sent < count:
        batch = min(_RECEIPT_EVERY, count - sent)
        frames = [
            encode_frame(Frame("SEND", {"destination": destination, "persistent": "true"}, body))
            for _ in range(batch - 1)
        ]
        frames.append(
            encode_frame(
                Frame(
                    "SEND",
                    {"destination": destination, "persistent": "true", "receipt": f"r{sent}"},
                    body,
                )
            )
        )
        conn.send_bytes(b"".join(frames))
        conn.expect("RECEIPT", f"r{sent}")
        sent += batch


def _drain(conn: RawClient, count: int) -> float:
    """Seconds to receive `count` MESSAGE frames, acknowledging cumulatively."""
    received = 0
    started = time.perf_counter()
    while received < count:
        frames = conn.read(30.0)
        if frames is None:
            raise TimeoutError(f"stalled after {received} of {count} messages")
        for frame in frames:
            if frame.command != "MESSAGE":
                continue
            received += 1
            if received % _ACK_EVERY == 0 or received == count:
                conn.send("ACK", {"id": frame.headers["ack"]})
    return time.perf_counter() - started


def _subscribe(conn: RawClient, destination: str, **headers: str) -> None:
    conn.send(
        "SUBSCRIBE",
        {
            "destination": destination,
            "id": "s",
            "ack": "client",
            "activemq.prefetchSize": "1000",
            "receipt": "sub",
            **headers,
        },
    )
    conn.expect("RECEIPT", "sub")


def _pubsub_uss_mib(server: BrokerProcess) -> float:
    """Unique memory of the broker's pubsub worker, in MiB."""
    pubsub = server.workers().get("pubsub 0")
    if pubsub is None:
        raise RuntimeError("no pubsub worker found")
    return float(pubsub.memory_full_info().uss) / 2**20


def _connect(server: BrokerProcess, timeout_s: float) -> RawClient:
    conn = RawClient(server.host, server.port, timeout_s, send_timeout=None)
    conn.connect()
    return conn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--gateways", type=int, default=1)
    args = parser.parse_args(argv)
    with BrokerProcess(gateways=args.gateways, admin=False) as server:
        subscriber = _connect(server, 60)
        _subscribe(subscriber, "/topic/replay", durable="true")
        subscriber.disconnect()
        subscriber.close()

        idle_mib = _pubsub_uss_mib(server)
        producer = _connect(server, 120)
        started = time.perf_counter()
        _publish(producer, "/topic/replay", args.count, args.size)
        waiting_mib = _pubsub_uss_mib(server)
        _publish(producer, "/queue/replay-baseline", args.count, args.size)
        published = time.perf_counter() - started

        back = _connect(server, 60)
        _subscribe(back, "/topic/replay", durable="true")
        replay_s = _drain(back, args.count)
        back.close()

        queue = _connect(server, 60)
        _subscribe(queue, "/queue/replay-baseline")
        queue_s = _drain(queue, args.count)
        queue.close()
        producer.close()
    print(f"published 2 x {args.count} persistent {args.size}-byte messages in {published:.1f} s")
    print(
        f"pubsub worker USS: {idle_mib:.1f} MiB before, {waiting_mib:.1f} MiB with the "
        f"{args.count}-message backlog waiting for its absent subscriber"
    )
    print(f"durable replay: {args.count / replay_s:,.0f} msgs/s ({replay_s:.2f} s)")
    print(f"queue backlog:  {args.count / queue_s:,.0f} msgs/s ({queue_s:.2f} s)")
    print(f"replay / queue backlog: x{queue_s / replay_s:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
