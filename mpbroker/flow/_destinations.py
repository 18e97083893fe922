"""`broker.max_destinations` over every pipeline: may one more destination be made? Pure.

A destination (a queue, a topic with subscribers, a durable subscription) costs memory for
as long as it exists, whatever it holds, so their number is bounded like every other part
of the memory budget (docs/flow-control-and-memory.md, "What a destination costs"). The
limit is the broker's, over all its pipelines, and each pipeline owns its destinations: so
each pipeline counts its own (its engines' maps, `count_with`) and publishes the count
(`publish`: its control-block slot's counter, which the worker also refreshes every turn of
its loop), and reads the others' (`others`: the other pipelines' counters).

A pipeline about to make a destination counts it first (publishes its count with it), then
adds up every pipeline's count, and takes it back and refuses when that is over the limit:
two pipelines making the last one at the same moment both see the other and both refuse
(early), rather than both make it (late) -- as the gateways count their connections. A
pipeline never waits for another, and a destination that exists is never refused anything.

The alternative, a share of the limit per pipeline, would refuse one pipeline's next
destination while another has room: destinations are spread by a hash of their names, and
queues and topics are on different pipelines, so one kind could never use the other's room.

Only what a client asks for is refused (a SEND or SUBSCRIBE to a destination that does not
exist): what the broker makes itself (a dead-letter queue, an expiry redirect, what a
restart recovers from the stores) is made and counted, past the limit if need be.

MemWatch is the backstop of the arithmetic: from `memory.refuse_destinations_percent` of
max_memory on, new destinations are refused whatever their count (`memory_permille`, the
supervisor's last reading, set by the pipeline once per batch).
"""

from __future__ import annotations

from collections.abc import Callable

from mpbroker.errors import DestinationLimitReached, LimitReached

__all__ = ["DestinationLimit"]


def _percent(permille: int) -> str:
    """95 for 950, 95.5 for 955."""
    return f"{permille / 10:g}"


def _nothing() -> int:
    return 0


def _ignore(count: int) -> None:
    pass


class DestinationLimit:
    """The destinations of one pipeline against the broker's `limit`.

    `refuse_permille`: from this reading of MemWatch on, in thousandths of max_memory, no
    destination is made (0: never).
    `others`: the other pipelines' destinations (default: none, a broker of one pipeline).
    `publish`: told this pipeline's count when a check counts a new one in (default: no
    one)."""

    def __init__(
        self,
        limit: int,
        refuse_permille: int = 0,
        *,
        others: Callable[[], int] = _nothing,
        publish: Callable[[int], None] = _ignore,
    ) -> None:
        self.limit = limit
        self.refuse_permille = refuse_permille
        self.others = others
        self.publish = publish
        # MemWatch's last reading (thousandths of max_memory), as the pipeline last read it.
        self.memory_permille = 0
        # New destinations admitted but not made yet: persistent SENDs wait for their
        # group commit before their queue is made, and later SENDs must count them.
        self.reserved: set[str] = set()
        # SENDs and SUBSCRIBEs refused since the pipeline started.
        self.refused = 0
        # True while a restarted pipeline takes its gateways' subscriptions again: they
        # name destinations its predecessor held, and are counted, never refused.
        self.open = False
        self._counts: list[Callable[[], int]] = []

    def count_with(self, count: Callable[[], int]) -> None:
        """Add an engine's count of the destinations it holds (`len` of its map)."""
        self._counts.append(count)

    @property
    def count(self) -> int:
        """This pipeline's destinations now (those admitted and not yet made included)."""
        return sum(count() for count in self._counts) + len(self.reserved)

    def total(self) -> int:
        """Every pipeline's destinations, as far as this one knows."""
        return self.count + self.others()

    def refusal(self, destination: str, frame: str = "SEND") -> LimitReached | None:
        """Why `destination`, which no engine of this pipeline holds, may not be made now
        for a `frame` (SEND or SUBSCRIBE); None: it may (and is counted already)."""
        if self.open:
            return None
        used = self.memory_permille
        if self.refuse_permille and used >= self.refuse_permille:
            self.refused += 1
            undone = (
                "Nothing was subscribed" if frame == "SUBSCRIBE" else "The message was not accepted"
            )
            return LimitReached(
                destination,
                "refuse_destinations_percent",
                f"{_percent(self.refuse_permille)} (memory at {_percent(used)} % of max_memory)",
                f"{undone}: MemWatch last read the broker's memory at {_percent(used)} % of "
                "memory.max_memory, where no new destination is made "
                "(memory.refuse_destinations_percent). The destinations in use work as before.",
            )
        mine = self.count + 1
        self.publish(mine)
        if mine + self.others() > self.limit:
            self.publish(mine - 1)
            self.refused += 1
            return DestinationLimitReached(destination, self.limit, frame)
        return None

    def reserve(self, destination: str) -> None:
        """`destination` was admitted (`refusal` said None) and will be made later."""
        self.reserved.add(destination)

    def made(self, destination: str) -> None:
        """A reserved destination was made (or will not be): its engine counts it now."""
        self.reserved.discard(destination)
