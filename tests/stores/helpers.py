from __future__ import annotations

from mpbroker.records import Message


def msg(
    i: int,
    *,
    priority: int = 4,
    expires_ms: int = 0,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Message:
    return Message(
        message_id=f"m{i}",
        destination="/queue/a",
        headers={"n": str(i)} if headers is None else headers,
        body=f"body {i}".encode() if body is None else body,
        timestamp_ms=1_000 + i,
        persistent=True,
        priority=priority,
        expires_ms=expires_ms,
    )


class Clock:
    """A settable clock (seconds) to drive segment ages."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
