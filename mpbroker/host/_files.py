"""Open files: the limit a broker with `broker.max_connections` needs, and raising the soft
limit to it (the hard limit allows it; systemd's `LimitNOFILE=` sets the hard one).

Each connection is a socket in the gateway that holds it, and every connection may land in
one gateway, so a gateway may need `max_connections` descriptors plus its own (rings,
doorbells, logs): `FILES_PER_PROCESS` more. systemd starts services with a soft limit of
1,024 and advises programs that need more to raise it themselves (systemd 240's NEWS); the
workers inherit the supervisor's.
"""

from __future__ import annotations

import resource

__all__ = ["FILES_PER_PROCESS", "open_files_needed", "raise_open_files"]

FILES_PER_PROCESS = 1024
"""Descriptors a worker needs besides its connections: rings, doorbells, store files."""


def open_files_needed(max_connections: int) -> int:
    """The soft limit a gateway holding every connection needs."""
    return max_connections + FILES_PER_PROCESS


def raise_open_files(needed: int) -> str | None:
    """Raise this process's soft RLIMIT_NOFILE to `needed` (never lower it), up to the hard
    limit; a warning naming the limits when the hard one is too low, else None."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        return (
            f"open files: broker.max_connections needs up to {needed:,} descriptors in a "
            f"gateway, but the hard limit is {hard:,}: connections beyond about "
            f"{max(0, hard - FILES_PER_PROCESS):,} in one gateway will be refused (raise "
            "LimitNOFILE= in the unit, or ulimit -Hn)"
        )
    return None
