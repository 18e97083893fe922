"""Protocol errors raised by the STOMP codec.

Every error is a :class:`ProtocolError`. Each one carries typed fields and builds its own
message from them, so ``str(error)`` is a complete sentence a gateway can put, unchanged, in
the ``message`` header of an ERROR frame. Values that came off the wire are shortened before
they go into a message so that a hostile client cannot make the ERROR frame huge.
"""

from __future__ import annotations

from typing import Any

# A client-supplied value quoted in an error message is cut to this many characters.
_SHOW_CHARS = 64


def _show(value: str | bytes) -> str:
    """Quote a wire value for an error message, shortened and with control characters visible."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if len(value) > _SHOW_CHARS:
        return repr(value[:_SHOW_CHARS]) + "..."
    return repr(value)


class ProtocolError(Exception):
    """The peer broke the STOMP protocol; the connection cannot continue.

    ``str(error)`` is a clear sentence, suitable for an ERROR frame's ``message`` header.
    """

    def _args(self) -> tuple[Any, ...]:
        return (str(self),)

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions pickle through ``self.args`` by default, which here holds only the
        # message; rebuild from the typed fields instead so errors survive a process hop.
        return (type(self), self._args())


class MalformedFrame(ProtocolError):
    """The bytes do not form a STOMP frame; ``reason`` says what is wrong."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"malformed frame: {reason}")

    def _args(self) -> tuple[Any, ...]:
        return (self.reason,)


class UnknownCommand(ProtocolError):
    """The frame's command is not one this side accepts."""

    def __init__(self, command: str) -> None:
        self.command = command
        super().__init__(f"unknown command {_show(command)}")

    def _args(self) -> tuple[Any, ...]:
        return (self.command,)


class FrameTooLarge(ProtocolError):
    """A frame is larger than ``FrameLimits.max_frame_bytes``.

    When the parser refuses a frame before it has all of it, ``at_least`` is true and
    ``size`` is a lower bound (the bytes buffered so far).
    """

    def __init__(self, size: int, limit: int, at_least: bool = False) -> None:
        self.size = size
        self.limit = limit
        self.at_least = at_least
        of = "at least " if at_least else ""
        super().__init__(f"frame of {of}{size} bytes exceeds max_frame_bytes {limit}")

    def _args(self) -> tuple[Any, ...]:
        return (self.size, self.limit, self.at_least)


class TooManyHeaders(ProtocolError):
    """A frame has more header lines than ``FrameLimits.max_headers``."""

    def __init__(self, count: int, limit: int) -> None:
        self.count = count
        self.limit = limit
        super().__init__(f"frame with {count} headers exceeds max_headers {limit}")

    def _args(self) -> tuple[Any, ...]:
        return (self.count, self.limit)


class HeaderTooLong(ProtocolError):
    """One header line is longer than ``FrameLimits.max_header_bytes``.

    ``at_least`` is true when the line was refused before its end arrived.
    """

    def __init__(self, size: int, limit: int, at_least: bool = False) -> None:
        self.size = size
        self.limit = limit
        self.at_least = at_least
        of = "at least " if at_least else ""
        super().__init__(f"header line of {of}{size} bytes exceeds max_header_bytes {limit}")

    def _args(self) -> tuple[Any, ...]:
        return (self.size, self.limit, self.at_least)


class BadHeaderEscape(ProtocolError):
    """A header holds a backslash sequence the negotiated version does not define.

    STOMP 1.2 says undefined escapes such as ``\\t`` MUST be a fatal protocol error.
    ``sequence`` is the offending text, e.g. ``"\\\\t"`` or a lone trailing ``"\\\\"``.
    """

    def __init__(self, sequence: str, version: str = "1.2") -> None:
        self.sequence = sequence
        self.version = version
        # Show the sequence as it appeared ('\t', not repr's '\\t') when that is safe to
        # print; repr only when it holds a control character such as a CR.
        shown = f"'{sequence}'" if sequence.isprintable() else _show(sequence)
        super().__init__(f"undefined escape sequence {shown} in a header (STOMP {version})")

    def _args(self) -> tuple[Any, ...]:
        return (self.sequence, self.version)
