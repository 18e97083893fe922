"""Destinations against the memory budget in a real broker: a producer making ever new
queues, and subscribers ever new topics, get an ERROR naming broker.max_destinations once
the broker holds as many as its budget lets it, and its memory (the PSS of every process)
stays under max_memory; what exists keeps working, and a queue that is forgotten makes
room for another.

No new setting is used: the limit is derived from a smaller max_memory (the budgets that
fit it set below), so the same scenario runs against a broker that has no limit -- and
fails there, on memory and for want of an ERROR.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.request
from typing import Any

import psutil
import pytest

from mpbroker.harness import BrokerProcess, RawClient

pytestmark = pytest.mark.slow

MAX_MEMORY = 160 * 2**20
# Budgets small enough for 160 MiB (the rest of the defaults fit it as they are).
CONFIG = """
[memory]
max_memory = "160MiB"
[vol_queue_store]
global_byte_high = "4MiB"
global_byte_low = "3MiB"
global_msg_high = 20000
global_msg_low = 15000
msg_high = 20000
msg_low = 15000
[pers_queue_store]
global_msg_high = 10000
global_msg_low = 8000
msg_high = 10000
msg_low = 8000
"""
# A broker without a limit would take them all: 10,000 queues of one message each cost it
# over 100 MiB (some 11 KiB each before issue 30).
ATTEMPTS = 10_000
BATCH = 500
REFUSED = re.compile(
    r"ResourceAllocation: (/(?:queue|topic)/\S+) broker\.max_destinations (\d+) reached"
)


def pss(broker: BrokerProcess) -> int:
    """The PSS of every process of the broker, added up."""
    total = 0
    for process in broker.processes():
        with contextlib.suppress(psutil.Error):
            total += int(process.memory_full_info().pss)
    return total


def status(broker: BrokerProcess) -> dict[str, Any]:
    url = f"http://127.0.0.1:{broker.admin_port}/status?limit=0"
    with urllib.request.urlopen(url, timeout=10) as response:
        page: dict[str, Any] = json.load(response)
    return page


def send_batch(client: RawClient, names: list[str], first: int) -> tuple[int, Any]:
    """One message to each of `names`, with receipts `first`...: how many were taken, in
    order, before an ERROR (None: none came)."""
    for i, name in enumerate(names):
        client.send("SEND", {"destination": name, "receipt": str(first + i)}, b"x" * 10)
    taken = 0
    while taken < len(names):
        frame = client.recv(timeout=30)
        if frame.command == "ERROR":
            return taken, frame
        assert (frame.command, frame.headers["receipt-id"]) == ("RECEIPT", str(first + taken))
        taken += 1
    return taken, None


def refusal(client: RawClient) -> Any:
    frames = client.recv_until_closed()
    assert [f.command for f in frames] == ["ERROR"], frames
    return frames[0]


def test_new_destinations_past_the_budget_are_refused_and_memory_stays_under_max_memory(
    start_broker: type[BrokerProcess], raw: Any
) -> None:
    broker = start_broker("--gateways", "1", config=CONFIG)
    highest = pss(broker)
    producer = raw(broker)
    producer.connect()
    made = 0
    error = None
    while made < ATTEMPTS and error is None:
        names = [f"/queue/many-{made + i}" for i in range(BATCH)]
        taken, error = send_batch(producer, names, made)
        made += taken
        highest = max(highest, pss(broker))
    assert highest < MAX_MEMORY, (
        f"the broker's PSS reached {highest / 2**20:.1f} MiB with {made} queues: over "
        f"max_memory {MAX_MEMORY / 2**20:.0f} MiB"
    )
    assert error is not None, f"{made} new queues and no ERROR"
    # The ERROR names the limit and the queue it refused, answers that SEND's receipt, and
    # no RECEIPT came for it.
    match = REFUSED.fullmatch(error.headers["message"])
    assert match is not None, error.headers["message"]
    assert match.group(1) == f"/queue/many-{made}"
    assert error.headers["receipt-id"] == str(made)
    limit = int(match.group(2))
    body = error.body.decode()
    assert "The message was not accepted" in body and "broker.max_destinations" in body
    assert producer.recv_until_closed() == []  # closed, as after any ERROR
    # Every queue it made holds its message: the limit is the number the broker holds.
    assert made == limit
    # /status says so too (the refusal once the p2p worker published its next snapshot).
    deadline = time.monotonic() + 10
    while True:
        page = status(broker)
        destinations = page["destinations"]
        if destinations.get("refused") or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (destinations["count"], destinations["max_destinations"]) == (limit, limit)
    # (The SENDs pipelined behind the refused one were refused too: already on their way.)
    assert destinations["refused"] >= 1
    assert destinations["budget_bytes"] == limit * destinations["per_destination_bytes"]
    assert page["memory"]["used_bytes"] < MAX_MEMORY

    # At the limit, what exists keeps working: a SEND to a queue that exists, and a
    # SUBSCRIBE to one, which gets its messages.
    client = raw(broker)
    client.connect()
    client.send("SEND", {"destination": "/queue/many-0", "receipt": "again"}, b"second")
    client.expect("RECEIPT", "again")
    client.send("SUBSCRIBE", {"destination": "/queue/many-0", "id": "1", "receipt": "sub"})
    client.expect("RECEIPT", "sub")
    bodies = [client.recv().body, client.recv().body]
    assert bodies == [b"x" * 10, b"second"]
    # A new topic or queue is refused, SUBSCRIBE as well as SEND.
    for destination in ("/topic/one-more", "/queue/one-more"):
        other = raw(broker)
        other.connect()
        other.send("SUBSCRIBE", {"destination": destination, "id": "1", "receipt": "r"})
        frame = refusal(other)
        assert frame.headers["message"] == (
            f"ResourceAllocation: {destination} broker.max_destinations {limit} reached"
        )
        assert frame.headers["receipt-id"] == "r"
        assert frame.body.decode().startswith("Nothing was subscribed")
    # A queue nobody consumes from and that holds nothing is forgotten: room for another.
    client.send("UNSUBSCRIBE", {"id": "1", "receipt": "unsub"})
    client.expect("RECEIPT", "unsub")
    late = raw(broker)
    late.connect()
    late.send("SEND", {"destination": "/queue/one-more", "receipt": "late"}, b"z")
    late.expect("RECEIPT", "late")
    assert pss(broker) < MAX_MEMORY
