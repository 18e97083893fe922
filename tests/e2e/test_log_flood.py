"""The log cannot be flooded or forged by clients: a thousand refused frames cost a couple of
lines, as do bad frames from hundreds of addresses, and what a client wrote is quoted
escaped."""

from __future__ import annotations

import re
import socket
import time

import pytest

from mpbroker.harness import BrokerProcess, RawClient
from mpbroker.stomp import Frame, encode_frame

pytestmark = pytest.mark.slow

# A name that, written raw, would start a line of its own that looks like the broker's.
FORGED = "d\n2026-11-25 00:00:00,000 WARNING supervisor[1] \x1b[31mforged"


def test_a_thousand_refused_frames_cost_two_lines(start_broker: type[BrokerProcess]) -> None:
    broker = start_broker("--gateways", "1")
    holder = RawClient(broker.host, broker.port)
    holder.connect(**{"client-id": "app"})
    durable = {"destination": "/topic/t", "activemq.subscriptionName": FORGED}
    holder.send("SUBSCRIBE", {**durable, "id": "h", "receipt": "r"})
    assert holder.recv().command == "RECEIPT"
    # Four connections pipeline 250 SUBSCRIBEs each to the durable subscription the
    # holder has: the pubsub worker refuses every one of them.
    clients = []
    for _ in range(4):
        client = RawClient(broker.host, broker.port)
        client.connect(**{"client-id": "app"})
        client.send_bytes(
            b"".join(
                encode_frame(Frame("SUBSCRIBE", {**durable, "id": str(n)})) for n in range(250)
            )
        )
        clients.append(client)
    for client in clients:
        [error] = client.recv_until_closed()
        assert "is already active" in error.headers["message"]
    # And a few more connections with frames the parser refuses, with escape sequences.
    for _ in range(20):
        client = RawClient(broker.host, broker.port)
        client.send_bytes(b"HELLO\x1b[31m\x07\n\n\x00")
        assert [f.command for f in client.recv_until_closed()] == ["ERROR"]
        client.close()
    holder.close()
    for client in clients:
        client.close()
    broker.stop_checked()  # the gateway sums up what it only counted as it stops
    log = broker.log_text()

    refused = [line for line in broker.lines if "refused a frame" in line]
    assert len(refused) == 2, refused
    assert "refused a frame from 127.0.0.1:" in refused[0]
    assert "'app/d\\n2026-11-25 00:00:00,000 WARNING supervisor[1] \\x1b[31mforged'" in refused[0]
    summed = re.search(r"refused a frame: … and ([\d,]+) more like it from 127\.0\.0\.1 ", log)
    assert summed is not None, refused
    # Every frame the pipeline refused while its connection was open is counted.
    assert int(summed.group(1).replace(",", "")) >= 500
    errors = [line for line in broker.lines if "protocol error" in line]
    assert len(errors) == 2, errors
    assert "more like it from 127.0.0.1" in errors[1]
    # Nothing a client wrote starts a line or reaches the terminal raw.
    assert not [line for line in broker.lines if line.startswith("2026-11-25 00:00:00,000")]
    assert not [line for line in broker.lines if "\x1b" in line or "\x07" in line]
    assert len(log) < 10_000, log


FLOOD_S = 3.0
# 300 loopback addresses (Linux routes all of 127.0.0.0/8 to lo).
ADDRESSES = [f"127.0.{1 + n // 250}.{1 + n % 250}" for n in range(300)]
# What a kind of event may write per gateway in one window: its first line (200 characters
# of client text at most) and its summary; and what the stop writes besides.
KIND_BYTES = 2 * 600
STOP_BYTES = 3000
SUMMARY = re.compile(
    r"protocol error: … and ([\d,]+) more like it from (?:([\d,]+) addresses \(most from "
    r"(\S+): \d+\)|(\S+)) in the last"
)


def test_bad_frames_from_many_addresses_cost_lines_per_kind_not_per_address(
    start_broker: type[BrokerProcess],
) -> None:
    """Issue 30: a minute of bad frames from 3,000 addresses wrote 1.8 MB. Now a kind of
    event logs its first one and counts the others, whatever the address: the log grows by
    a bound of lines per kind (and gateway), and the counts add up to what was sent."""
    gateways = 2
    broker = start_broker("--gateways", str(gateways))
    start = len(broker.lines)
    sent = 0
    deadline = time.monotonic() + FLOOD_S
    while time.monotonic() < deadline:
        for address in ADDRESSES[sent % len(ADDRESSES) :][:50]:
            with socket.create_connection(
                (broker.host, broker.port), timeout=10, source_address=(address, 0)
            ) as sock:
                sock.sendall(b"HELLO\n\n\x00")  # no such command: a protocol error
                answer = b""
                while chunk := sock.recv(4096):  # the ERROR, then the end
                    answer += chunk
            assert answer.startswith(b"ERROR\n"), answer
            sent += 1
    assert sent >= len(ADDRESSES), f"only {sent} connections in {FLOOD_S} s"
    broker.stop_checked()  # the gateways sum up what they only counted as they stop
    flood = broker.lines[start:]

    # One kind, each gateway's own collapser: its first line, then one summary (all of it
    # fits the first 10 s window).
    errors = [line for line in flood if "protocol error" in line]
    firsts = [line for line in errors if "protocol error from 127.0." in line]
    summaries = [m for m in map(SUMMARY.search, errors) if m]
    said = f"{len(errors)} lines, the first ones: {errors[:6]}"
    assert len(firsts) + len(summaries) == len(errors) <= 2 * gateways, said
    assert 1 <= len(firsts) <= gateways and len(summaries) <= gateways, said
    for first in firsts:  # informative: an address and what the client sent
        assert re.search(r"protocol error from 127\.0\.[12]\.\d+:\d+: .*HELLO", first), first
    counted = sum(int(m.group(1).replace(",", "")) for m in summaries)
    assert len(firsts) + counted == sent
    for m in summaries:
        if m.group(2):  # several addresses: how many, and the one that sent most
            assert int(m.group(2).replace(",", "")) <= len(ADDRESSES)
            assert m.group(3) in ADDRESSES
        else:
            assert m.group(4) in ADDRESSES
    # What the log grew by: a bound from the kinds (one here) and gateways, whatever the
    # number of addresses. The old per-address collapsing wrote a line per address.
    size = sum(len(line) + 1 for line in flood)
    assert size < 1 * gateways * KIND_BYTES + STOP_BYTES, "\n".join(flood[:20])
