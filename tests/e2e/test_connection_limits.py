"""Connections a client address may hold, and connections that have not completed CONNECT:
their own limits, counted over every gateway, so that idle sockets or one busy host cannot
take the broker's max_connections from everyone else."""

from __future__ import annotations

import time

import pytest

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


def refusal(client: RawClient) -> str:
    frames = client.recv_until_closed()
    assert [f.command for f in frames] == ["ERROR"], frames
    return frames[0].headers["message"]


def test_idle_sockets_make_room_for_new_clients(
    limited: BrokerProcess, clients: list[RawClient]
) -> None:
    # Idle sockets (two per address: below the per-address limit), more than the
    # connecting limit (6: 3 per gateway).
    idle = [RawClient(limited.host, limited.port, source=f"127.0.2.{n // 2}") for n in range(8)]
    clients += idle
    time.sleep(0.6)  # accepted by whichever gateway took each, and idle (silent 0.5 s)
    extra = RawClient(limited.host, limited.port, source="127.0.0.4")
    clients.append(extra)
    extra.connect()
    # The oldest idle sockets of each gateway made room: each gateway keeps 3 at most.
    # The others are dropped for sending no CONNECT.
    made_room = "connection closed to make room: max_connections_connecting 6 reached"
    messages = [refusal(client) for client in idle]
    assert set(messages) == {
        f"{made_room} before its CONNECT",
        "no CONNECT within connect_timeout_ms 3000",
    }, messages
    assert messages.count(f"{made_room} before its CONNECT") >= 2, messages
    limited.wait_for_log(
        r"closing 127\.0\.2\.\d:\d+ to make room for a new connection: "
        r"max_connections_connecting 6 reached, and it has not completed CONNECT"
    )


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
