"""Encoding frames to bytes: a pure function, on the hot path of every MESSAGE delivered."""

from __future__ import annotations

from ._escape import check_version, escape_header_value
from ._frame import SUPPORTED_VERSIONS, UNESCAPED_COMMANDS, Frame


def encode_frame(frame: Frame, version: str = "1.2") -> bytes:
    """Return the wire bytes of ``frame`` for a connection speaking STOMP ``version``.

    Headers are written in dict order, escaped by the version's rules (never for CONNECT,
    STOMP and CONNECTED frames). A frame with a non-empty body and no ``content-length``
    gets one, appended last, so a body holding NUL bytes survives; an empty body gets none
    unless the caller supplied it. The command is written as given.

    Raises ``ValueError`` for a frame that cannot be written faithfully: an empty header
    name, a ``content-length`` that disagrees with the body, or a character the version
    cannot escape where it would end the line (CR or LF in 1.0 and in CONNECT/STOMP/
    CONNECTED frames, CR in 1.1; a colon in a name where names are not escaped). Sending
    such a header raw would let one client inject headers into another's frames.
    """
    if version not in SUPPORTED_VERSIONS:
        check_version(version)
    headers = frame.headers
    body = frame.body
    if headers:
        # Fast path: one line per header (a loop: what mypyc compiles best), checked at once.
        lines = []
        for name, value in headers.items():
            lines.append(f"{name}:{value}")
        plain = plain_header_text(lines) if "" not in headers else None
        text = (
            plain if plain is not None else _encode_headers_slowly(headers, frame.command, version)
        )
        length = headers.get("content-length")
        if length is not None:
            if length != str(len(body)) and not (
                # The length cap keeps int() away from thousand-digit strings.
                length.isdigit()
                and length.isascii()
                and len(length) < 20
                and int(length) == len(body)
            ):
                raise ValueError(
                    f"content-length {length!r} does not match the {len(body)}-byte body"
                )
            head = f"{frame.command}\n{text}\n\n"
        elif body:
            head = f"{frame.command}\n{text}\ncontent-length:{len(body)}\n\n"
        else:
            head = f"{frame.command}\n{text}\n\n"
    elif body:
        head = f"{frame.command}\ncontent-length:{len(body)}\n\n"
    else:
        head = f"{frame.command}\n\n"
    return frame_bytes(head, body)


def plain_header_text(lines: list[str]) -> str | None:
    """`lines` joined by LF, when nothing in them needs escaping in any STOMP version and
    nothing can break the framing; None when something might (escape them, or refuse).

    Each line must be ``f"{name}:{value}"`` with a non-empty name: then a colon count equal
    to the line count, an LF count one less, and no CR or backslash mean the text reads
    back the same under every version's rules (one counting pass in C per check).
    """
    text = "\n".join(lines)
    count = len(lines)
    if text.count(":") != count or text.count("\n") != count - 1 or "\\" in text or "\r" in text:
        return None
    return text


def frame_bytes(head: str, body: bytes) -> bytes:
    """A frame's bytes: its head (ending in the blank line), body and NUL. Concatenating
    copies the body twice and joining once, but joining builds a tuple: below a few
    kilobytes concatenating is quicker."""
    data = head.encode()
    if len(body) < 4096:
        return data + body + b"\0"
    return b"".join((data, body, b"\0"))


def _encode_headers_slowly(headers: dict[str, str], command: str, version: str) -> str:
    escape = version != "1.0" and command not in UNESCAPED_COMMANDS
    if escape and "" not in headers:
        # A colon in a message-id or a URL sends many MESSAGE frames here, so this is
        # the quick way through: escaped text cannot break the line, except for a CR in 1.1,
        # which the careful loop below reports.
        text = "\n".join(
            [
                f"{escape_header_value(name, version)}:{escape_header_value(value, version)}"
                for name, value in headers.items()
            ]
        )
        if "\r" not in text:
            return text
    lines: list[str] = []
    for name, value in headers.items():
        if not name:
            raise ValueError(f"{command} frame has a header with an empty name")
        if escape:
            name = escape_header_value(name, version)
            value = escape_header_value(value, version)
        elif ":" in name:
            raise ValueError(
                f"header name {name!r} holds a colon, which a {command} frame"
                f" in STOMP {version} cannot escape"
            )
        if "\n" in name or "\r" in name or "\n" in value or "\r" in value:
            raise ValueError(
                f"header {name!r} holds a CR or LF, which a {command} frame"
                f" in STOMP {version} cannot escape"
            )
        lines.append(f"{name}:{value}")
    return "\n".join(lines)
