"""The log cannot be flooded or forged by clients: a thousand refused frames cost a couple of
lines, and what a client wrote is quoted escaped."""

from __future__ import annotations

import re

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
