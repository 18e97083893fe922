"""Version and heart-beat negotiation, from the CONNECT/CONNECTED headers (STOMP 1.2)."""

from __future__ import annotations

from ._errors import MalformedFrame, _show
from ._frame import SUPPORTED_VERSIONS

# Heart-beat intervals are milliseconds; 18 digits is over 30 million years, and the cap keeps
# int() away from hostile thousand-digit values.
_MAX_HEARTBEAT_DIGITS = 18


def negotiate_version(accept_version: str | None) -> str | None:
    """Return the version to speak given a CONNECT frame's ``accept-version`` header.

    No header means a STOMP 1.0 client. Otherwise the highest version both sides support
    wins; ``None`` means there is none, and the server should answer with an ERROR frame
    that carries a ``version`` header listing :data:`SUPPORTED_VERSIONS`.
    """
    if accept_version is None:
        return "1.0"
    offered = {part.strip() for part in accept_version.split(",")}
    for version in reversed(SUPPORTED_VERSIONS):
        if version in offered:
            return version
    return None


def parse_heartbeat(value: str | None) -> tuple[int, int]:
    """Parse a ``heart-beat`` header, ``"x,y"`` in milliseconds; no header means ``(0, 0)``.

    Raises :class:`MalformedFrame` naming the value unless it is two non-negative integers
    separated by a comma (spaces around each number are tolerated).
    """
    if value is None:
        return (0, 0)
    parts = value.split(",")
    if len(parts) == 2:
        first, second = parts[0].strip(), parts[1].strip()
        if _is_small_natural(first) and _is_small_natural(second):
            return (int(first), int(second))
    raise MalformedFrame(
        f"heart-beat {_show(value)} is not two non-negative integers separated by a comma"
    )


def _is_small_natural(text: str) -> bool:
    return text.isdigit() and text.isascii() and len(text) <= _MAX_HEARTBEAT_DIGITS


def negotiate_heartbeat(client: tuple[int, int], server: tuple[int, int]) -> tuple[int, int]:
    """Return ``(send_every_ms, expect_every_ms)`` for the side whose header is ``server``.

    ``client`` is the peer's ``heart-beat`` (cx, cy), ``server`` our own (sx, sy). Per the
    spec's "Heart-beating" section, the server sends every max(sx, cy) ms unless sx or cy is
    0, and the client sends every max(cx, sy) ms unless cx or sy is 0; 0 means off. A client
    gets its own pair by passing the server's header as ``client`` and its own as ``server``
    (the rule is symmetric). How much lateness to tolerate before giving up on the peer is the
    caller's choice; the spec only says to allow "some tolerance".
    """
    cx, cy = client
    sx, sy = server
    send = 0 if sx == 0 or cy == 0 else max(sx, cy)
    expect = 0 if cx == 0 or sy == 0 else max(cx, sy)
    return (send, expect)
