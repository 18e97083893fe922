"""A scriptable fake STOMP server for the client tests.

The broker is not what these tests are about: this server speaks just enough STOMP, through
the project's codec, for a test to script the server's side of a conversation and to look at
every frame the client sent. One thread accepts; one thread per client reads and answers.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from mpbroker.stomp import CLIENT_COMMANDS, HEARTBEAT_BYTES, Frame, FrameParser, encode_frame

WAIT_S = 5.0  # generous upper bound for anything a test waits on; tests pass in far less


class FakeClient:
    """The server's side of one accepted connection."""

    def __init__(self, server: FakeServer, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.send_lock = threading.Lock()
        self.stop = threading.Event()
        self.version = "1.2"

    def send_frame(self, frame: Frame) -> None:
        self.send_raw(encode_frame(frame, version=self.version))

    def send_raw(self, data: bytes) -> None:
        # The client may be gone already; the test notices that on the client's side.
        with self.send_lock, contextlib.suppress(OSError):
            self.sock.sendall(data)

    def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


class FakeServer:
    """Answers CONNECT, receipts and DISCONNECT; everything else is up to the test.

    Attributes a test may set before the client connects:
    ``version`` and ``heartbeat`` (the CONNECTED headers), ``connected_headers`` (extra
    ones), ``connect_error`` (answer CONNECT with this ERROR message instead),
    ``answer_connect`` (False: stay silent), ``auto_receipt`` (False: never send RECEIPT),
    ``heartbeat_every_s`` (send a heart-beat this often after CONNECTED).
    """

    def __init__(self) -> None:
        self.version = "1.2"
        self.heartbeat = "0,0"
        self.connected_headers: dict[str, str] = {}
        self.connect_error: str | None = None
        self.answer_connect = True
        self.auto_receipt = True
        self.heartbeat_every_s: float | None = None

        self.frames: list[Frame] = []
        self.heartbeats_received = 0
        self.clients: list[FakeClient] = []
        self._cond = threading.Condition()
        self._ids = itertools.count(1)
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._accept_thread = threading.Thread(target=self._accept_loop, name="fake-stomp-accept")

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._accept_thread.start()

    def stop(self) -> None:
        # shutdown() wakes the accept() and recv() calls blocked in our threads; close()
        # alone would not.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._accept_thread.join(WAIT_S)
        for client in list(self.clients):
            client.close()
        for thread in list(self._threads):
            thread.join(WAIT_S)
        leftover = [t.name for t in [*self._threads, self._accept_thread] if t.is_alive()]
        assert not leftover, f"fake server threads did not stop: {leftover}"

    # --- what the client sent --------------------------------------------------------------

    def wait_until(self, predicate: Callable[[], bool], timeout: float = WAIT_S) -> None:
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise AssertionError(f"timed out after {timeout} s waiting for the client")

    def wait_for_frame(self, command: str, timeout: float = WAIT_S, count: int = 1) -> Frame:
        """Wait until the client sent ``count`` frames of ``command``; return the last one."""
        self.wait_until(lambda: len(self.frames_of(command)) >= count, timeout)
        return self.frames_of(command)[count - 1]

    def frames_of(self, command: str) -> list[Frame]:
        with self._cond:
            return [f for f in self.frames if f.command == command]

    @property
    def client(self) -> FakeClient:
        """The most recently accepted client."""
        self.wait_until(lambda: bool(self.clients))
        return self.clients[-1]

    # --- scripted server frames ------------------------------------------------------------

    def deliver(
        self,
        destination: str,
        body: bytes = b"",
        *,
        subscription: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> str:
        """Send a MESSAGE; return its message-id. The subscription id and ack mode are taken
        from the client's last SUBSCRIBE to ``destination`` unless ``subscription`` is given."""
        subscribe = [
            f for f in self.frames_of("SUBSCRIBE") if f.headers["destination"] == destination
        ]
        sub_id = subscription
        ack_mode = "auto"
        if subscribe:
            sub_id = sub_id or subscribe[-1].headers["id"]
            ack_mode = subscribe[-1].headers.get("ack", "auto")
        assert sub_id is not None, f"no SUBSCRIBE to {destination} yet"
        n = next(self._ids)
        message_id = f"msg-{n}"
        frame_headers = {
            "destination": destination,
            "message-id": message_id,
            "subscription": sub_id,
        }
        if ack_mode != "auto":
            frame_headers["ack"] = f"ack-{n}"
        frame_headers.update(headers or {})
        self.client.send_frame(Frame("MESSAGE", frame_headers, body))
        return message_id

    def send_error(
        self, message: str, body: bytes = b"", *, receipt_id: str | None = None, close: bool = True
    ) -> None:
        headers = {"message": message}
        if receipt_id is not None:
            headers["receipt-id"] = receipt_id
        client = self.client
        client.send_frame(Frame("ERROR", headers, body))
        if close:
            client.close()

    # --- the server threads ----------------------------------------------------------------

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            client = FakeClient(self, sock)
            thread = threading.Thread(target=self._serve, args=(client,), name="fake-stomp-client")
            with self._cond:
                self.clients.append(client)
                self._threads.append(thread)
                self._cond.notify_all()
            thread.start()

    def _serve(self, client: FakeClient) -> None:
        parser = FrameParser(commands=CLIENT_COMMANDS)
        try:
            while not client.stop.is_set():
                data = client.sock.recv(65536)
                if not data:
                    return
                if not data.strip(b"\r\n"):
                    with self._cond:
                        self.heartbeats_received += data.count(HEARTBEAT_BYTES)
                        self._cond.notify_all()
                for frame in parser.feed(data):
                    with self._cond:
                        self.frames.append(frame)
                        self._cond.notify_all()
                    self._answer(client, parser, frame)
        except OSError:
            return
        finally:
            client.stop.set()
            client.sock.close()
            with self._cond:
                self._cond.notify_all()  # for tests waiting to see the client gone

    def _answer(self, client: FakeClient, parser: FrameParser, frame: Frame) -> None:
        headers = frame.headers
        if frame.command in ("CONNECT", "STOMP"):
            if not self.answer_connect:
                return
            if self.connect_error is not None:
                client.send_frame(Frame("ERROR", {"message": self.connect_error}, b"go away"))
                client.close()
                return
            connected = {"version": self.version, "heart-beat": self.heartbeat, "server": "fake/1"}
            connected.update(self.connected_headers)
            client.send_frame(Frame("CONNECTED", connected, b""))
            client.version = self.version
            parser.version = self.version
            if self.heartbeat_every_s is not None:
                thread = threading.Thread(
                    target=self._beat, args=(client, self.heartbeat_every_s), name="fake-stomp-beat"
                )
                with self._cond:
                    self._threads.append(thread)
                thread.start()
            return
        if "receipt" in headers and self.auto_receipt:
            client.send_frame(Frame("RECEIPT", {"receipt-id": headers["receipt"]}, b""))
        if frame.command == "DISCONNECT":
            client.close()

    def _beat(self, client: FakeClient, every_s: float) -> None:
        while not client.stop.wait(every_s):
            client.send_raw(HEARTBEAT_BYTES)


def _client_threads(wait_s: float) -> list[str]:
    """Names of the client's threads still alive after up to ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = [t.name for t in threading.enumerate() if t.name.startswith("stomp-")]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    srv = FakeServer()
    srv.start()
    try:
        yield srv
        # Checked while the server is still up: a connection the test forgot to close would
        # keep its reader thread alive here, where stopping the server would end it quietly.
        # The short wait is for readers ending on their own after the server closed.
        alive = _client_threads(wait_s=2.0)
        assert not alive, f"client threads left running: {alive}"
    finally:
        srv.stop()
