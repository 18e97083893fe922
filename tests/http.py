"""Asking an HTTP server (the admin API) from tests, whatever the status."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from email.message import Message
from typing import Any


def ask(url: str, **headers: str) -> tuple[int, Message, Any]:
    """Status, headers and JSON body of a GET of `url` with these headers."""
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.headers, json.load(reply)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.load(exc)
