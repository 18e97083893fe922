"""A raw, blocking STOMP client: a bare socket speaking frames through the codec.

Tests use it for exact and malformed input; the load generator for pipelined frames. It adds
nothing the server did not ask for: no heart-beats, no acknowledgements, no retries.
"""

from __future__ import annotations

import select
import socket
import time

from mpbroker.stomp import SERVER_COMMANDS, Frame, FrameParser, encode_frame

#: Bytes of one socket read. Large reads are the lever on the receiving side: one system call
#: and one parser call cover hundreds of frames.
RECV_BYTES = 256 * 1024


class StompError(AssertionError):
    """The server sent an ERROR frame where another was expected; the message is its
    ``message`` header (and body), the frame is :attr:`frame`."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame
        message = frame.headers.get("message", "(no message header)")
        detail = frame.body.decode("utf-8", "replace").strip()
        super().__init__(f"{message}: {detail}" if detail else message)


class FrameTimeout(AssertionError):
    """A frame that was waited for did not arrive in time."""


class BrokerClosed(ConnectionError):
    """The server closed the connection."""


class RawClient:
    """A STOMP connection on a blocking socket, to send exact bytes and read what comes.

    ``timeout`` bounds the TCP connect and is how long :meth:`recv`, :meth:`expect` and the
    other waits wait unless told otherwise. ``send_timeout`` bounds one write (None: a write
    waits as long as the server does not read). Frames are parsed as they arrive; those
    read but not returned yet wait in :attr:`pending`.
    """

    def __init__(
        self,
        host: str,
        port: int,
        timeout: float = 10.0,
        *,
        send_timeout: float | None = 10.0,
        source: str | None = None,
    ) -> None:
        # `source`: the local address to connect from (127.0.0.2, say: another client
        # address on loopback).
        address = None if source is None else (source, 0)
        self.sock = socket.create_connection((host, port), timeout=timeout, source_address=address)
        # Frames go out whole or in big batches already; Nagle would only delay the small
        # ones (a lone ACK, a DISCONNECT) by a delayed-ACK round trip.
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(send_timeout)
        self._poll = select.poll()
        self._poll.register(self.sock, select.POLLIN)
        self.parser = FrameParser(commands=SERVER_COMMANDS)
        self.timeout = timeout
        #: Frames read from the socket that no call returned yet, oldest first.
        self.pending: list[Frame] = []

    def close(self) -> None:
        self.sock.close()

    # -- sending ----------------------------------------------------------------------------

    def send_bytes(self, data: bytes) -> None:
        """Write ``data`` as it is (OSError if the server closed the connection)."""
        self.sock.sendall(data)

    def send(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        """Write one frame."""
        self.send_bytes(encode_frame(Frame(command, dict(headers or {}), body)))

    def connect(self, **headers: str) -> Frame:
        """CONNECT (STOMP 1.2, plus ``headers``) and the CONNECTED frame that answers it."""
        self.send("CONNECT", {"accept-version": "1.2", "host": "/", **headers})
        return self.expect("CONNECTED")

    def disconnect(self) -> None:
        """DISCONNECT with a receipt, and wait for it: everything sent before was handled."""
        self.send("DISCONNECT", {"receipt": "bye"})
        self.expect("RECEIPT", "bye")

    # -- receiving --------------------------------------------------------------------------

    def _fill(self, timeout: float | None) -> bool:
        """One read of up to :data:`RECV_BYTES` into :attr:`pending`, waiting up to
        ``timeout`` seconds (None: no limit) for data; False if none came. Raises
        :class:`BrokerClosed` at the end of the stream."""
        wait_ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
        if not self._poll.poll(wait_ms):
            return False
        data = self.sock.recv(RECV_BYTES)
        if not data:
            raise BrokerClosed("connection closed by the server")
        self.pending += self.parser.feed(data)
        return True

    def read(self, timeout: float | None) -> list[Frame] | None:
        """Every pending frame, or else the frames of one read from the socket (possibly
        none: part of a frame); None if nothing came within ``timeout`` seconds (0 polls,
        None waits as long as it takes). :class:`BrokerClosed` at the end of the stream."""
        if not self.pending and not self._fill(timeout):
            return None
        frames, self.pending = self.pending, []
        return frames

    def recv(self, timeout: float | None = None) -> Frame:
        """The next frame; :class:`FrameTimeout` if none comes within ``timeout`` seconds
        (default: the client's), :class:`BrokerClosed` if the connection closes first."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not self.pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FrameTimeout(f"no frame within {timeout:g} s")
            self._fill(remaining)
        return self.pending.pop(0)

    def expect(
        self, command: str, receipt: str | None = None, timeout: float | None = None
    ) -> Frame:
        """Read until a ``command`` frame (with ``receipt-id`` ``receipt``) arrives.

        :class:`StompError` on an ERROR frame, :class:`FrameTimeout` if none comes within
        ``timeout`` seconds (default: the client's). Frames that came before it (a MESSAGE
        that overtook a RECEIPT) stay pending, for the next read.
        """
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        passed: list[Frame] = []
        try:
            while True:
                frames = self.read(max(0.0, deadline - time.monotonic()))
                if frames is None:
                    what = f"RECEIPT {receipt!r}" if receipt else command
                    raise FrameTimeout(f"no {what} from the server within {timeout:g} s")
                for at, frame in enumerate(frames):
                    if frame.command == "ERROR":
                        raise StompError(frame)
                    if frame.command == command and (
                        receipt is None or frame.headers.get("receipt-id") == receipt
                    ):
                        passed += frames[at + 1 :]
                        return frame
                    passed.append(frame)
        finally:
            self.pending[:0] = passed

    def recv_until_closed(self, timeout: float | None = None) -> list[Frame]:
        """Every frame until the server closes the connection; :class:`FrameTimeout` if it
        does not within ``timeout`` seconds (default: the client's)."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FrameTimeout(
                    f"connection not closed within {timeout:g} s; got {self.pending}"
                )
            try:
                self._fill(remaining)
            except (BrokerClosed, ConnectionResetError):
                frames, self.pending = self.pending, []
                return frames

    def assert_no_frame(self, timeout: float = 0.5) -> None:
        """Pass if no frame arrives within ``timeout`` seconds; else AssertionError with the
        frame that did (which stays pending). :class:`BrokerClosed` if the connection
        closes meanwhile."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._fill(remaining)
        raise AssertionError(f"expected no frame within {timeout:g} s, got {self.pending[0]}")
