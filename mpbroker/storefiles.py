"""What a data directory's store files are called and mean: shared by the stores, which
write them, and the export, which reads them.

It imports nothing beyond the standard library, so a reader of the files (`mpbroker
export`, whose memory is bounded) does not load the stores' machinery (sqlite-utils and the
rest: 8 MB of the export's memory).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

__all__ = [
    "ARCHIVE_DIR",
    "MARKER_NAME",
    "MARKER_TEXT",
    "OUTCOMES",
    "SEGMENT_FORMAT",
    "fsync_directory",
    "segment_index",
    "segment_name",
]

SEGMENT_FORMAT: Final = "mpbroker-segment"
"""A segment's ``meta`` row ``format``."""
OUTCOMES: Final = frozenset({"acked", "expired", "dead-lettered", "unsubscribed"})
"""How a stored message is settled (a segment's ``settlements.outcome``)."""
MARKER_NAME: Final = "mpbroker-store"
"""The file that makes a directory a message store."""
MARKER_TEXT: Final = "mpbroker message store 1\n"
ARCHIVE_DIR: Final = "archive"
"""Where retired segments go with ``store.archive = true``."""
_NAME_RE: Final = re.compile(r"^seg-(\d{8})\.db$")


def segment_name(index: int) -> str:
    return f"seg-{index:08d}.db"


def segment_index(name: str) -> int | None:
    """The index in a segment file name, or None for any other name."""
    m = _NAME_RE.match(name)
    return int(m.group(1)) if m else None


def fsync_directory(directory: Path) -> None:
    """Make renames and unlinks in `directory` durable (POSIX needs an fsync of the directory)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
