"""Byte units: the one definition of KiB, MiB and GiB, sizes read from text ('16MiB') and
sizes written for people ('19.09 MiB'). Pure."""

from __future__ import annotations

import re
from typing import Final

__all__ = ["GiB", "KiB", "MiB", "format_bytes", "parse_size"]

KiB: Final = 1024
MiB: Final = 1024 * KiB
GiB: Final = 1024 * MiB

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS: Final = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
}
_BINARY: Final = (("GiB", GiB), ("MiB", MiB), ("KiB", KiB))
_DECIMAL: Final = (("GB", 1000**3), ("MB", 1000**2), ("kB", 1000))


def parse_size(text: str) -> int:
    """'16MiB' -> 16777216, '64 KiB' -> 65536, '1.5MB' -> 1500000; ValueError otherwise."""
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r}")
    number = float(m.group(1))
    unit = (m.group(2) or "b").lower()
    return int(number * _SIZE_UNITS[unit])


def format_bytes(n: int) -> str:
    """'64 KiB', '2 MiB', '20 MB', '19.09 MiB', '746 B': the largest unit of either kind,
    exact when it is, else binary with two decimals."""
    binary = next(((u, size) for u, size in _BINARY if n >= size), None)
    decimal = next(((u, size) for u, size in _DECIMAL if n >= size), None)
    for unit in (binary, decimal):
        if unit is not None and n % unit[1] == 0:
            return f"{n // unit[1]} {unit[0]}"
    if binary is None:
        return f"{n} B"
    number = f"{n / binary[1]:.2f}".rstrip("0").rstrip(".")
    return f"{number} {binary[0]}"
