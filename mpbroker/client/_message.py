"""The Message a subscription delivers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Message:
    """One MESSAGE frame from the server.

    The fields are the frame's standard headers; ``headers`` holds all of them (treat it as
    read-only: the dataclass is frozen but a dict cannot be). ``ack_id`` is the 1.2 ``ack``
    header, present only on subscriptions whose ack mode is not ``auto``.
    """

    destination: str
    message_id: str
    subscription: str
    ack_id: str | None
    headers: dict[str, str]
    body: bytes

    @property
    def redelivered(self) -> bool:
        """True when the server says it delivered this message before (``redelivered:true``)."""
        return self.headers.get("redelivered", "").lower() == "true"

    @property
    def text(self) -> str:
        """The body decoded with the ``content-type`` charset (UTF-8 if none is given)."""
        return self.body.decode(_charset(self.headers.get("content-type", "")))


def _charset(content_type: str) -> str:
    # content-type is MIME style, "text/plain;charset=utf-8"; STOMP says UTF-8 when absent.
    for param in content_type.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip():
            return value.strip().strip('"')
    return "utf-8"
