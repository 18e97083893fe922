"""Test data: :class:`mpbroker.records.Message` objects, with defaults for what a test does not
care about. A module whose tests share other defaults binds them once with
``functools.partial`` instead of writing its own constructor."""

from __future__ import annotations

from collections.abc import Mapping

from mpbroker.records import Message, message_size


def make_message(
    message_id: str = "m1",
    destination: str = "/queue/q",
    *,
    headers: Mapping[str, str] | None = None,
    body: bytes = b"body",
    timestamp_ms: int = 1_000,
    persistent: bool = False,
    priority: int = 4,
    expires_ms: int = 0,
    redelivered: bool = False,
    sized: bool = False,
) -> Message:
    """A message; ``sized``: with ``size`` set as the owning pipeline sets it on arrival,
    so it compares equal to the copies the engines deliver."""
    message = Message(
        message_id,
        destination,
        dict(headers or {}),
        body,
        timestamp_ms,
        persistent=persistent,
        priority=priority,
        expires_ms=expires_ms,
        redelivered=redelivered,
    )
    if sized:
        message.size = message_size(message)
    return message


def numbered_message(
    n: int,
    *,
    prefix: str = "m",
    destination: str = "/queue/q",
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    priority: int = 4,
    expires_ms: int = 0,
) -> Message:
    """Message ``n`` of a series, persistent, telling itself apart by every field: id
    ``{prefix}{n}``, headers ``{"n": "<n>"}`` and body ``body <n>`` (unless given), timestamp
    ``1000 + n``."""
    return make_message(
        f"{prefix}{n}",
        destination,
        headers={"n": str(n)} if headers is None else headers,
        body=f"body {n}".encode() if body is None else body,
        timestamp_ms=1_000 + n,
        persistent=True,
        priority=priority,
        expires_ms=expires_ms,
    )
