"""STOMP over WebSocket: what the gateway decides about an opening handshake (RFC 6455
section 4.2), with no socket in sight.

`accept_request` takes a request's method, target and headers and either returns what to
answer with (the subprotocol chosen and the Sec-WebSocket-Accept token) or raises a
`HandshakeRefused` whose `response()` is the HTTP answer, a plain-text body saying why.

The checks, in order: GET only; path `/stomp` or `/ws` (no query string); a WebSocket
upgrade of version 13 with a key; the Origin (cross-site WebSocket hijacking: any web page
can open ws://127.0.0.1:PORT, and a broker without users lets everyone do everything); the
subprotocol, the highest STOMP version the client offers.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "LOCAL_HOSTS",
    "WEBSOCKET_PATHS",
    "WEBSOCKET_SUBPROTOCOLS",
    "BadOrigin",
    "ForeignOrigin",
    "HandshakeRefused",
    "MalformedRequest",
    "NotWebSocket",
    "RequestTooLarge",
    "UnknownParameter",
    "UnknownPath",
    "UnsupportedSubprotocol",
    "WebSocketAccept",
    "WrongMethod",
    "accept_request",
    "accept_token",
    "choose_subprotocol",
    "origin_allowed",
    "parse_allowed_origins",
]

#: The paths a WebSocket client may ask for (ActiveMQ and Artemis serve any path; RabbitMQ
#: Web-STOMP `/ws`; Spring's examples `/stomp`).
WEBSOCKET_PATHS: Final = ("/stomp", "/ws")
#: The subprotocols taken, best first: stomp.js offers the first three (its default
#: `stompVersions`); plain `stomp` is what some other clients and servers name it. The
#: subprotocol does not fix the STOMP version: CONNECT's accept-version does, as on TCP.
WEBSOCKET_SUBPROTOCOLS: Final = ("v12.stomp", "v11.stomp", "v10.stomp", "stomp")
#: Origin hosts taken without being listed: a page served from this machine.
LOCAL_HOSTS: Final = frozenset({"localhost", "127.0.0.1", "::1"})

_GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
# A value that came off the wire, quoted in a refusal, is cut to this many characters.
_SHOW_CHARS: Final = 100


def _show(value: str) -> str:
    return repr(value if len(value) <= _SHOW_CHARS else value[:_SHOW_CHARS] + "...")


class HandshakeRefused(Exception):
    """An opening handshake the gateway will not complete; `str()` says why, and
    `response()` is the HTTP answer (the connection closes after it)."""

    status: int = 400
    reason_phrase: str = "Bad Request"

    def headers(self) -> list[tuple[str, str]]:
        """Headers the answer carries besides the usual ones."""
        return []

    def response(self) -> bytes:
        """The whole HTTP/1.1 answer: status line, headers and the message as the body."""
        body = (str(self) + "\n").encode()
        lines = [f"HTTP/1.1 {self.status} {self.reason_phrase}"]
        lines += [f"{name}: {value}" for name, value in self.headers()]
        lines += [
            "Content-Type: text/plain; charset=utf-8",
            f"Content-Length: {len(body)}",
            "Connection: close",
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class WrongMethod(HandshakeRefused):
    """Anything but GET."""

    status, reason_phrase = 405, "Method Not Allowed"

    def __init__(self, method: str) -> None:
        self.method = method
        super().__init__(f"method {_show(method)} not allowed: a WebSocket handshake is a GET")

    def headers(self) -> list[tuple[str, str]]:
        return [("Allow", "GET")]


class UnknownPath(HandshakeRefused):
    """A path other than `WEBSOCKET_PATHS`."""

    status, reason_phrase = 404, "Not Found"

    def __init__(self, path: str) -> None:
        self.path = path
        paths = " or ".join(WEBSOCKET_PATHS)
        super().__init__(f"no such path {_show(path)}: STOMP over WebSocket is at {paths}")


class NotWebSocket(HandshakeRefused):
    """A plain HTTP request, or an upgrade to something else or to another version."""

    status, reason_phrase = 426, "Upgrade Required"

    def __init__(self, missing: str) -> None:
        self.missing = missing
        super().__init__(
            f"not a WebSocket handshake ({missing}): this port speaks STOMP over WebSocket "
            f"(version 13, at {' or '.join(WEBSOCKET_PATHS)})"
        )

    def headers(self) -> list[tuple[str, str]]:
        return [("Upgrade", "websocket"), ("Sec-WebSocket-Version", "13")]


class MalformedRequest(HandshakeRefused):
    """A request HTTP or RFC 6455 cannot read (a bad key, a broken header)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"bad request: {reason}")


class RequestTooLarge(HandshakeRefused):
    """A request head longer than the gateway buffers."""

    status, reason_phrase = 431, "Request Header Fields Too Large"

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"request head larger than {limit} bytes")


class ForeignOrigin(HandshakeRefused):
    """A page of another site (its Origin header) that stomp.ws_allowed_origins does not
    list: cross-site WebSocket hijacking."""

    status, reason_phrase = 403, "Forbidden"

    def __init__(self, origin: str) -> None:
        self.origin = origin
        super().__init__(
            f"origin {_show(origin)} not allowed: list it in stomp.ws_allowed_origins "
            "(pages from localhost, 127.0.0.1 and ::1 are allowed)"
        )


class UnsupportedSubprotocol(HandshakeRefused):
    """Subprotocols offered, none of them STOMP."""

    def __init__(self, offered: Sequence[str]) -> None:
        self.offered = tuple(offered)
        super().__init__(
            f"no supported subprotocol in {_show(', '.join(offered))}: "
            f"offer one of {', '.join(WEBSOCKET_SUBPROTOCOLS)} (or none)"
        )


class BadOrigin(ValueError):
    """A stomp.ws_allowed_origins entry that is not an origin, or `*` beside others (which
    it would make pointless)."""

    def __init__(self, entry: str) -> None:
        self.entry = entry
        if entry == "*":
            text = "'*' (any origin) with other origins: give either * alone, or the origins"
        else:
            text = (
                f"{entry!r} is not an origin: write scheme://host[:port] "
                "(https://app.example.com), or * for any"
            )
        super().__init__(text)


class UnknownParameter(HandshakeRefused):
    """A query string on the WebSocket path: nothing is read from one, so it is refused
    rather than ignored."""

    def __init__(self, query: str) -> None:
        self.query = query
        name = query.partition("&")[0].partition("=")[0]
        super().__init__(
            f"query parameter {_show(name)} not supported: "
            f"{' and '.join(WEBSOCKET_PATHS)} take none (log in with CONNECT's login and passcode)"
        )


@dataclass(frozen=True, slots=True)
class WebSocketAccept:
    """A handshake to complete: the subprotocol to name (None: the client offered none)
    and the Sec-WebSocket-Accept value."""

    subprotocol: str | None
    accept: str
    path: str
    origin: str | None

    def response(self) -> bytes:
        """The HTTP/1.1 101 answer that completes the handshake."""
        lines = [
            "HTTP/1.1 101 Switching Protocols",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Accept: {self.accept}",
        ]
        if self.subprotocol is not None:
            lines.append(f"Sec-WebSocket-Protocol: {self.subprotocol}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()


def accept_token(key: str) -> str:
    """Sec-WebSocket-Accept for a Sec-WebSocket-Key (RFC 6455 section 4.2.2)."""
    return base64.b64encode(hashlib.sha1(key.encode("ascii") + _GUID).digest()).decode()


def _origin_key(origin: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin (`scheme://host[:port]`, case folded, the scheme's
    default port filled in); None for anything else (`null`, a path, no host)."""
    scheme, sep, rest = origin.strip().partition("://")
    scheme = scheme.lower()
    if not sep or not scheme.isalpha() or not rest or "/" in rest.rstrip("/") or "@" in rest:
        return None
    rest = rest.rstrip("/").lower()
    port_text = ""
    if rest.startswith("["):  # an IPv6 literal: [::1]:8080
        host, bracket, after = rest[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            return None
        port_text = after[1:]
    else:
        host, _, port_text = rest.partition(":")
        if ":" in port_text:
            return None
    if not host:
        return None
    if port_text:
        if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
            return None
        port = int(port_text)
    else:
        port = _DEFAULT_PORTS.get(scheme, 0)
    return scheme, host, port


def parse_allowed_origins(text: str) -> frozenset[tuple[str, str, int]] | None:
    """stomp.ws_allowed_origins: comma-separated origins; None for `*` (any origin).
    BadOrigin for an entry that is not one."""
    entries = [entry.strip() for entry in text.split(",") if entry.strip()]
    if "*" in entries:
        if len(entries) > 1:
            raise BadOrigin("*")
        return None
    keys = set()
    for entry in entries:
        key = _origin_key(entry)
        if key is None:
            raise BadOrigin(entry)
        keys.add(key)
    return frozenset(keys)


def origin_allowed(origin: str | None, allowed: frozenset[tuple[str, str, int]] | None) -> bool:
    """Whether a handshake with this Origin header may go on: none (not a browser: it
    could send any header it likes, so checking it protects nobody), a page from this
    machine, or one `allowed` lists (None: any)."""
    if origin is None or allowed is None:
        return True
    key = _origin_key(origin)
    if key is None:
        return False  # "null" (a file, a sandboxed frame) or junk
    return key[1] in LOCAL_HOSTS or key in allowed


def choose_subprotocol(offered: Iterable[str]) -> str | None:
    """The best of `WEBSOCKET_SUBPROTOCOLS` the client offers; None when it offers none
    (a plain WebSocket client: taken, as RabbitMQ and ActiveMQ do). UnsupportedSubprotocol
    when it offers some and none is STOMP."""
    names = [name for name in offered if name]
    if not names:
        return None
    for name in WEBSOCKET_SUBPROTOCOLS:
        if name in names:
            return name
    raise UnsupportedSubprotocol(names)


def _tokens(values: Iterable[str]) -> list[str]:
    return [token.strip() for value in values for token in value.split(",") if token.strip()]


def accept_request(
    method: str,
    target: str,
    headers: Iterable[tuple[str, str]],
    allowed: frozenset[tuple[str, str, int]] | None,
) -> WebSocketAccept:
    """Judge an opening handshake: what to answer, or HandshakeRefused. Header names in
    any case; a header given twice counts as its values joined by commas."""
    if method != "GET":
        raise WrongMethod(method)
    path, question, query = target.partition("?")
    if path not in WEBSOCKET_PATHS:
        raise UnknownPath(path)
    if question:
        raise UnknownParameter(query)
    found: dict[str, list[str]] = {}
    for name, value in headers:
        found.setdefault(name.lower(), []).append(value)
    if "websocket" not in (token.lower() for token in _tokens(found.get("upgrade", []))):
        raise NotWebSocket("no 'Upgrade: websocket'")
    if "upgrade" not in (token.lower() for token in _tokens(found.get("connection", []))):
        raise NotWebSocket("no 'Connection: Upgrade'")
    if _tokens(found.get("sec-websocket-version", [])) != ["13"]:
        raise NotWebSocket("Sec-WebSocket-Version is not 13")
    keys = found.get("sec-websocket-key", [])
    key = keys[0].strip() if len(keys) == 1 else ""
    try:
        valid = len(base64.b64decode(key, validate=True)) == 16
    except (binascii.Error, ValueError):
        valid = False
    if not valid:
        raise MalformedRequest("Sec-WebSocket-Key is not 16 bytes in base64")
    origins = found.get("origin", [])
    if len(origins) > 1:
        # A browser sends one; which of several to judge is not for us to guess.
        raise MalformedRequest("more than one Origin header")
    origin = origins[0] if origins else None
    if not origin_allowed(origin, allowed):
        raise ForeignOrigin(origin or "")
    subprotocol = choose_subprotocol(_tokens(found.get("sec-websocket-protocol", [])))
    return WebSocketAccept(subprotocol, accept_token(key), path, origin)
