"""The bytes the load generator puts on the wire.

Frames are built with :mod:`mpbroker.stomp` and sent with :class:`mpbroker.harness.RawClient`;
this module adds what a load generator needs on top: a SEND frame encoded once and stamped
with a sequence number many times, the layout of message bodies, and a write that says why
the server refused it.
"""

from __future__ import annotations

from mpbroker.harness import BrokerClosed, FrameTimeout, RawClient, StompError
from mpbroker.stomp import Frame, ProtocolError, encode_frame

__all__ = [
    "BODY_HEADER_BYTES",
    "KeyedSendTemplate",
    "SendTemplate",
    "body_prefix",
    "make_body",
    "send_explained",
]

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


class KeyedSendTemplate:
    """SEND frames whose ``key_header`` is ``<key_prefix><seq % keys>``: like
    :class:`SendTemplate`, with a second stamp for the header (the filter study's ``ID``).

    ``headers`` go after ``destination`` and the key header, in order.
    """

    _MARK = "{KEY}"

    def __init__(
        self,
        destination: str,
        *,
        key_header: str,
        key_prefix: str,
        keys: int,
        headers: dict[str, str],
        persistent: bool,
        token: bytes,
        producer: int,
        size: int,
    ) -> None:
        if keys < 1:
            raise ValueError(f"keys must be at least 1, got {keys}")
        self.key_header = key_header
        self.key_prefix = key_prefix
        self.keys = keys
        self.headers = {"destination": destination, key_header: "", **headers}
        if persistent:
            self.headers["persistent"] = "true"
        self.token = token
        self.producer = producer
        self.size = size
        body = make_body(token, producer, 0, size)
        marked = {**self.headers, key_header: key_prefix + self._MARK}
        frame = encode_frame(Frame("SEND", marked, body))
        seq_at = len(frame) - 1 - len(body) + BODY_HEADER_BYTES - 1 - _SEQ_DIGITS
        head = frame[:seq_at]
        mark = self._MARK.encode()
        if head.count(mark) != 1:
            raise ValueError(f"{self._MARK} may not appear in the headers")
        before, after = head.split(mark)
        tail = frame[seq_at + _SEQ_DIGITS :]
        self._format = (
            before.replace(b"%", b"%%")
            + b"%d"
            + after.replace(b"%", b"%%")
            + b"%0"
            + str(_SEQ_DIGITS).encode()
            + b"d"
            + tail.replace(b"%", b"%%")
        )
        #: The size of a frame with a one-digit key (others are a few bytes longer).
        self.frame_bytes = len(frame) - len(mark) + 1
        self._batch_formats: dict[int, bytes] = {}

    def frames(self, start: int, stop: int) -> bytes:
        """SEND frames for sequence numbers ``start`` to ``stop - 1``, back to back."""
        n = stop - start
        fmt = self._batch_formats.get(n)
        if fmt is None:
            if len(self._batch_formats) > 8:
                self._batch_formats.clear()
            fmt = self._batch_formats[n] = self._format * n
        values: list[int] = [0] * (2 * n)
        keys = self.keys
        values[0::2] = [seq % keys for seq in range(start, stop)]
        values[1::2] = range(start, stop)
        return fmt % tuple(values)

    def frame_with_receipt(self, seq: int, receipt: str) -> bytes:
        """One SEND frame that asks for a RECEIPT."""
        headers = {
            **self.headers,
            self.key_header: f"{self.key_prefix}{seq % self.keys}",
            "receipt": receipt,
        }
        body = make_body(self.token, self.producer, seq, self.size)
        return encode_frame(Frame("SEND", headers, body))


def send_explained(conn: RawClient, data: bytes) -> None:
    """Write ``data``; if the write fails, say why.

    A server that refuses a frame sends ERROR and closes; the write then fails with EPIPE or
    ECONNRESET. The ERROR says why: raise its :class:`StompError` if it arrives within a
    moment, else :class:`BrokerClosed`.
    """
    try:
        conn.send_bytes(data)
    except OSError as exc:
        try:
            frames = conn.recv_until_closed(_ERROR_GRACE_S)
        except (FrameTimeout, OSError, ProtocolError):
            frames = conn.pending
        for frame in frames:
            if frame.command == "ERROR":
                raise StompError(frame) from exc
        raise BrokerClosed(f"the server closed the connection ({exc})") from exc
