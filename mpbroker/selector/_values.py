"""What an identifier reads from a message, and how header text becomes a number or a
boolean. Shared by the compiler and the index, so that both read a message the same way.

STOMP headers are text, so a selector's identifiers mostly read text: the sender's header of
that name, or None (NULL) when the message has none. A few JMS header fields read the
message itself (`FIELDS`). Text compared with a number (or used in arithmetic) is read as a
number when it is a numeric literal of the selector grammar (``120``, ``-3``, ``100.5``,
``4E+10``); text compared with a boolean, or used as a condition, is a boolean when it is
``true`` or ``false`` in any case. Any other text gives UNKNOWN there.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from operator import attrgetter
from typing import Final

from mpbroker.records import Message

__all__ = [
    "FIELDS",
    "HEADER_FIELDS",
    "NUMERIC_FIELDS",
    "Reader",
    "header_of",
    "is_numeric",
    "reader",
    "to_boolean",
    "to_number",
]

Reader = Callable[[Message], str | int | None]


def _delivery_mode(message: Message) -> str:
    return "PERSISTENT" if message.persistent else "NON_PERSISTENT"


# JMS header fields that read the message's own fields (not a STOMP header).
NUMERIC_FIELDS: Final[dict[str, Callable[[Message], int]]] = {
    "JMSPriority": attrgetter("priority"),
    "JMSTimestamp": attrgetter("timestamp_ms"),
    "JMSExpiration": attrgetter("expires_ms"),  # 0: never expires
}
FIELDS: Final[dict[str, Reader]] = {
    **NUMERIC_FIELDS,
    "JMSMessageID": attrgetter("message_id"),
    "JMSDeliveryMode": _delivery_mode,
}
# JMS header fields that STOMP carries as a header of another name.
HEADER_FIELDS: Final = {"JMSType": "type", "JMSCorrelationID": "correlation-id"}

# The grammar's numeric literals, optionally signed; ASCII digits only.
_NUMBER: Final = re.compile(r"[+-]?(?:[0-9]+(\.[0-9]*)?|(\.)[0-9]+)([eE][+-]?[0-9]+)?")
# Exact numbers beyond a Java long's magnitude are read as approximate ones (floats), which
# also keeps a hostile header of thousands of digits from making ints that slow every
# multiplication down.
_EXACT_MAX: Final = 2**63
_NUMBER_STARTS: Final = frozenset("0123456789+-.")
_BOOLEANS: Final = {"true": True, "false": False}


def header_of(name: str) -> str | None:
    """The STOMP header identifier `name` reads, or None for a field of the message."""
    if name in FIELDS:
        return None
    return HEADER_FIELDS.get(name, name)


def is_numeric(name: str) -> bool:
    """Whether identifier `name` always reads a number (an int) rather than text."""
    return name in NUMERIC_FIELDS


def reader(name: str) -> Reader:
    """What identifier `name` reads from a message: text or None for a header (missing is
    NULL), the field's value for a JMS field of `FIELDS`."""
    field = FIELDS.get(name)
    if field is not None:
        return field
    header = HEADER_FIELDS.get(name, name)

    def read_header(message: Message) -> str | None:
        return message.headers.get(header)

    return read_header


def to_number(text: str) -> int | float | None:
    """`text` as a number if it is a numeric literal (an int if exact, else a float), or
    None if it is not one."""
    if not text or text[0] not in _NUMBER_STARTS or not text.isascii():
        return None  # most text that is not a number fails the first test
    if text.isdigit():  # the common case, without the regular expression
        if len(text) <= 18:
            return int(text)
    elif (match := _NUMBER.fullmatch(text)) is None:
        return None
    elif match.group(1) is not None or match.group(2) is not None or match.group(3) is not None:
        return float(text)
    # An exact number: an int unless it is too long (int() refuses over 4300 digits) or big.
    digits = text.lstrip("+-").lstrip("0") or "0"
    if len(digits) <= 19 and (value := int(digits)) <= _EXACT_MAX:
        return -value if text.startswith("-") else value
    return float(text)


def to_boolean(text: str) -> bool | None:
    """`text` as a boolean if it is ``true`` or ``false`` in any (ASCII) case, else None."""
    if len(text) > 5 or not text.isascii():
        return None
    return _BOOLEANS.get(text.lower())
