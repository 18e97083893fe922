"""The bytes the load generator puts on the wire, and a minimal blocking STOMP connection.

Frames are built and parsed with :mod:`mpbroker.stomp`; this module only adds what a load
generator needs on top: a SEND frame encoded once and stamped with a sequence number many
times, the layout of message bodies, and a socket that reads big chunks.
"""

from __future__ import annotations

import select
import socket
import time

from mpbroker.stomp import SERVER_COMMANDS, Frame, FrameParser, ProtocolError, encode_frame

__all__ = [
    "BODY_HEADER_BYTES",
    "RECV_BYTES",
    "BrokerClosed",
    "Connection",
    "SendTemplate",
    "StompError",
    "body_prefix",
]

#: Bytes of one socket read. Large reads are the lever on the receiving side: one system call
#: and one parser call cover hundreds of frames.
RECV_BYTES = 256 * 1024

# Body layout: "<run token>:<producer, 5 digits>:<sequence, 10 digits>:" then padding. The
# run token keeps messages left over from an earlier run (on a long-lived broker) out of the
# tally; fixed widths let a consumer slice the numbers out without searching.
_TOKEN_BYTES = 8
_PRODUCER_DIGITS = 5
_SEQ_DIGITS = 10
#: The smallest body that holds the run token, the producer id and the sequence number.
BODY_HEADER_BYTES = _TOKEN_BYTES + 1 + _PRODUCER_DIGITS + 1 + _SEQ_DIGITS + 1
_PADDING = b"."
# After a failed write: how long to wait for the ERROR frame that explains it.
_ERROR_GRACE_S = 0.5


class StompError(Exception):
    """The server sent an ERROR frame; the message is its ``message`` header (and body)."""

    def __init__(self, frame: Frame) -> None:
        message = frame.headers.get("message", "(no message header)")
        detail = frame.body.decode("utf-8", "replace").strip()
        super().__init__(f"{message}: {detail}" if detail else message)


class BrokerClosed(Exception):
    """The server closed the connection."""


def body_prefix(token: bytes) -> bytes:
    """The bytes every body of run ``token`` starts with; producer and sequence follow."""
    if len(token) != _TOKEN_BYTES:
        raise ValueError(f"run token must be {_TOKEN_BYTES} bytes, got {len(token)}")
    return token + b":"


def make_body(token: bytes, producer: int, seq: int, size: int) -> bytes:
    """The body of message ``seq`` of ``producer``, padded to ``size`` bytes."""
    if size < BODY_HEADER_BYTES:
        raise ValueError(f"message size {size} is below the {BODY_HEADER_BYTES}-byte minimum")
    head = b"%s%05d:%010d:" % (body_prefix(token), producer, seq)
    return head + _PADDING * (size - len(head))


class SendTemplate:
    """The SEND frames of one producer: encoded once, stamped with each sequence number.

    ``encode_frame`` costs about a microsecond per frame; stamping a pre-encoded frame with
    ``%`` costs a tenth of that, and a whole batch is one formatting call in C.
    """

    def __init__(
        self, destination: str, *, persistent: bool, token: bytes, producer: int, size: int
    ) -> None:
        self.headers = {"destination": destination}
        if persistent:
            self.headers["persistent"] = "true"
        self.token = token
        self.producer = producer
        self.size = size
        body = make_body(token, producer, 0, size)
        frame = encode_frame(Frame("SEND", dict(self.headers), body))
        # The body ends the frame, just before its NUL; the sequence sits at a fixed offset.
        seq_at = len(frame) - 1 - len(body) + BODY_HEADER_BYTES - 1 - _SEQ_DIGITS
        before = frame[:seq_at].replace(b"%", b"%%")
        after = frame[seq_at + _SEQ_DIGITS :].replace(b"%", b"%%")
        self._format = before + b"%0" + str(_SEQ_DIGITS).encode() + b"d" + after
        self.frame_bytes = len(frame)
        self._batch_formats: dict[int, bytes] = {}

    def frames(self, start: int, stop: int) -> bytes:
        """SEND frames for sequence numbers ``start`` to ``stop - 1``, back to back."""
        n = stop - start
        fmt = self._batch_formats.get(n)
        if fmt is None:
            if len(self._batch_formats) > 8:
                self._batch_formats.clear()
            fmt = self._batch_formats[n] = self._format * n
        return fmt % tuple(range(start, stop))

    def frame_with_receipt(self, seq: int, receipt: str) -> bytes:
        """One SEND frame that asks for a RECEIPT (rare enough to encode from scratch)."""
        headers = {**self.headers, "receipt": receipt}
        body = make_body(self.token, self.producer, seq, self.size)
        return encode_frame(Frame("SEND", headers, body))


class Connection:
    """A blocking client socket plus a parser: just enough STOMP for load generation."""

    def __init__(self, host: str, port: int, *, timeout_s: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        # Frames are written in big batches already; Nagle would only delay the small
        # ones (a lone ACK, a DISCONNECT) by a delayed-ACK round trip.
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(None)
        self.parser = FrameParser(commands=SERVER_COMMANDS)
        self.timeout_s = timeout_s
        # Frames read by expect() while it waited for another one; read() returns them first.
        self.held: list[Frame] = []

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            # A server that refuses a frame sends ERROR and closes; the write then fails
            # with EPIPE or ECONNRESET. The ERROR says why, so look for it before failing.
            self._raise_pending_error()
            raise BrokerClosed(f"the server closed the connection ({exc})") from exc

    def send_frame(self, frame: Frame) -> None:
        self.send(encode_frame(frame))

    def _raise_pending_error(self) -> None:
        try:
            while (frames := self.read(_ERROR_GRACE_S)) is not None:
                for frame in frames:
                    if frame.command == "ERROR":
                        raise StompError(frame)
        except (OSError, BrokerClosed, ProtocolError):
            pass

    def read(self, timeout_s: float | None) -> list[Frame] | None:
        """Frames from one read of up to :data:`RECV_BYTES`; None if none came in time.

        Frames :meth:`expect` set aside come first. ``timeout_s`` 0 polls, None blocks.
        Raises :class:`BrokerClosed` at end of stream.
        """
        if self.held:
            frames, self.held = self.held, []
            return frames
        if timeout_s is not None:
            ready, _, _ = select.select([self.sock], [], [], timeout_s)
            if not ready:
                return None
        data = self.sock.recv(RECV_BYTES)
        if not data:
            raise BrokerClosed("the server closed the connection")
        return self.parser.feed(data)

    def connect(self) -> Frame:
        """CONNECT (STOMP 1.2, no heart-beats) and wait for CONNECTED."""
        self.send_frame(
            Frame(
                "CONNECT",
                {"accept-version": "1.2", "host": "localhost", "heart-beat": "0,0"},
            )
        )
        return self.expect("CONNECTED")

    def expect(self, command: str, receipt: str | None = None) -> Frame:
        """Read until a ``command`` frame (with ``receipt-id`` ``receipt``) arrives.

        Raises :class:`StompError` on an ERROR frame and ``TimeoutError`` after the
        connection's timeout. Other frames (a MESSAGE that overtook a RECEIPT) are held for
        the next :meth:`read`.
        """
        deadline = time.monotonic() + self.timeout_s
        held: list[Frame] = []
        try:
            while True:
                left = deadline - time.monotonic()
                frames = self.read(max(0.0, left))
                if frames is None:
                    what = f"RECEIPT {receipt!r}" if receipt else command
                    raise TimeoutError(f"no {what} from the server within {self.timeout_s:g} s")
                for at, frame in enumerate(frames):
                    if frame.command == "ERROR":
                        raise StompError(frame)
                    if frame.command == command and (
                        receipt is None or frame.headers.get("receipt-id") == receipt
                    ):
                        held += frames[at + 1 :]
                        return frame
                    held.append(frame)
        finally:
            self.held = held + self.held

    def disconnect(self) -> None:
        """DISCONNECT with a receipt, so everything sent before (ACKs) was handled."""
        self.send_frame(Frame("DISCONNECT", {"receipt": "bye"}))
        self.expect("RECEIPT", "bye")
