"""MemWatch's level logic (iBus//MessageServer's MemWatch): how much of `max_memory` the
broker uses, as a level every worker acts on. Pure: the supervisor passes the readings.

Level 0 is below the first threshold; level i is reached at `thresholds[i-1]` percent of
`max_memory`. Each level has a garbage-collection interval for the workers (0: none). The
configured warning level (and above) logs a warning when it is entered; coming back to 0
after a warning logs a note.
"""

from __future__ import annotations

from mpbroker.config import MemLevel

__all__ = ["MemWatch", "private_pss_bytes"]


def private_pss_bytes(smaps_rollup: str) -> int | None:
    """A process's proportional set size without its shared-memory mappings, from the text
    of /proc/PID/smaps_rollup (kB lines); None when the fields are missing. Pages the
    process shares with others (the fork server's imported modules, libraries) count in
    proportion; the broker's shared-memory segments are left out here and counted once,
    whole, by the caller."""
    fields: dict[str, int] = {}
    for line in smaps_rollup.splitlines():
        name, _, rest = line.partition(":")
        if name in ("Pss", "Pss_Shmem"):
            fields[name] = int(rest.split()[0]) * 1024
    if "Pss" not in fields:
        return None
    return fields["Pss"] - fields.get("Pss_Shmem", 0)


class MemWatch:
    def __init__(self, max_memory: int, levels: tuple[MemLevel, ...], warn_level: int) -> None:
        self.max_memory = max_memory
        self.levels = levels
        self.warn_level = warn_level
        self.level = 0
        self.used = 0
        self.warned = False  # a warning was logged since the level was last 0

    def level_for(self, used: int) -> int:
        percent = 100 * used / self.max_memory
        level = 0
        for i, mark in enumerate(self.levels, start=1):
            if percent >= mark.percent:
                level = i
        return level

    def update(self, used: int) -> str | None:
        """A new reading (bytes); the log line the change calls for, if any."""
        self.used = used
        before, self.level = self.level, self.level_for(used)
        figures = f"{used / 2**20:.0f} MiB of max_memory {self.max_memory / 2**20:.0f} MiB"
        if self.level >= self.warn_level > before and self.warn_level:
            self.warned = True
            return f"memory level {self.level}: {figures}"
        if self.level == 0 and before and self.warned:
            self.warned = False
            return f"memory back to level 0: {figures}"
        return None

    def gc_interval_ms(self, level: int) -> int:
        """How often workers collect garbage at `level` (0: never)."""
        return self.levels[level - 1].gc_interval_ms if 0 < level <= len(self.levels) else 0
