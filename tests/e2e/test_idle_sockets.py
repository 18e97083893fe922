"""Idle sockets lock nobody out: sockets that never send CONNECT, opened by the thousand and
opened again as the broker closes them, while real clients connect one after another; the
oldest connection that has not completed CONNECT makes room for a new one (idle ones
first), over plain STOMP and in a WebSocket handshake; and `max_connections` still refuses
once clients through CONNECT hold every place."""

from __future__ import annotations

import selectors
import socket
import threading
import time

import pytest

from mpbroker.harness import BrokerProcess, RawClient
from tests.websocket import open_websocket, stomp_bytes

pytestmark = pytest.mark.slow

CONNECT = {"accept-version": "1.2", "host": "/"}


class Flood:
    """A thread that keeps `target` sockets open to a port and sends nothing on them; each
    one the broker closes (or refuses) is opened again at once, from one of 16 loopback
    addresses (so that ports to connect from never run out)."""

    def __init__(self, host: str, port: int, target: int) -> None:
        self.host, self.port, self.target = host, port, target
        self.opened = 0
        self.cut = 0
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flood", daemon=True)

    def __enter__(self) -> Flood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def wait(self, opened: int, cut: int, timeout: float = 15) -> None:
        """Until it has opened and seen cut that many sockets."""
        deadline = time.monotonic() + timeout
        while self.opened < opened or self.cut < cut:
            assert time.monotonic() < deadline, (
                f"flood: {self.opened} opened, {self.cut} cut, {self.failed} failed"
            )
            time.sleep(0.05)

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        live = 0
        try:
            while not self._stop.is_set():
                while live < self.target and not self._stop.is_set():
                    source = f"127.0.3.{self.opened % 16}"
                    try:
                        sock = socket.create_connection(
                            (self.host, self.port), timeout=2, source_address=(source, 0)
                        )
                    except OSError:
                        self.failed += 1
                        break
                    sock.setblocking(False)
                    selector.register(sock, selectors.EVENT_READ)
                    live += 1
                    self.opened += 1
                # Closed by the broker (an ERROR, or the end of the stream): open another.
                for key, _ in selector.select(timeout=0.01):
                    selector.unregister(key.fileobj)
                    key.fileobj.close()  # type: ignore[union-attr]
                    live -= 1
                    self.cut += 1
        finally:
            for key in list(selector.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            selector.close()


def connect(broker: BrokerProcess, clients: list[RawClient], source: str | None = None) -> str:
    """A real client's CONNECT: the command of the answer (the ERROR's message if it is
    one). The client stays open."""
    client = RawClient(broker.host, broker.port, source=source)
    clients.append(client)
    client.send("CONNECT", CONNECT)
    frame = client.recv()
    return frame.command if frame.command == "CONNECTED" else frame.headers.get("message", "")


def test_thousands_of_idle_sockets_lock_no_client_out(
    start_broker: type[BrokerProcess], clients: list[RawClient]
) -> None:
    # The default settings: max_connections_connecting 1000 (500 per gateway). The flood
    # keeps more open, opening another for each the broker closes. (Not many more: those
    # the broker has not accepted yet wait in the kernel's queue, ahead of real clients.)
    broker = start_broker("--gateways", "2")
    with Flood(broker.host, broker.port, target=1200) as flood:
        flood.wait(opened=1200, cut=200)
        # Real clients, one after another, while thousands more idle sockets come.
        answers = []
        deadline = time.monotonic() + 30
        while len(answers) < 50 or flood.opened < 4000:
            assert time.monotonic() < deadline, f"{flood.opened} opened, {len(answers)} clients"
            answers.append(connect(broker, clients))
    refused = [a for a in answers if a != "CONNECTED"]
    assert not refused, f"{len(refused)} of {len(answers)} clients were not let in: {refused[:3]}"
    broker.wait_for_log(
        r"closing 127\.0\.3\.\d+:\d+ to make room for a new connection: "
        r"max_connections_connecting 1000 reached, and it has not completed CONNECT"
    )
    # They are connected: a SEND with a receipt goes through.
    clients[-1].send("SEND", {"destination": "/queue/idle", "receipt": "r"}, b"x")
    clients[-1].expect("RECEIPT", "r")


def test_idle_sockets_cannot_fill_a_small_broker(
    start_broker: type[BrokerProcess], clients: list[RawClient]
) -> None:
    # max_connections 50: the connecting limit (1000 as set) is 25 here, 12 per gateway.
    broker = start_broker("--gateways", "2", config="[broker]\nmax_connections = 50\n")
    with Flood(broker.host, broker.port, target=150) as flood:
        flood.wait(opened=150, cut=100)
        # Every place, one client after another, each staying connected.
        answers = [connect(broker, clients) for _ in range(50)]
        assert answers == ["CONNECTED"] * 50, [a for a in answers if a != "CONNECTED"][:3]
        # Clients through CONNECT hold every place: refusing is right.
        assert connect(broker, clients) == "connection refused: max_connections 50 reached"
        # One leaves: its place is taken again (once its gateway saw it go).
        clients[0].close()
        deadline = time.monotonic() + 10
        while (answer := connect(broker, clients)) != "CONNECTED":
            assert answer == "connection refused: max_connections 50 reached", answer
            assert time.monotonic() < deadline, "the place given back was never free again"
            time.sleep(0.05)
    broker.wait_for_log(r"closing 127\.0\.3\.\d+:\d+ to make room for a new connection")


def test_the_oldest_silent_connection_makes_room(
    start_broker: type[BrokerProcess], clients: list[RawClient]
) -> None:
    # One gateway: its share is the whole limit, 2, and the order is exact.
    broker = start_broker("--gateways", "1", config="[broker]\nmax_connections_connecting = 2\n")

    def open_idle(data: bytes = b"") -> RawClient:
        client = RawClient(broker.host, broker.port)
        clients.append(client)
        if data:
            client.send_bytes(data)
        time.sleep(0.6)  # accepted, and idle (silent for 0.5 s) if it sent nothing
        return client

    a, b = open_idle(), open_idle()
    # Sent part of a CONNECT (a slow client, or slowloris): it has spoken.
    slow = open_idle(b"CONNECT\naccept-version:1.2\n")
    c = open_idle()
    for gone in (a, b):
        [error] = gone.recv_until_closed()
        assert error.headers["message"] == (
            "connection closed to make room: max_connections_connecting 2 reached before its "
            "CONNECT"
        )
        assert "Send CONNECT as soon as the connection is open" in error.body.decode()
    # A real client: the idle socket goes, the one that has spoken stays.
    assert connect(broker, clients) == "CONNECTED"
    assert c.recv_until_closed()[0].command == "ERROR"
    slow.assert_no_frame(0.3)
    # Two that have spoken hold the share: a socket that has said nothing is refused
    # rather than push one of them out; one that has spoken pushes out the oldest.
    slower = open_idle(b"CONN")
    silent = RawClient(broker.host, broker.port)
    clients.append(silent)
    assert [f.headers["message"] for f in silent.recv_until_closed()] == [
        "connection refused: max_connections_connecting 2 reached"
    ]
    assert connect(broker, clients) == "CONNECTED"
    assert slow.recv_until_closed()[0].headers["message"].startswith("connection closed to make")
    slower.assert_no_frame(0.3)
    broker.wait_for_log(
        r"closing 127\.0\.0\.1:\d+ to make room for a new connection: "
        r"max_connections_connecting 2 reached"
    )


def test_an_idle_websocket_handshake_makes_room(start_broker: type[BrokerProcess]) -> None:
    broker = start_broker(
        "--gateways",
        "1",
        config="[broker]\nmax_connections_connecting = 2\n[stomp]\nws_port = 0\n",
    )
    idle = []
    for _ in range(4):  # connected to the WebSocket port, no HTTP request
        idle.append(socket.create_connection((broker.host, broker.ws_port), timeout=5))
        time.sleep(0.6)  # idle once silent for 0.5 s
    try:
        with open_websocket(broker.host, broker.ws_port) as client:
            client.send(stomp_bytes("CONNECT", CONNECT))
            [frame] = client.frames(1)
            assert frame.command == "CONNECTED", frame
        # The three oldest were closed in their handshake (no HTTP answer: nothing came).
        for sock in idle[:3]:
            assert sock.recv(100) == b""
        idle[3].settimeout(0.3)
        with pytest.raises(TimeoutError):
            idle[3].recv(100)
    finally:
        for sock in idle:
            sock.close()
