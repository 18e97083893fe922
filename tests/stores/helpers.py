from __future__ import annotations

from functools import partial

from tests.factories import numbered_message

#: Message i of the store tests' queue.
msg = partial(numbered_message, destination="/queue/a")


class Clock:
    """A settable clock (seconds) to drive segment ages."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
