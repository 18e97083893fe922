"""One logging set-up for every process: one line per event on stderr.

Each line carries the time, the level, the process role and its pid, so the interleaved
output of a supervisor and its workers can be read (and grepped) as one log.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["setup_logging"]

_FORMAT = "%(asctime)s %(levelname)s {role}[%(process)d] %(message)s"


def setup_logging(role: str, level: str) -> None:
    """Send this process's log records to stderr, tagged with `role` (e.g. 'gateway-0')."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT.format(role=role)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
