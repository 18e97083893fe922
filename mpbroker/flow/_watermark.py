"""A pair of watermarks on one running value, with hysteresis. Pure logic.

docs/architecture.md, "Flow control": crossing `high` stops producers, only falling to `low` starts
them again. The gap between the two is what keeps a limit from flapping on every message
when the value hovers around one number: producers that were stopped get a whole
`high - low` of room before they are stopped again.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OFF", "Level", "Watermark"]

# `high = OFF` switches a limit off. -1 rather than None so that a limit is always two
# plain ints, as it is written in the config file.
OFF = -1
# Per-destination lookups ([destinations] patterns) are remembered for this many names.
PER_DESTINATION_CACHE = 100_000


@dataclass(frozen=True, slots=True)
class Watermark:
    """Where a limit arms and where it disarms again."""

    high: int
    """Reaching it (value >= high) arms the limit; `OFF` (-1) switches the limit off."""
    low: int
    """Only falling to it (value <= low) disarms the limit again; `OFF` when high is."""

    def __post_init__(self) -> None:
        if self.high == OFF:
            if self.low != OFF:
                raise ValueError(
                    f"watermark low {self.low} with high {self.high}: a limit switched off "
                    f"(high {OFF}) must have low {OFF} too"
                )
        elif not 0 <= self.low < self.high:
            raise ValueError(
                f"watermark low {self.low}, high {self.high}: need 0 <= low < high "
                f"(or high {OFF} and low {OFF} to switch the limit off)"
            )

    @property
    def enabled(self) -> bool:
        """False when the limit is switched off: it never arms."""
        return self.high != OFF


class Level:
    """One watermark applied to one running value.

    The caller feeds every new value to `update`; `armed` says whether the limit holds
    producers back now. A limit that is switched off never arms.
    """

    __slots__ = ("armed", "mark", "name")

    def __init__(self, mark: Watermark, name: str) -> None:
        self.mark = mark
        self.name = name  # e.g. "msg_high": the reason given to stopped producers starts with it
        self.armed = False

    def update(self, value: int) -> bool | None:
        """True when `value` arms the limit, False when it disarms it, None when the
        state does not change (including every value between low and high)."""
        if self.armed:
            # A limit switched off (a reload) lets go too.
            if self.mark.high == OFF or value <= self.mark.low:
                self.armed = False
                return False
        elif self.mark.high != OFF and value >= self.mark.high:
            self.armed = True
            return True
        return None

    @property
    def reason(self) -> str:
        """What a stopped producer is told, e.g. "msg_high 10000": the limit and its value."""
        return f"{self.name} {self.mark.high}"

    def __repr__(self) -> str:
        return f"Level({self.mark!r}, {self.name!r}, armed={self.armed})"
