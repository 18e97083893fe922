"""Header value escaping, per protocol version.

STOMP 1.2 escapes CR, LF, colon and backslash; 1.1 the same without CR; 1.0 escapes nothing.
CONNECT, STOMP and CONNECTED frames are never escaped in any version; that exemption is the
caller's business (the parser and ``encode_frame`` apply it), not these functions'.
"""

from __future__ import annotations

import re

from ._errors import BadHeaderEscape
from ._frame import SUPPORTED_VERSIONS

# Decoding tables: the character after the backslash -> what it stands for.
_UNESCAPES: dict[str, dict[str, str]] = {
    "1.1": {"n": "\n", "c": ":", "\\": "\\"},
    "1.2": {"r": "\r", "n": "\n", "c": ":", "\\": "\\"},
}

# A backslash and the one character after it, or a lone backslash at the end of the value
# (which is as undefined as any other sequence).
_ESCAPE_SEQUENCE = re.compile(r"\\(.?)", re.DOTALL)


def check_version(version: str) -> None:
    """Raise ``ValueError`` unless ``version`` is one this codec speaks."""
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(
            f"unsupported STOMP version {version!r}; expected one of {', '.join(SUPPORTED_VERSIONS)}"
        )


def escape_header_value(value: str, version: str = "1.2") -> str:
    """Return ``value`` escaped for a header of a frame in STOMP ``version``.

    Characters a version cannot escape (CR in 1.1; CR and LF in 1.0) are left as they are;
    ``encode_frame`` refuses them, since on the wire they would end the header line.
    """
    if version == "1.2":
        # str.replace runs in C and returns the same object when there is nothing to replace,
        # so the common case (no special character) costs four memchr-like scans.
        # Backslash must go first, or the backslashes added below would be doubled.
        return (
            value.replace("\\", "\\\\")
            .replace("\r", "\\r")
            .replace("\n", "\\n")
            .replace(":", "\\c")
        )
    if version == "1.1":
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
    check_version(version)
    return value


def unescape_header_value(value: str, version: str = "1.2") -> str:
    """Return the header value that ``value``, as read off the wire, stands for.

    Raises :class:`BadHeaderEscape` for a backslash sequence the version does not define.
    """
    table = _UNESCAPES.get(version)
    if table is None:
        check_version(version)
        return value  # 1.0: a backslash is just a backslash
    if "\\" not in value:
        return value

    def replace(match: re.Match[str]) -> str:
        result = table.get(match.group(1))
        if result is None:
            raise BadHeaderEscape(match.group(0), version)
        return result

    return _ESCAPE_SEQUENCE.sub(replace, value)
