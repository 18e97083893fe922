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
    "StampedTemplate",
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
# How a template stamps the sequence number: zero-padded to its fixed width.
_SEQ_FORMAT = b"%0" + str(_SEQ_DIGITS).encode() + b"d"
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


def _escaped(data: bytes) -> bytes:
    """``data`` as literal text of a ``%`` format."""
    return data.replace(b"%", b"%%")


class StampedTemplate:
    """What :class:`SendTemplate` and :class:`KeyedSendTemplate` share: the headers and body
    of one producer's SEND frames, a frame encoded once and split at its sequence number
    (:meth:`_encode_first`), batches stamped from ``self._format`` with one ``%`` each
    (:meth:`frames`, the values from :meth:`_stamps`), and the rare frame that asks for a
    RECEIPT (:meth:`frame_with_receipt`, its headers from :meth:`_headers_of`).

    ``headers`` come first, in order, then ``persistent:true`` if asked for. A subclass sets
    ``self._format`` and ``self.frame_bytes``.
    """

    _format: bytes
    frame_bytes: int

    def __init__(
        self, headers: dict[str, str], *, persistent: bool, token: bytes, producer: int, size: int
    ) -> None:
        self.headers = headers
        if persistent:
            self.headers["persistent"] = "true"
        self.token = token
        self.producer = producer
        self.size = size
        self._batch_formats: dict[int, bytes] = {}

    def _encode_first(self, headers: dict[str, str]) -> tuple[bytes, bytes, bytes]:
        """Message 0 with ``headers``, encoded: the frame, the bytes before its sequence number
        and the bytes after it."""
        body = make_body(self.token, self.producer, 0, self.size)
        frame = encode_frame(Frame("SEND", headers, body))
        # The body ends the frame, just before its NUL; the sequence sits at a fixed offset.
        seq_at = len(frame) - 1 - len(body) + BODY_HEADER_BYTES - 1 - _SEQ_DIGITS
        return frame, frame[:seq_at], frame[seq_at + _SEQ_DIGITS :]

    def _stamps(self, start: int, stop: int) -> tuple[int, ...]:
        """The values ``self._format * (stop - start)`` takes for messages ``start .. stop-1``."""
        return tuple(range(start, stop))

    def _headers_of(self, seq: int) -> dict[str, str]:
        """The headers of message ``seq``."""
        return self.headers

    def frames(self, start: int, stop: int) -> bytes:
        """SEND frames for sequence numbers ``start`` to ``stop - 1``, back to back."""
        n = stop - start
        fmt = self._batch_formats.get(n)
        if fmt is None:
            if len(self._batch_formats) > 8:
                self._batch_formats.clear()
            fmt = self._batch_formats[n] = self._format * n
        return fmt % self._stamps(start, stop)

    def frame_with_receipt(self, seq: int, receipt: str) -> bytes:
        """One SEND frame that asks for a RECEIPT (rare enough to encode from scratch)."""
        headers = {**self._headers_of(seq), "receipt": receipt}
        body = make_body(self.token, self.producer, seq, self.size)
        return encode_frame(Frame("SEND", headers, body))


class SendTemplate(StampedTemplate):
    """The SEND frames of one producer: encoded once, stamped with each sequence number.

    ``encode_frame`` costs about a microsecond per frame; stamping a pre-encoded frame with
    ``%`` costs a tenth of that, and a whole batch is one formatting call in C.
    """

    def __init__(
        self, destination: str, *, persistent: bool, token: bytes, producer: int, size: int
    ) -> None:
        super().__init__(
            {"destination": destination},
            persistent=persistent,
            token=token,
            producer=producer,
            size=size,
        )
        frame, before, after = self._encode_first(dict(self.headers))
        self._format = _escaped(before) + _SEQ_FORMAT + _escaped(after)
        self.frame_bytes = len(frame)


class KeyedSendTemplate(StampedTemplate):
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
        super().__init__(
            {"destination": destination, key_header: "", **headers},
            persistent=persistent,
            token=token,
            producer=producer,
            size=size,
        )
        marked = {**self.headers, key_header: key_prefix + self._MARK}
        frame, head, tail = self._encode_first(marked)
        mark = self._MARK.encode()
        if head.count(mark) != 1:
            raise ValueError(f"{self._MARK} may not appear in the headers")
        before, after = head.split(mark)
        self._format = _escaped(before) + b"%d" + _escaped(after) + _SEQ_FORMAT + _escaped(tail)
        #: The size of a frame with a one-digit key (others are a few bytes longer).
        self.frame_bytes = len(frame) - len(mark) + 1

    def _stamps(self, start: int, stop: int) -> tuple[int, ...]:
        """Per message, its key and its sequence number."""
        values: list[int] = [0] * (2 * (stop - start))
        keys = self.keys
        values[0::2] = [seq % keys for seq in range(start, stop)]
        values[1::2] = range(start, stop)
        return tuple(values)

    def _headers_of(self, seq: int) -> dict[str, str]:
        return {**self.headers, self.key_header: f"{self.key_prefix}{seq % self.keys}"}


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
