"""Rate-based producer flow control, as WebLogic JMS does it. Pure logic.

Stopping a producer outright at a watermark is abrupt; WebLogic's "flow control" slows
producers down instead while a destination is over its threshold (docs/architecture.md, "Flow
control"). With settings `maximum` and `minimum` (messages per second), `interval_s` and
`steps`:

* Armed: the allowed rate starts at `maximum` and decays geometrically towards `minimum`
  in `steps` steps spread over `interval_s`: at step k of n (k = 0..n) it is
  ``maximum * (minimum / maximum) ** (k / n)``, each step lasting ``interval_s / n``
  seconds; after the last step it stays at `minimum`.
* Disarmed: the rate recovers linearly, rising by ``(maximum - minimum) / n`` every
  ``interval_s / n`` seconds; once it reaches `maximum` the producer is no longer
  controlled.

Geometric decay cuts hard at first, when the destination has just filled up; linear
recovery lets producers back gently so they do not refill it at once.

No clock is read here: every call takes `now` (seconds, from any monotonic clock).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mpbroker.config import Config

from ._watermark import PER_DESTINATION_CACHE

__all__ = ["RateFlow", "RateSettings", "rate_settings_for", "throttle_rate_settings"]

# A time that lands exactly on a step boundary must count as that step, although
# `elapsed / step_s` may come out a hair below the whole number after float rounding.
_STEP_SLACK = 1e-9


@dataclass(frozen=True, slots=True)
class RateSettings:
    """WebLogic's FlowMaximum, FlowMinimum, FlowInterval and FlowSteps."""

    maximum: float
    """Messages per second allowed when control starts (and after full recovery)."""
    minimum: float
    """Messages per second the rate decays to and then stays at."""
    interval_s: float
    """Seconds the decay (and a full recovery) takes."""
    steps: int
    """Steps the decay and the recovery are divided into."""

    def __post_init__(self) -> None:
        # Written as `not (...)` so that NaN, which compares false to everything, is refused.
        if not (0 < self.minimum <= self.maximum and math.isfinite(self.maximum)):
            raise ValueError(
                f"flow minimum {self.minimum}, maximum {self.maximum} (messages/s): "
                f"need 0 < minimum <= maximum, both finite"
            )
        if not (self.interval_s > 0 and math.isfinite(self.interval_s)):
            raise ValueError(f"flow interval_s {self.interval_s}: need a finite number > 0")
        if self.steps < 1:
            raise ValueError(f"flow steps {self.steps}: need at least 1")


_IDLE = 0  # not controlled
_DECAY = 1  # armed: rate decaying
_RECOVER = 2  # disarmed, rate still below maximum


class RateFlow:
    """The rate one producer may send at to one destination.

    `arm` and `disarm` follow the destination's watermark; `delay` and `sent` pace the
    producer. `controlled` reflects the state as of the last call that took a `now`:
    a finished recovery is noticed by the first call after it.

    Re-arming during recovery decays from the current rate, not from `maximum`: the rate
    continues down the same geometric curve (the same factor per step, floored at
    `minimum`) from the point where it equals the current rate. A producer that was just
    slowed down is thus never given full speed again by a destination that fills up
    again, and it reaches `minimum` sooner than after a fresh arm.
    Arming while already armed and disarming while not armed change nothing.
    """

    __slots__ = ("_last_sent", "_phase", "_since", "_start", "settings")

    def __init__(self, settings: RateSettings) -> None:
        self.settings = settings
        self._phase = _IDLE
        self._since = 0.0  # when the current phase started
        self._start = settings.maximum  # the rate when the current phase started
        self._last_sent: float | None = None

    def arm(self, now: float) -> None:
        """The destination went over its threshold: start slowing the producer down."""
        self._advance(now)
        if self._phase == _DECAY:
            return
        rate = self.settings.maximum if self._phase == _IDLE else self._recovering(now)
        self._phase, self._since, self._start = _DECAY, now, rate

    def disarm(self, now: float) -> None:
        """The destination fell back under its threshold: let the rate recover."""
        if self._phase != _DECAY:
            return
        rate = self._decaying(now)
        self._phase, self._since, self._start = _RECOVER, now, rate
        self._advance(now)  # recovering from maximum takes no step: not controlled at once

    def rate(self, now: float) -> float | None:
        """Messages per second the producer may send now; None when not controlled."""
        self._advance(now)
        if self._phase == _DECAY:
            return self._decaying(now)
        if self._phase == _RECOVER:
            return self._recovering(now)
        return None

    def delay(self, now: float) -> float:
        """Seconds the next message must wait so messages go 1/rate apart; 0 when not
        controlled or nothing was sent yet. Call `sent` once the message went."""
        rate = self.rate(now)
        if rate is None or self._last_sent is None:
            return 0.0
        return max(0.0, self._last_sent + 1.0 / rate - now)

    def sent(self, now: float) -> None:
        """A message went at `now` (recorded also while not controlled, so that the first
        message after arming is spaced from the one before it)."""
        self._advance(now)
        self._last_sent = now

    @property
    def controlled(self) -> bool:
        return self._phase != _IDLE

    def _step(self, now: float) -> int:
        elapsed = now - self._since
        if elapsed <= 0:  # a clock read before the phase started: still its first step
            return 0
        return math.floor(elapsed * self.settings.steps / self.settings.interval_s + _STEP_SLACK)

    def _decaying(self, now: float) -> float:
        s = self.settings
        k = self._step(now)
        if k >= s.steps:
            # Even a decay that started at maximum is at minimum by now; return it
            # exactly rather than maximum * (minimum / maximum) after rounding.
            return s.minimum
        return max(s.minimum, self._start * math.pow(s.minimum / s.maximum, k / s.steps))

    def _recovery_steps(self) -> int:
        """Steps the current recovery takes to reach maximum."""
        s = self.settings
        gap = s.maximum - self._start
        if gap <= 0:
            return 0
        # gap > 0 implies maximum > minimum, so the increment is not 0. The slack keeps a
        # recovery from minimum at exactly `steps` steps despite rounding.
        return math.ceil(gap * s.steps / (s.maximum - s.minimum) - _STEP_SLACK)

    def _recovering(self, now: float) -> float:
        s = self.settings
        increment = (s.maximum - s.minimum) / s.steps
        return min(s.maximum, self._start + self._step(now) * increment)

    def _advance(self, now: float) -> None:
        if self._phase == _RECOVER and self._step(now) >= self._recovery_steps():
            self._phase = _IDLE


def rate_settings_for(config: Config) -> Callable[[str], RateSettings | None]:
    """Per destination: its rate-based flow settings, or None where it is off
    ([flow] defaults under its [destinations] table)."""

    def settings_for(destination: str) -> RateSettings | None:
        def pick(name: str) -> Any:
            return config.setting_for(destination, name)

        if not pick("flow_control"):
            return None
        return RateSettings(
            pick("flow_maximum"), pick("flow_minimum"), pick("flow_interval_s"), pick("flow_steps")
        )

    if not config.destinations:
        # One answer for every name: nothing remembered per name (a cache of every
        # destination a client ever named would grow without bound).
        same = settings_for("")

        def same_settings(destination: str) -> RateSettings | None:
            return same

        return same_settings
    # Remembered per name: the patterns are matched once per destination.
    return functools.lru_cache(maxsize=PER_DESTINATION_CACHE)(settings_for)


def throttle_rate_settings(config: Config) -> RateSettings:
    """The pace of every producer while MemWatch throttles (memory.throttle_level): the
    [flow] section's rates, whatever a destination's own flow_control says."""
    flow = config.flow
    return RateSettings(flow.flow_maximum, flow.flow_minimum, flow.flow_interval_s, flow.flow_steps)
