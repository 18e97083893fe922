"""Expiry policies (WebLogic): what happens to a message whose time is up. Pure.

- `discard`: it goes, silently;
- `log`: it goes, and one line describes it, in WebLogic's format::

      <ExpiredJMSMessage JMSMessageID='ID-1-0.0-7' > <HeaderFields JMSPriority='4' ... />
      <UserProperties Make='Honda' /> </ExpiredJMSMessage>

  with the fields `expiry_log_fields` names: `%header%` (every JMS header field),
  `%properties%` (every user property), or field and property names; values are cut at 32
  characters, as the WebLogic manual says;
- `redirect`: it moves to the expiry destination (by default the queue's dead-letter
  queue, its error destination), with `expired-from` and `dead-letter-reason` headers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from mpbroker.config import Config, parse_log_fields
from mpbroker.records import Message

from ._watermark import PER_DESTINATION_CACHE

__all__ = [
    "DISCARD",
    "EXPIRY_POLICIES",
    "HEADER_FIELDS",
    "ExpiryPolicy",
    "expired_log_line",
    "expiry_policies",
]

EXPIRY_POLICIES: Final = ("discard", "log", "redirect")
# STOMP headers that are the header fields above (or frame mechanics), not user properties.
_NOT_PROPERTIES: Final = frozenset(
    {"persistent", "priority", "expires", "ttl", "content-type", "content-length", "receipt"}
)
_VALUE_MAX: Final = 32


def _header_fields(message: Message) -> dict[str, str]:
    return {
        "JMSDestination": message.destination,
        "JMSPriority": str(message.priority),
        "JMSTimestamp": str(message.timestamp_ms),
        "JMSExpiration": str(message.expires_ms),
        "JMSDeliveryMode": "PERSISTENT" if message.persistent else "NON_PERSISTENT",
        "JMSRedelivered": "true" if message.redelivered else "false",
    }


HEADER_FIELDS: Final = tuple(_header_fields(Message("", "", {}, b"", 0)))


def _attrs(fields: dict[str, str]) -> str:
    def value(v: str) -> str:
        return v[:_VALUE_MAX].replace("'", "&apos;")

    return " ".join(f"{k}='{value(v)}'" for k, v in fields.items())


def expired_log_line(message: Message, fields: tuple[str, ...]) -> str:
    headers = _header_fields(message)
    chosen_headers: dict[str, str] = {}
    chosen_properties: dict[str, str] = {}
    for name in fields:
        if name == "%header%":
            chosen_headers.update(headers)
        elif name == "%properties%":
            chosen_properties.update(
                (k, v) for k, v in message.headers.items() if k not in _NOT_PROPERTIES
            )
        elif name in headers:
            chosen_headers[name] = headers[name]
        elif name in message.headers:
            chosen_properties[name] = message.headers[name]
    parts = [f"<ExpiredJMSMessage JMSMessageID='{message.message_id}' >"]
    if chosen_headers:
        parts.append(f"<HeaderFields {_attrs(chosen_headers)} />")
    if chosen_properties:
        parts.append(f"<UserProperties {_attrs(chosen_properties)} />")
    parts.append("</ExpiredJMSMessage>")
    return " ".join(parts)


@dataclass(frozen=True, slots=True)
class ExpiryPolicy:
    policy: str  # one of EXPIRY_POLICIES
    log_fields: tuple[str, ...] = ("%header%", "%properties%")
    destination: str = ""  # redirect target; "" = the queue's dead-letter queue


DISCARD: Final = ExpiryPolicy("discard")


def expiry_policies(config: Config, owns: Callable[[str], bool]) -> Callable[[str], ExpiryPolicy]:
    """Per queue: its [destinations] table's expiry settings over [queues]'. A redirect
    target another worker owns cannot be written from here: the queue's dead-letter queue
    (always ours) is used instead. Without a [destinations] table every queue has the
    same policy, and nothing is remembered per name."""

    def policy_for(queue: str) -> ExpiryPolicy:
        target = config.setting_for(queue, "expiry_destination")
        if target and not owns(target):
            target = ""
        return ExpiryPolicy(
            config.setting_for(queue, "expiry_policy"),
            parse_log_fields(config.setting_for(queue, "expiry_log_fields")),
            target,
        )

    if not config.destinations:
        same: list[ExpiryPolicy] = []

        def same_policy(queue: str) -> ExpiryPolicy:
            if not same:
                same.append(policy_for(queue))
            return same[0]

        return same_policy
    return functools.lru_cache(maxsize=PER_DESTINATION_CACHE)(policy_for)
