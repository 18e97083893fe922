"""Settings whose value is a small language of its own: MemWatch's levels, the expiry
log's fields, the disk free limit (bytes or a share). Pure: the config validates them with these parsers, and the components that
use them (MemWatch, the workers' garbage collection, the expiry policies) parse them with
the same ones."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._units import parse_size

__all__ = ["DiskFreeLimit", "MemLevel", "parse_disk_free_limit", "parse_levels", "parse_log_fields"]


@dataclass(frozen=True, slots=True)
class MemLevel:
    """One MemWatch level."""

    percent: float  # of max_memory at which this level starts
    gc_interval_ms: int  # how often workers collect garbage at this level (0: never)


def parse_levels(percents: str, gc_intervals_ms: str) -> tuple[MemLevel, ...]:
    """'50,80' and '2000,750' -> levels 1 and 2; ValueError saying what is wrong."""
    try:
        bounds = [float(p) for p in percents.split(",")]
        intervals = [int(i) for i in gc_intervals_ms.split(",")]
    except ValueError:
        raise ValueError("must be comma-separated numbers, e.g. '50,80' and '2000,750'") from None
    if len(bounds) != len(intervals):
        raise ValueError(
            f"{len(bounds)} level thresholds but {len(intervals)} gc intervals: one each"
        )
    if any(not 0 < p <= 100 for p in bounds) or bounds != sorted(set(bounds)):
        raise ValueError(f"thresholds {bounds}: rising percentages above 0, at most 100")
    if any(i < 0 for i in intervals):
        raise ValueError(f"gc intervals {intervals}: milliseconds >= 0")
    return tuple(MemLevel(p, i) for p, i in zip(bounds, intervals, strict=True))


def parse_log_fields(text: str) -> tuple[str, ...]:
    """`expiry_log_fields` as a tuple of names; ValueError for an empty one."""
    names = tuple(name.strip() for name in text.split(","))
    if not names or any(not name for name in names):
        raise ValueError(f"{text!r}: a comma-separated list of %header%, %properties% or names")
    return names


_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


@dataclass(frozen=True, slots=True)
class DiskFreeLimit:
    """`store.disk_free_limit_bytes`: bytes, or a share of the filesystem (0-1)."""

    bytes: int = 0
    share: float = 0.0

    def of(self, total_bytes: int) -> int:
        """The limit in bytes on a filesystem of `total_bytes` (0: no limit)."""
        return int(total_bytes * self.share) if self.share else self.bytes


def parse_disk_free_limit(text: str) -> DiskFreeLimit:
    """'64MiB', '67108864' or '5%' (of the filesystem); '0' switches it off; ValueError
    saying what is wrong."""
    m = _PERCENT.match(text)
    if m:
        share = float(m.group(1)) / 100
        if not share < 1:
            raise ValueError("a share of the filesystem must be below 100%")
        return DiskFreeLimit(share=share)
    try:
        return DiskFreeLimit(bytes=parse_size(text))
    except ValueError:
        raise ValueError("a size such as '64MiB', or a share such as '5%'") from None
