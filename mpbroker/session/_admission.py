"""Whether a SEND may go now: flow control's decisions for one gateway. Pure.

A SEND outside a transaction (`flow_controlled`) meets, in this order:

1. MemWatch throttling: from `memory.throttle_level` on, every producer is paced with the
   [flow] rates (geometric decay), and recovers linearly once memory is back under
   (`Admission.memory_pace`);
2. rate-based flow (WebLogic): a destination with `flow_control` paces its producers while
   it is over its high watermark instead of stopping them (`Admission.rate_pace`);
3. otherwise a stop: its destination (or its store) is over a high watermark, or the
   message is larger than `memory.socket_reader_threshold_bytes` while memory is short
   (`Admission.stop_for`). The SEND waits for room at most its send timeout, then is
   refused (`Admission.refusal`).

A `Pacer` keeps one producer's paces. No clocks, no sockets: the gateway shell passes the
time and the MemWatch level in, and does the waiting.
"""

from __future__ import annotations

from typing import Final

from mpbroker.config import Config
from mpbroker.errors import LimitReached
from mpbroker.flow import (
    STORE_DISK,
    STORE_MEMORY,
    FlowGate,
    RateFlow,
    RateSettings,
    Stop,
    rate_settings_for,
    throttle_rate_settings,
)
from mpbroker.stomp import Frame

from ._headers import boolean
from ._state import SessionState

__all__ = ["MEMORY_PACE", "Admission", "Pace", "Pacer", "flow_controlled"]

#: The key of a producer's MemWatch pace in its `Pacer` (no destination is "").
MEMORY_PACE: Final = ""

#: What to pace a producer by: (key, armed now, the rates).
Pace = tuple[str, bool, RateSettings]


def flow_controlled(state: SessionState, frame: Frame) -> bool:
    """A SEND that flow control may hold or pace: not one inside a transaction (the
    transaction budget bounds those; they reach the pipeline at COMMIT)."""
    return (
        frame.command == "SEND"
        and state is SessionState.CONNECTED
        and "transaction" not in frame.headers
    )


class Pacer:
    """One producer's paces: per rate-controlled destination, and over all destinations
    (`MEMORY_PACE`) while MemWatch throttles."""

    __slots__ = ("_rates",)

    def __init__(self) -> None:
        self._rates: dict[str, RateFlow] = {}

    def delay(self, pace: Pace, now: float) -> float | None:
        """Seconds the producer waits for its turn at its rate for `pace`'s key (geometric
        decay while armed, linear recovery after); None when it is not paced at all (never
        armed, or fully recovered). After waiting, call `sent`."""
        key, armed, settings = pace
        rate = self._rates.get(key)
        if armed:
            if rate is None:
                rate = self._rates[key] = RateFlow(settings)
            rate.arm(now)
        elif rate is None:
            return None
        else:
            rate.disarm(now)
            if rate.rate(now) is None:  # fully recovered: no longer controlled
                del self._rates[key]
                return None
        return max(0.0, rate.delay(now))

    @property
    def idle(self) -> bool:
        """No pace of this producer is under way (each would need a look per SEND)."""
        return not self._rates

    def sent(self, key: str, now: float) -> None:
        """The producer took its turn for `key`."""
        rate = self._rates.get(key)
        if rate is not None:
            rate.sent(now)


class Admission:
    """A gateway's admission decisions, on the stops its pipelines announced (`flow`) and
    the settings in force (`configure` again on SIGHUP)."""

    def __init__(self, config: Config, flow: FlowGate) -> None:
        self.flow = flow
        self.configure(config)

    def configure(self, config: Config) -> None:
        self.config = config
        self.rate_for = rate_settings_for(config)
        self.throttle_rate = throttle_rate_settings(config)

    def memory_short(self, memory_level: int) -> bool:
        """MemWatch is at `memory.throttle_level` or above."""
        level = self.config.memory.throttle_level
        return bool(level) and memory_level >= level

    def memory_pace(self, memory_level: int) -> Pace:
        return MEMORY_PACE, self.memory_short(memory_level), self.throttle_rate

    def admits_at_once(self, frame: Frame, memory_level: int, pacer: Pacer) -> bool:
        """Whether the SEND goes without a look at paces or stops: nothing paces its
        producer, MemWatch does not throttle, its destination has no rate-based flow and no
        stop is in force. The common case, decided here without the shell waiting."""
        return (
            pacer.idle
            and not self.flow.stops
            and not self.memory_short(memory_level)
            and self.rate_for(frame.headers.get("destination", "")) is None
        )

    def rate_pace(self, frame: Frame) -> Pace | None:
        """The pace of a SEND to a destination with rate-based flow; None for others."""
        destination = frame.headers.get("destination", "")
        settings = self.rate_for(destination)
        if settings is None:
            return None
        persistent = boolean(frame.headers.get("persistent", "")) is True
        return destination, self.flow.stop_for(destination, persistent) is not None, settings

    def stop_for(self, frame: Frame, memory_level: int) -> Stop | None:
        """What holds a SEND now, or None if it may go."""
        threshold = self.config.memory.socket_reader_threshold_bytes
        if len(frame.body) > threshold and self.memory_short(memory_level):
            # A large message waits while memory is short (the seed's socket reader
            # threshold: smaller ones are taken without a memory check).
            level = self.config.memory.throttle_level
            return Stop(
                "",
                STORE_MEMORY,
                f"throttle_level {level} (MemWatch level {memory_level}; a "
                f"{len(frame.body)}-byte message is above socket_reader_threshold_bytes "
                f"{threshold})",
            )
        if not self.flow.stops:
            return None
        destination = frame.headers.get("destination", "")
        persistent = boolean(frame.headers.get("persistent", "")) is True
        return self.flow.stop_for(destination, persistent)

    def send_timeout_s(self, frame: Frame) -> float:
        """How long a held SEND waits for room before it is refused."""
        return self.config.send_timeout_ms(frame.headers.get("destination", "")) / 1000

    def refusal(self, frame: Frame, stop: Stop) -> LimitReached:
        """The refusal of a SEND still held by `stop` when its send timeout ran out."""
        destination = frame.headers.get("destination", "")
        timeout = self.config.send_timeout_ms(destination)
        if stop.store == STORE_DISK:
            detail = (
                "The message was not accepted: its store's filesystem stayed below "
                f"store.disk_free_limit_bytes for send_timeout_ms {timeout}."
            )
        else:
            where = f"{stop.store}.{stop.reason.split(' ')[0]}"
            whose = "its destination" if stop.destination else "the store"
            detail = (
                f"The message was not accepted: {whose} stayed over {where} for "
                f"send_timeout_ms {timeout}."
            )
        return LimitReached(destination, stop.reason, detail=detail)
