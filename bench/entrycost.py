"""What one more waiting message costs a pipeline beyond its body, by tracemalloc.

``python -m bench.entrycost [--messages 50000]`` feeds an engine that many messages
with 1 KB bodies and three typical headers, each decoded off an encoded ``Send`` record as a
worker takes it off a ring (so every message's id, destination and header values are
freshly allocated; msgspec shares short header names, as it does off a ring), with nothing
consuming them, and prints the memory the engine kept per message (tracemalloc, after a
warm-up, before/after with a collection each side):

- ``queue, paged``: non-persistent, paged to the temp store (the pager keeps nothing here:
  only the engine's side is counted) -- the record and its headers stay in memory;
- ``queue, index-only``: persistent, restored beyond the index cache (``max_entries=0``) --
  the record and its headers stay, the body is left in the store;
- ``queue, in memory``: non-persistent, not paged, less its body's length (what
  ``PER_MESSAGE_BYTES`` stands for);
- ``topic stub``: non-persistent, waiting for a subscriber whose window is full while the
  pubsub engine pages -- the stub keeps neither headers nor body.

The queues are plain (no consumer with a selector). The budget's constants
(mpbroker/memory/_budget.py) round these up: run this again after changing what an engine
keeps per message, and update them (a measurement, so not a test).
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc
from collections.abc import Callable

from mpbroker.config import QueueSettings, TopicSettings
from mpbroker.engine import IndexCache, Outbox, QueueEngine, TopicEngine
from mpbroker.records import ACK_CLIENT, Message, Send, Subscribe, decode, encode

__all__ = ["KINDS", "measure"]

BODY = b"x" * 1024
QUEUE = "/queue/orders"
TOPIC = "/topic/prices"
HEADERS = 3


class _NullPager:
    """A temp store that keeps nothing: only what the engine holds is measured."""

    def __init__(self) -> None:
        self.key = 0

    def put(self, page: bytes) -> int | None:
        self.key += 1
        return self.key

    def take(self, key: int) -> bytes:
        raise AssertionError("nothing is delivered")

    def read(self, key: int) -> bytes:
        raise AssertionError("nothing is delivered")

    def drop(self, key: int) -> None:
        pass


def _load(seq: int) -> Message:
    raise AssertionError("nothing is delivered")


def _wire(n: int, destination: str, persistent: bool) -> tuple[int, bytes]:
    """The ring record (kind, payload) of message `n`."""
    headers = {
        "content-type": "application/json",
        "correlation-id": f"req-{n:012d}",
        "region": "eu-west",
    }
    message = Message(
        f"ID-5f3a9c1e-0.1-{n}",
        destination,
        headers,
        BODY,
        1_764_000_000_000 + n,
        persistent=persistent,
        seq=n if persistent else 0,
    )
    return encode(Send(7, message))


def _queue_engine(kind: str, messages: int) -> tuple[Callable[[Send], None], Callable[[], None]]:
    settings = QueueSettings(max_messages=2 * messages, max_bytes=1 << 40)
    if kind == "queue, index-only":
        engine = QueueEngine(settings, 0, Outbox(), index_cache=IndexCache(_load, max_entries=0))
    else:
        engine = QueueEngine(settings, 0, Outbox(), pager=_NullPager())
        engine.paging = kind == "queue, paged"

    def take(record: Send) -> None:
        if record.message.persistent:
            engine.restore(record.message)
        else:
            engine.handle(0, record)

    def check() -> None:
        waiting = list(engine.queues[QUEUE].pending)
        assert len(waiting) == engine.depth(QUEUE)
        for message in waiting:
            assert len(message.headers) == HEADERS
            if kind == "queue, in memory":
                assert message.body == BODY
            else:
                assert message.body == b"" and (message.paged or message.temp_key)

    return take, check


def _topic_engine(messages: int) -> tuple[Callable[[Send], None], Callable[[], None]]:
    settings = TopicSettings(
        max_pending_messages=2 * messages,
        live_msg_high=2 * messages,
        live_msg_low=messages,
        global_live_msg_high=2 * messages,
        global_live_msg_low=messages,
    )
    engine = TopicEngine(settings, 0, Outbox(), pager=_NullPager())
    # A subscriber whose window (one message, unacknowledged) is full: the rest wait.
    engine.handle(0, Subscribe(1, 1, "sub-1", TOPIC, ACK_CLIENT, 1))
    engine.handle(0, decode(*_wire(0, TOPIC, False)))
    engine.paging = True
    engine.outbox.take()

    def take(record: Send) -> None:
        engine.handle(0, record)

    def check() -> None:
        (consumer,) = engine.consumers.values()
        assert all(m.temp_key and not m.headers and not m.body for m in consumer.pending)

    return take, check


KINDS = ("queue, paged", "queue, index-only", "queue, in memory", "topic stub")


def measure(kind: str, messages: int = 50_000) -> float:
    """Bytes the engine keeps per waiting message of `kind` (one of KINDS), beyond the
    body for "queue, in memory"."""
    if kind == "topic stub":
        take, check = _topic_engine(messages)
        destination, persistent = TOPIC, False
    else:
        take, check = _queue_engine(kind, messages)
        destination, persistent = QUEUE, kind == "queue, index-only"
    warm_up = 10
    for n in range(1, warm_up + 1):  # the destination and its structures exist
        record = decode(*_wire(n, destination, persistent))
        assert isinstance(record, Send)
        take(record)
    wire = [_wire(n, destination, persistent) for n in range(warm_up + 1, warm_up + 1 + messages)]
    gc.collect()
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for record_kind, payload in wire:
            record = decode(record_kind, payload)
            assert isinstance(record, Send)
            take(record)
        del record
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        if started:
            tracemalloc.stop()
    check()
    each = (after - before) / messages
    return each - len(BODY) if kind == "queue, in memory" else each


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.entrycost")
    parser.add_argument("--messages", type=int, default=50_000)
    args = parser.parse_args(argv)
    for kind in KINDS:
        print(f"{kind:<18} {measure(kind, args.messages):7.1f} B per message", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
