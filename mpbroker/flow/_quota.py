"""Named quotas, as WebLogic JMS has them. Pure logic.

A quota bounds the messages and bytes that one or more destinations may hold. A sender
whose message does not fit waits (up to its send timeout, which the caller enforces) for
room; the quota decides who gets room that comes back (docs/architecture.md, "Flow control"):

* FIFO: waiting senders are served in arrival order. A new request waits behind anyone
  already waiting even if it would fit, and room that comes back goes to the head of the
  line while the head fits; a large head message holds up smaller ones behind it, which is
  the price of never starving it.
* PREEMPTIVE: any request that fits is granted at once, even while others wait; room that
  comes back goes to every waiting request that fits, in arrival order, skipping larger
  ones. Better throughput, but a large message may wait for ever under steady traffic.

Senders are known by tickets (ints chosen by the caller, e.g. a connection's send id).
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

from mpbroker.config import DEFAULT_QUOTA, Config

from ._watermark import PER_DESTINATION_CACHE

__all__ = ["NO_LIMIT", "Quota", "QuotaBook", "QuotaPolicy", "QuotaSettings"]

NO_LIMIT = -1  # for QuotaSettings.max_messages / max_bytes


class QuotaPolicy(enum.Enum):
    FIFO = "fifo"
    PREEMPTIVE = "preemptive"


@dataclass(frozen=True, slots=True)
class QuotaSettings:
    """One named quota from the configuration."""

    name: str
    max_messages: int
    """Messages the quota holds at most; `NO_LIMIT` (-1) for no limit."""
    max_bytes: int
    """Bytes the quota holds at most; `NO_LIMIT` (-1) for no limit."""
    shared: bool
    """Whether the destinations that name this quota compete for one instance of it or
    each get their own; the caller decides that, the quota only carries the setting."""
    policy: QuotaPolicy

    def __post_init__(self) -> None:
        for key, value in (("max_messages", self.max_messages), ("max_bytes", self.max_bytes)):
            if value < NO_LIMIT:
                raise ValueError(
                    f"quota {self.name}: {key} {value}: need >= 0, or {NO_LIMIT} for no limit"
                )


class Quota:
    """The room left in one quota, and the senders waiting for room."""

    __slots__ = ("_bytes", "_messages", "_waiting", "settings")

    def __init__(self, settings: QuotaSettings) -> None:
        self.settings = settings
        self._messages = 0
        self._bytes = 0
        # ticket -> (messages, bytes), in arrival order; a dict so `cancel` is O(1).
        self._waiting: dict[int, tuple[int, int]] = {}

    def request(self, ticket: int, messages: int, nbytes: int) -> bool:
        """True: granted and counted now. False: `ticket` waits; `release` (or `cancel` of
        a sender ahead of it) grants it later.

        A request that can never fit (see `fits_ever`) is refused with ValueError: the
        caller must fail such a send at once instead of letting it wait for nothing.
        """
        _check_amounts(self.settings.name, messages, nbytes)
        if not self.fits_ever(messages, nbytes):
            s = self.settings
            raise ValueError(
                f"quota {s.name}: {messages} messages, {nbytes} bytes can never fit "
                f"(max_messages {s.max_messages}, max_bytes {s.max_bytes})"
            )
        if ticket in self._waiting:
            raise ValueError(f"quota {self.settings.name}: ticket {ticket} is already waiting")
        if (self.settings.policy is QuotaPolicy.PREEMPTIVE or not self._waiting) and self._fits(
            messages, nbytes
        ):
            self._messages += messages
            self._bytes += nbytes
            return True
        self._waiting[ticket] = (messages, nbytes)
        return False

    def release(self, messages: int, nbytes: int) -> list[int]:
        """Granted messages left (stored messages consumed, or a send failed after its
        grant); returns the waiting tickets granted now, in grant order.

        Used amounts never go below 0: releasing more than was granted is clamped, as
        this is accounting that must keep going.
        """
        _check_amounts(self.settings.name, messages, nbytes)
        self._messages = max(0, self._messages - messages)
        self._bytes = max(0, self._bytes - nbytes)
        return self._grant()

    def cancel(self, ticket: int) -> list[int]:
        """A waiting sender gave up (its send timeout passed). Unknown tickets (already
        granted, or cancelled) are ignored: a grant and a timeout may cross.

        Returns the tickets granted because of it: under FIFO, removing the head of the
        line can let the senders behind it through, and nothing else would tell them.
        Always empty under PREEMPTIVE, where no waiter ever fits."""
        if self._waiting.pop(ticket, None) is None:
            return []
        return self._grant()

    def take(self, messages: int, nbytes: int) -> None:
        """Count messages that are there already (recovered from the store after a
        restart, dead-letter copies): they take room without asking for it."""
        _check_amounts(self.settings.name, messages, nbytes)
        self._messages += messages
        self._bytes += nbytes

    def fits_ever(self, messages: int, nbytes: int) -> bool:
        """False when the amounts exceed the quota itself: such a send is refused at once."""
        s = self.settings
        return (s.max_messages == NO_LIMIT or messages <= s.max_messages) and (
            s.max_bytes == NO_LIMIT or nbytes <= s.max_bytes
        )

    @property
    def used(self) -> tuple[int, int]:
        """(messages, bytes) granted and not released."""
        return (self._messages, self._bytes)

    @property
    def waiting(self) -> int:
        """Senders waiting for room."""
        return len(self._waiting)

    def _fits(self, messages: int, nbytes: int) -> bool:
        s = self.settings
        return (s.max_messages == NO_LIMIT or self._messages + messages <= s.max_messages) and (
            s.max_bytes == NO_LIMIT or self._bytes + nbytes <= s.max_bytes
        )

    def _grant(self) -> list[int]:
        granted: list[int] = []
        fifo = self.settings.policy is QuotaPolicy.FIFO
        for ticket, (messages, nbytes) in self._waiting.items():
            if self._fits(messages, nbytes):
                self._messages += messages
                self._bytes += nbytes
                granted.append(ticket)
            elif fifo:
                break  # nobody passes the head of the line
        for ticket in granted:
            del self._waiting[ticket]
        return granted


def _check_amounts(name: str, messages: int, nbytes: int) -> None:
    if messages < 0 or nbytes < 0:
        raise ValueError(f"quota {name}: negative amount: {messages} messages, {nbytes} bytes")


class QuotaBook:
    """Which quota each destination draws on ([destinations] `quota`, else the quota named
    "default" if there is one), the quotas themselves (one per name when shared, one per
    destination otherwise), and which waiting ticket belongs to which."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.settings = {
            q.name: QuotaSettings(
                q.name, q.max_messages, q.max_bytes, q.shared, QuotaPolicy(q.policy)
            )
            for q in config.quotas
        }
        self._quotas: dict[str, Quota] = {}
        self._waiting: dict[int, str] = {}  # ticket -> quota key
        # Remembered per name: the patterns are matched once per destination.
        self.name = functools.lru_cache(maxsize=PER_DESTINATION_CACHE)(self._name)

    def _name(self, destination: str) -> str | None:
        """The quota `destination` draws on, or None."""
        table = self.config.destination(destination)
        if table is not None and table.quota:
            return table.quota
        return DEFAULT_QUOTA if DEFAULT_QUOTA in self.settings else None

    def _quota(self, destination: str) -> tuple[str, Quota] | None:
        name = self.name(destination)
        if name is None:
            return None
        settings = self.settings[name]
        key = name if settings.shared else f"{name}\0{destination}"
        quota = self._quotas.get(key)
        if quota is None:
            quota = self._quotas[key] = Quota(settings)
        return key, quota

    def fits_ever(self, destination: str, nbytes: int) -> bool:
        found = self._quota(destination)
        return found is None or found[1].fits_ever(1, nbytes)

    def request(self, ticket: int, destination: str, nbytes: int) -> bool:
        """True: one message of `nbytes` may go in now (counted). False: `ticket` waits."""
        found = self._quota(destination)
        if found is None:
            return True
        key, quota = found
        if quota.request(ticket, 1, nbytes):
            return True
        self._waiting[ticket] = key
        return False

    def take(self, destination: str, messages: int, nbytes: int) -> None:
        found = self._quota(destination)
        if found is not None:
            found[1].take(messages, nbytes)

    def release(self, destination: str, messages: int, nbytes: int) -> list[int]:
        """Messages left `destination`; the waiting tickets granted now."""
        found = self._quota(destination)
        if found is None:
            return []
        key, quota = found
        return self._granted(key, quota, quota.release(messages, nbytes))

    def cancel(self, ticket: int) -> list[int]:
        """A waiting sender gave up; the tickets granted because of it."""
        key = self._waiting.pop(ticket, None)
        if key is None:
            return []
        quota = self._quotas[key]
        return self._granted(key, quota, quota.cancel(ticket))

    def describe(self, destination: str) -> str:
        """The quota's limits, as a stopped producer is told them."""
        name = self.name(destination)
        if name is None:
            return ""
        s = self.settings[name]
        limits = [
            f"{k} {v}"
            for k, v in (("max_messages", s.max_messages), ("max_bytes", s.max_bytes))
            if v != NO_LIMIT
        ]
        return f"quota {name} {', '.join(limits)}"

    def _granted(self, key: str, quota: Quota, granted: list[int]) -> list[int]:
        for ticket in granted:
            self._waiting.pop(ticket, None)
        if "\0" in key and quota.used == (0, 0) and not quota.waiting:
            del self._quotas[key]  # a destination's own quota, idle: forget it
        return granted
