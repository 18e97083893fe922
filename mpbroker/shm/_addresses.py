"""Connections per client address, counted by every gateway, read by all.

`broker.max_connections_per_address` is a limit over all gateways, but the kernel spreads
one address's connections over them (SO_REUSEPORT hashes the whole 4-tuple). So each gateway
counts its own connections per address in its row of this segment, and a gateway that
accepts a connection adds up that address's column over the rows::

    row g (one per gateway): BUCKETS u64 counters, written by gateway g only

An address is counted in the bucket its hash picks. Two addresses that share a bucket are
counted together, so the limit may refuse a little early when thousands of addresses
connect at once, never late. A single writer per row needs no lock (a lock whose holder is
killed stays taken); the supervisor clears a gateway's row before (re)starting it.
"""

from __future__ import annotations

import os
import zlib
from typing import Final

from ._segment import create_mapped, map_fd, open_segment_fd, unlink_segment

__all__ = ["BUCKETS", "AddressCounts"]

BUCKETS: Final = 4096
"""Counters per gateway (32 KiB a gateway)."""

_ROW_BYTES: Final = BUCKETS * 8


def bucket(address: str) -> int:
    """The counter an address is counted in."""
    return zlib.crc32(address.encode()) % BUCKETS


class AddressCounts:
    """A handle on the per-address connection counts. Use :meth:`create` or :meth:`attach`."""

    def __init__(self, name: str, fd: int, rows: int) -> None:
        self.name = name
        self.rows = rows
        self._mm = map_fd(fd, rows * _ROW_BYTES)
        self._q = memoryview(self._mm).cast("Q")

    @classmethod
    def create(cls, name: str, rows: int) -> AddressCounts:
        """Create the segment (mode 0600), zeroed, with one row per gateway."""
        if rows < 1:
            raise ValueError(f"address counts need at least 1 row, got {rows}")
        return create_mapped(
            name, rows * _ROW_BYTES, "address counts", lambda fd: cls(name, fd, rows)
        )

    @classmethod
    def attach(cls, name: str) -> AddressCounts:
        """Open the existing segment (SegmentNotFoundError if there is none)."""
        fd, size = open_segment_fd(name, "address counts")
        try:
            return cls(name, fd, size // _ROW_BYTES)
        finally:
            os.close(fd)

    def add(self, row: int, address: str, n: int) -> None:
        """Count `n` more (or fewer) connections of `address` in `row` (its gateway only)."""
        self._q[row * BUCKETS + bucket(address)] += n

    def total(self, address: str) -> int:
        """The connections of `address` over every gateway (and of any address that shares
        its bucket)."""
        column = bucket(address)
        q = self._q
        return sum(q[row * BUCKETS + column] for row in range(self.rows))

    def clear(self, row: int) -> None:
        """Zero `row` (a gateway starting: its predecessor's connections are gone)."""
        start = row * _ROW_BYTES
        self._mm[start : start + _ROW_BYTES] = bytes(_ROW_BYTES)

    def close(self) -> None:
        self._q.release()
        self._mm.close()

    def unlink(self) -> None:
        unlink_segment(self.name)
