"""Exceptions raised by the STOMP client.

All of them derive from :class:`StompError`, so ``except StompError`` catches everything the
server or the connection can do to a caller. Local misuse (acking a message that has no ack id,
waiting for a receipt inside a callback) raises the ordinary ``ValueError``/``RuntimeError``.
"""

from __future__ import annotations

from collections.abc import Mapping

# An ERROR body is usually a short explanation, but a server may put a whole stack trace or the
# offending frame in it; str() of an exception should stay readable in a log line.
_MAX_BODY_CHARS_IN_STR = 500


class StompError(Exception):
    """The server sent an ERROR frame.

    ``message`` is the ERROR's ``message`` header (empty if it had none), ``headers`` all of its
    headers, ``body`` its body. ``str()`` gives the message followed by the body text.
    """

    def __init__(
        self, message: str, headers: Mapping[str, str] | None = None, body: bytes = b""
    ) -> None:
        super().__init__(message)
        self.message = message
        self.headers: dict[str, str] = dict(headers or {})
        self.body = body

    def __str__(self) -> str:
        text = self.message or "STOMP ERROR frame without a message header"
        detail = self.body.decode("utf-8", "replace").strip()
        if detail:
            if len(detail) > _MAX_BODY_CHARS_IN_STR:
                detail = detail[:_MAX_BODY_CHARS_IN_STR] + "..."
            text = f"{text}\n{detail}"
        return text

    def copy(self) -> StompError:
        """A fresh exception with the same fields.

        The client raises a copy in every waiting thread or task: raising one instance from
        several threads at once would make them overwrite each other's ``__traceback__``.
        """
        return StompError(self.message, self.headers, self.body)


class ConnectionClosed(StompError):
    """The connection is closed, so the operation could not be done.

    ``reason`` says why (the server closed the socket, heart-beats stopped, the client closed
    it, ...). ``error`` is the server's ERROR if one caused the close; ``message``, ``headers``
    and ``body`` then repeat its fields, otherwise ``message`` is the reason.
    """

    def __init__(self, reason: str, error: StompError | None = None) -> None:
        if error is None:
            super().__init__(reason)
        else:
            super().__init__(error.message, error.headers, error.body)
        self.reason = reason
        self.error = error

    def __str__(self) -> str:
        if self.error is None:
            return self.reason
        return f"{self.reason}: {self.error}"

    def copy(self) -> ConnectionClosed:
        return ConnectionClosed(self.reason, self.error)


class ReceiptTimeout(StompError):
    """No RECEIPT came for a frame within the caller's timeout.

    The frame may still have been processed by the server; only the confirmation is missing.
    """

    def __init__(self, command: str, receipt_id: str, timeout_s: float) -> None:
        super().__init__(
            f"no RECEIPT for {command} (receipt {receipt_id!r}) within {timeout_s:g} s"
        )
        self.command = command
        self.receipt_id = receipt_id
        self.timeout_s = timeout_s
