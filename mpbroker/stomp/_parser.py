"""The incremental frame parser: bytes in, :class:`Frame` objects out.

The parser owns a buffer and knows nothing of sockets, so the gateway feeds it whatever the
transport delivered and acts on the frames it returns (h11's ``receive_data``/``next_event``
shape, folded into one call because STOMP has no streaming bodies).

Speed matters: every frame a client sends passes through :meth:`FrameParser.feed`. The work
per frame is a handful of C-level calls (two finds for the end of the head, one UTF-8
decode, one split, then each header line cut at its first colon: values may hold colons),
and the rare cases -- CRLF line ends, escapes, errors -- leave that path only when a cheap
test says they might be present. Searches resume where the last one stopped, so a frame
trickling in one byte at a time costs linear, not quadratic, time.
"""

from __future__ import annotations

import re
from typing import NoReturn

from ._errors import (
    FrameTooLarge,
    HeaderTooLong,
    MalformedFrame,
    ProtocolError,
    TooManyHeaders,
    UnknownCommand,
    _show,
)
from ._escape import check_version, unescape_header_value
from ._frame import CLIENT_COMMANDS, UNESCAPED_COMMANDS, Frame, FrameLimits

# The end of a frame's head is the EOL closing the last header (or the command) line, then
# the blank line: LF LF or LF CR LF (EOL is LF or CR LF; a CR before the first LF stays in the
# line and is stripped from it later).

# Heart-beats: any run of EOLs between frames.
_EOLS = re.compile(rb"(?:\r?\n)+")
_LF = 10
_CR = 13
# A content-length of more digits than this is refused as too large before calling int(),
# which would otherwise spend time on (or refuse, past 4300 digits) a hostile value.
_MAX_LENGTH_DIGITS = 18

_DEFAULT_LIMITS = FrameLimits()

# What is known about a frame whose head has been parsed but whose body is incomplete:
# (command, headers, offset of the body, offset of the terminating NUL or -1 when the frame
# has no content-length and the NUL must be searched for).
_Head = tuple[str, dict[str, str], int, int]


class FrameParser:
    """Turns a byte stream into frames, enforcing :class:`FrameLimits`.

    ``commands`` is the set of commands this side accepts: :data:`CLIENT_COMMANDS` in a
    broker, :data:`SERVER_COMMANDS` in a client. ``version`` selects header unescaping and
    may be changed between calls to :meth:`feed` once a version has been negotiated; frames
    already returned are not affected.
    """

    __slots__ = (
        "_buf",
        "_command_ok",
        "_commands",
        "_error",
        "_head",
        "_limits",
        "_pos",
        "_scan",
        "_version",
    )

    def __init__(
        self,
        limits: FrameLimits = _DEFAULT_LIMITS,
        *,
        commands: frozenset[str] = CLIENT_COMMANDS,
        version: str = "1.2",
    ) -> None:
        check_version(version)
        self._limits = limits
        self._commands = commands
        self._version = version
        self._buf = bytearray()
        # Start of the frame being parsed. Only non-zero inside feed(): the consumed prefix
        # is dropped before feed() returns.
        self._pos = 0
        # Where the next search for the end of the head, or for the NUL, resumes.
        self._scan = 0
        # The command line of the incomplete frame has been checked already.
        self._command_ok = False
        # The parsed head of a frame whose body has not fully arrived.
        self._head: _Head | None = None
        self._error: ProtocolError | None = None

    @property
    def version(self) -> str:
        """The STOMP version whose escaping rules apply to the headers of later frames."""
        return self._version

    @version.setter
    def version(self, version: str) -> None:
        check_version(version)
        self._version = version

    @property
    def limits(self) -> FrameLimits:
        """The limits this parser enforces."""
        return self._limits

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for a frame that has not been completed yet."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes) -> list[Frame]:
        """Add ``data`` to the buffer and return every frame now complete, in order.

        Heart-beats (EOLs between frames) are consumed silently. Raises a
        :class:`ProtocolError` subclass when the stream breaks the protocol or a limit; the
        parser is then broken and every later call raises the same error. Frames completed
        earlier in the same call are dropped with it: the connection is about to be closed
        with an ERROR frame, and a client cannot count on frames it sent without a receipt.
        """
        if self._error is not None:
            raise self._error.with_traceback(None)
        buf = self._buf
        if data:
            buf += data
        frames: list[Frame] = []
        try:
            while (frame := self._next_frame()) is not None:
                frames.append(frame)
        except ProtocolError as exc:
            self._error = exc
            self._head = None
            self._pos = 0
            buf.clear()
            raise
        pos = self._pos
        if pos:
            # Deleting a prefix of a bytearray moves its start pointer instead of the bytes.
            del buf[:pos]
            self._pos = 0
            self._scan = max(0, self._scan - pos)
            head = self._head
            if head is not None:
                command, headers, body_start, nul = head
                self._head = (command, headers, body_start - pos, nul - pos if nul >= 0 else -1)
        return frames

    def _next_frame(self) -> Frame | None:
        head = self._head
        if head is None:
            head = self._parse_head()
            if head is None:
                return None
        command, headers, body_start, nul = head
        buf = self._buf
        pos = self._pos
        if nul >= 0:
            # content-length told us where the NUL must be.
            if len(buf) <= nul:
                self._head = head
                return None
            if buf[nul] != 0:
                raise MalformedFrame(
                    f"body longer than content-length {nul - body_start}"
                    f" (byte {buf[nul]:#04x} where the terminating NUL should be)"
                )
        else:
            limit = self._limits.max_frame_bytes
            # Search no further than where a NUL would still keep the frame within the limit.
            nul = buf.find(b"\0", max(self._scan, body_start), pos + limit)
            if nul < 0:
                end = len(buf)
                if end - pos > limit:
                    later = buf.find(b"\0", pos + limit)
                    if later >= 0:
                        raise FrameTooLarge(later + 1 - pos, limit)
                    raise FrameTooLarge(end - pos, limit, at_least=True)
                self._scan = end
                self._head = head
                return None
        self._pos = nul + 1
        self._scan = 0
        self._head = None
        self._command_ok = False
        return Frame(command, headers, bytes(buf[body_start:nul]))

    def _parse_head(self) -> _Head | None:
        buf = self._buf
        pos = self._pos
        end = len(buf)
        if pos < end and (buf[pos] == _LF or buf[pos] == _CR):
            eols = _EOLS.match(buf, pos)
            if eols is not None:
                pos = self._pos = eols.end()
            if pos == end - 1 and buf[pos] == _CR:
                return None  # maybe the first half of a CR LF heart-beat
        if pos >= end:
            return None
        # The end of the head: the first LF LF, or LF CR LF before it (two finds cost less
        # than one regex search, and make no match object).
        scan = max(pos, self._scan)
        head_end = buf.find(b"\n\n", scan)
        crlf = buf.find(b"\n\r\n", scan, head_end + 2 if head_end >= 0 else end)
        if crlf >= 0:
            head_end = crlf
            body_start = crlf + 3
        elif head_end >= 0:
            body_start = head_end + 2
        else:
            # A match is at most 3 bytes long, so the next search must look at the last 2.
            self._scan = max(pos, end - 2)
            self._check_incomplete_head(pos, end)
            return None
        raw = buf[pos:head_end]
        limits = self._limits

        try:
            text = raw.decode()
        except UnicodeDecodeError as exc:
            self._raise_bad_utf8(bytes(raw), exc)
        lines = text.split("\n")
        if "\r" in text:
            lines = [line[:-1] if line.endswith("\r") else line for line in lines]
        command = lines[0]
        if command not in self._commands:
            self._reject_command(command.encode())
        # Line length before count: the first is what the incremental checks catch early.
        if len(raw) > limits.max_header_bytes:
            self._check_header_lengths(bytes(raw))
        count = len(lines) - 1
        if count > limits.max_headers:
            raise TooManyHeaders(count, limits.max_headers)

        headers: dict[str, str] | None = None
        if count:
            del lines[0]
            if "\\" not in text or self._version == "1.0" or command in UNESCAPED_COMMANDS:
                # Nothing to unescape: split each line at its first colon. (A loop compiled
                # by mypyc beats dict(map(methodcaller)) threefold here.)
                headers = {}
                for line in lines:
                    colon = line.find(":")
                    if colon <= 0:
                        headers = None  # no colon, or an empty name: the slow path names it
                        break
                    name = line[:colon]
                    # Repeated header: "only the first header entry SHOULD be used" (1.2).
                    if name not in headers:
                        headers[name] = line[colon + 1 :]
            if headers is None:
                headers = self._parse_headers_slowly(lines, command)
        else:
            headers = {}

        nul = -1
        length = headers.get("content-length")
        if length is not None:
            if not (length.isdigit() and length.isascii()):
                raise MalformedFrame(
                    f"content-length {_show(length)} is not a non-negative integer"
                )
            if len(length) > _MAX_LENGTH_DIGITS and len(length.lstrip("0")) > _MAX_LENGTH_DIGITS:
                raise FrameTooLarge(10**_MAX_LENGTH_DIGITS, limits.max_frame_bytes, at_least=True)
            nul = body_start + int(length)
            size = nul + 1 - pos
            # Refuse now rather than buffer a body we would refuse anyway.
            if size > limits.max_frame_bytes:
                raise FrameTooLarge(size, limits.max_frame_bytes)
        return (command, headers, body_start, nul)

    def _parse_headers_slowly(self, lines: list[str], command: str) -> dict[str, str]:
        version = self._version
        unescape = version != "1.0" and command not in UNESCAPED_COMMANDS
        headers: dict[str, str] = {}
        for line in lines:
            name, colon, value = line.partition(":")
            if not colon:
                raise MalformedFrame(f"header line {_show(line)} has no ':'")
            if not name:
                raise MalformedFrame(f"header line {_show(line)} has an empty name")
            if unescape:
                name = unescape_header_value(name, version)
                value = unescape_header_value(value, version)
            # Repeated header: "only the first header entry SHOULD be used" (STOMP 1.2).
            headers.setdefault(name, value)
        return headers

    def _check_incomplete_head(self, pos: int, end: int) -> None:
        """Refuse a head that cannot end well, without waiting for the rest of it."""
        limits = self._limits
        buf = self._buf
        size = end - pos
        if size > limits.max_frame_bytes:
            raise FrameTooLarge(size, limits.max_frame_bytes, at_least=True)
        if not self._command_ok:
            max_command = limits.max_command_bytes
            # One byte more than the limit may be the CR of a CR LF.
            eol = buf.find(b"\n", pos, pos + max_command + 2)
            if eol < 0:
                if size > max_command + 1:
                    raise MalformedFrame(
                        f"command line of at least {size} bytes exceeds"
                        f" max_command_bytes {max_command}"
                    )
                return
            command = bytes(buf[pos:eol]).removesuffix(b"\r")
            if command.decode("utf-8", "replace") not in self._commands:
                self._reject_command(command)
            self._command_ok = True
        # The command line is complete, so the partial last line is a header line.
        max_header = limits.max_header_bytes
        if buf.rfind(b"\n", max(pos, end - max_header - 2), end) < 0:
            line_start = buf.rfind(b"\n", pos, end) + 1
            raise HeaderTooLong(end - line_start, max_header, at_least=True)

    def _reject_command(self, command: bytes) -> NoReturn:
        limit = self._limits.max_command_bytes
        if len(command) > limit:
            raise MalformedFrame(
                f"command line of {len(command)} bytes exceeds max_command_bytes {limit}"
            )
        raise UnknownCommand(command.decode("utf-8", "replace"))

    def _check_header_lengths(self, raw: bytes) -> None:
        limit = self._limits.max_header_bytes
        for line in raw.split(b"\n")[1:]:
            size = len(line) - line.endswith(b"\r")
            if size > limit:
                raise HeaderTooLong(size, limit)

    def _raise_bad_utf8(self, raw: bytes, exc: UnicodeDecodeError) -> NoReturn:
        command, _, _ = raw.partition(b"\n")
        command = command.removesuffix(b"\r")
        if command.decode("utf-8", "replace") not in self._commands:
            self._reject_command(command)
        # Report a broken limit before bad UTF-8, as for a head that decodes.
        limits = self._limits
        if len(raw) > limits.max_header_bytes:
            self._check_header_lengths(raw)
        count = raw.count(b"\n")
        if count > limits.max_headers:
            raise TooManyHeaders(count, limits.max_headers)
        raise MalformedFrame(
            f"header is not valid UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start})"
        ) from None
