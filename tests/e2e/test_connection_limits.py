"""Connections a client address may hold, and connections that have not completed CONNECT:
their own limits, counted over every gateway, so that idle sockets or one busy host cannot
take the broker's max_connections from everyone else."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import stomp

from mpbroker.harness import BrokerProcess, RawClient

pytestmark = pytest.mark.slow

CONFIG = """
[broker]
max_connections = 30
max_connections_connecting = 6
max_connections_per_address = 4
[stomp]
connect_timeout_ms = 3000
"""


@pytest.fixture
def limited(start_broker: type[BrokerProcess]) -> BrokerProcess:
    return start_broker("--gateways", "2", config=CONFIG)


@pytest.fixture
def clients() -> Iterator[list[RawClient]]:
    made: list[RawClient] = []
    yield made
    for client in made:
        client.close()


def refusal(client: RawClient) -> str:
    frames = client.recv_until_closed()
    assert [f.command for f in frames] == ["ERROR"], frames
    return frames[0].headers["message"]


def test_idle_sockets_cannot_take_every_connection(
    limited: BrokerProcess, clients: list[RawClient]
) -> None:
    # Idle sockets (two per address: below the per-address limit): their own limit.
    for n in range(6):
        clients.append(RawClient(limited.host, limited.port, source=f"127.0.2.{n // 2}"))
    time.sleep(0.5)  # accepted and counted by whichever gateway took each
    extra = RawClient(limited.host, limited.port, source="127.0.0.4")
    clients.append(extra)
    assert refusal(extra) == "connection refused: max_connections_connecting 6 reached"
    limited.wait_for_log(
        r"refused connection from 127\.0\.0\.4:\d+: max_connections_connecting 6 reached"
    )
    # Once they are dropped for sending no CONNECT, others get in.
    for idle in clients[:6]:
        assert "no CONNECT within connect_timeout_ms 3000" in refusal(idle)
    conn = stomp.Connection12([(limited.host, limited.port)])
    conn.connect(wait=True)
    conn.disconnect()


def test_a_connected_client_no_longer_counts_as_connecting(
    limited: BrokerProcess, clients: list[RawClient]
) -> None:
    for n in range(12):  # two per address, more than max_connections_connecting
        client = RawClient(limited.host, limited.port, source=f"127.0.1.{n // 2}")
        clients.append(client)
        client.connect()
    clients[0].send("SEND", {"destination": "/queue/limits", "receipt": "r"})
    assert clients[0].recv().headers["receipt-id"] == "r"


def test_one_address_may_hold_max_connections_per_address(
    limited: BrokerProcess, clients: list[RawClient]
) -> None:
    for _ in range(4):
        client = RawClient(limited.host, limited.port, source="127.0.0.5")
        clients.append(client)
        client.connect()
    extra = RawClient(limited.host, limited.port, source="127.0.0.5")
    assert refusal(extra) == "connection refused: max_connections_per_address 4 reached"
    extra.close()
    limited.wait_for_log(
        r"refused connection from 127\.0\.0\.5:\d+: max_connections_per_address 4 reached"
    )
    # Another address is not affected; a place given back is taken again.
    other = RawClient(limited.host, limited.port, source="127.0.0.6")
    clients.append(other)
    other.connect()
    clients[0].close()
    deadline = time.monotonic() + 10
    while True:  # once its gateway saw the close
        again = RawClient(limited.host, limited.port, source="127.0.0.5")
        clients.append(again)
        again.send("CONNECT", {"accept-version": "1.2", "host": "/"})
        if again.recv().command == "CONNECTED":
            break
        assert time.monotonic() < deadline, "the place given back was never free again"
        time.sleep(0.1)


def test_a_restarted_gateway_forgets_its_dead_connections(
    start_broker: type[BrokerProcess], clients: list[RawClient]
) -> None:
    broker = start_broker("--gateways", "1", config=CONFIG)
    for _ in range(4):
        client = RawClient(broker.host, broker.port, source="127.0.0.7")
        clients.append(client)
        client.connect()
    victim = broker.workers()["gateway 0"]
    victim.kill()
    broker.wait_for_worker("gateway 0", not_pid=victim.pid)
    deadline = time.monotonic() + 15
    while True:  # until the new gateway listens
        try:
            clients.append(RawClient(broker.host, broker.port, source="127.0.0.8"))
            break
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, "the restarted gateway never listened"
            time.sleep(0.05)
    for _ in range(4):
        client = RawClient(broker.host, broker.port, source="127.0.0.7")
        clients.append(client)
        client.connect()
