"""Wall-clock time as the broker records it: integer milliseconds since the epoch.

Message timestamps, expiry and settlement times use this (the STOMP `expires` header is
epoch ms, as in ActiveMQ). Intervals between events use the monotonic clock instead.
"""

from __future__ import annotations

import time

__all__ = ["epoch_ms"]


def epoch_ms() -> int:
    return int(time.time() * 1000)
