"""Point-to-point engine: non-persistent queues (the VolQueueStore) and their consumers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from mpbroker.config import QueueSettings
from mpbroker.errors import LimitReached
from mpbroker.flow import DISCARD, ExpiryPolicy, FlowTracker, QuotaBook, expired_log_line
from mpbroker.records import (
    ACK_AUTO,
    Ack,
    Deliver,
    Message,
    Nack,
    Refuse,
    Send,
    decode_page,
    encode_page,
    message_size,
)
from mpbroker.selector import Selector, SelectorIndex

from ._common import Consumer, Engine, Outbox, no_byte_window
from ._pending import IndexedPending, Pending
from ._totals import DEAD_LETTERED, ENQUEUED, EXPIRED

# (queue name, store seq) of a stored message the engine is done with.
StoredRef = tuple[str, int]


@dataclass(eq=False, slots=True)
class StoredAck:
    """An ACK or NACK that settled or returned stored messages: its RECEIPT waits until the
    worker has written that to the store, and an ERROR goes instead when it could not be
    (`QueueEngine.unsettle` puts acknowledged ones back)."""

    gateway: int
    conn: int
    receipt: str
    #: "ACK" or "NACK".
    frame: str
    #: The queue the messages came from (a durable subscription's own queue for topics).
    queue: str
    #: The stored messages it settled (ACK) or gave back (NACK).
    messages: list[Message]


class Pager(Protocol):
    """Where waiting non-persistent messages go when memory is short (the worker's temp
    store): their pages (headers and body, records.encode_page)."""

    def put(self, page: bytes) -> int | None:
        """Keep `page`; its key, or None when there is no room."""

    def take(self, key: int) -> bytes:
        """The page back; the key is forgotten."""

    def drop(self, key: int) -> None:
        """Forget a page never read back."""


@dataclass(frozen=True, slots=True)
class IndexCache:
    """Stored messages waiting in a queue keep their body in memory up to `max_entries`
    messages and `max_bytes` bytes of bodies (-1: entries only); the others keep only their
    index entry, and `load` (the store) gives the whole message back when it is delivered."""

    load: Callable[[int], Message]
    max_entries: int
    max_bytes: int = -1


@dataclass(eq=False, slots=True)
class QueueEffects:
    """What a QueueEngine's work left for its worker beyond the records in its outbox,
    taken once per step with `QueueEngine.take_effects()`. Store references are
    (queue, seq): the queue tells a durable subscription's copy from another's."""

    #: Stored messages acknowledged (or consumed at most once): settle them in the store.
    settled: list[StoredRef] = field(default_factory=list)
    #: Stored messages delivered and back in their queue: count the delivery in the store.
    returned: list[StoredRef] = field(default_factory=list)
    #: Stored messages back in their queue through no doing of their consumer (the store
    #: could not write its ACK, or the broker closed its connection for that): flag them
    #: redelivered in the store without counting the delivery (see `QueueEngine._requeue`).
    flagged: list[StoredRef] = field(default_factory=list)
    #: Stored messages that expired: settle them as expired.
    expired: list[StoredRef] = field(default_factory=list)
    #: Stored messages moving to another queue, as (original, copy, outcome): store the
    #: copy, settle the original with the outcome, then `enqueue_dead_letters(copies)`; if
    #: the copies cannot be stored, `unmove(originals)` puts the originals back.
    dead_letters: list[tuple[Message, Message, str]] = field(default_factory=list)
    #: Lines the `log` expiry policy wrote (WebLogic's format), for the expiry log.
    expiry_log: list[str] = field(default_factory=list)
    #: Quota tickets whose waiting SENDs may go now: room was given back.
    quota_granted: list[int] = field(default_factory=list)
    #: ACKs and NACKs of stored messages, in order: answer them once the above is written.
    acks: list[StoredAck] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class _Lane:
    """The consumers of a queue that share one selector (None: those without one), and
    the waiting messages it selects, in delivery order; served round robin."""

    selector: Selector | None
    pending: Pending
    consumers: list[Consumer] = field(default_factory=list)
    next_consumer: int = 0


@dataclass(eq=False, slots=True)
class _Queue:
    """One queue: every waiting message in `pending`, in delivery order.

    Consumers without a selector take from `pending` itself (the `plain` lane). Consumers
    with one are grouped by its text in `lanes`, each with its own Pending of the waiting
    messages it selects (found through `index` when a message arrives or comes back, and
    by one scan of the backlog when the lane is made). A message delivered from any lane
    leaves `pending` and every other lane holding it (`lanes_of`), so no message waits
    behind one that no ready consumer selects (no head-of-line blocking), and messages no
    consumer selects stay where they are, in order, until one comes.

    Between steps, every ready consumer's lane is empty: so a new message only needs the
    lanes that select it looked at, and a consumer with room again only its own.
    """

    name: str
    pending: Pending = field(default_factory=Pending)
    consumers: list[Consumer] = field(default_factory=list)
    plain: _Lane = field(init=False)
    lanes: dict[str, _Lane] = field(default_factory=dict)
    # Made with the first selector lane (`selector_index`): most queues never have one.
    index: SelectorIndex[_Lane] | None = None
    # id(message) -> the selector lanes holding it (only messages some lane selects).
    lanes_of: dict[int, list[_Lane]] = field(default_factory=dict)
    # Messages held: pending plus delivered-but-unsettled.
    held_messages: int = 0
    # Which of the lanes that can take a message is offered it first: turns, so that
    # consumers with different (overlapping) selectors share the messages they all select.
    turn: int = 0

    def __post_init__(self) -> None:
        self.plain = _Lane(None, self.pending)

    def lane(self, consumer: Consumer) -> _Lane:
        selector = consumer.selector
        return self.plain if selector is None else self.lanes[selector.text]

    def selector_index(self) -> SelectorIndex[_Lane]:
        index = self.index
        if index is None:
            index = self.index = SelectorIndex()
        return index

    def add_waiting(self, message: Message) -> None:
        """A message starts waiting, at the tail of its priority."""
        self.pending.append(message)
        if self.lanes:
            lanes = self.selector_index().matching(message)
            if lanes:
                self.lanes_of[id(message)] = lanes
                for lane in lanes:
                    lane.pending.append(message)

    def add_waiting_at_head(self, messages: list[Message]) -> list[_Lane]:
        """Messages come back, to the head of their priorities, in their order; returns
        the selector lanes that got some of them."""
        self.pending.extendleft(messages)
        if not self.lanes:
            return []
        back: dict[int, tuple[_Lane, list[Message]]] = {}
        for message in messages:
            lanes = self.selector_index().matching(message)
            if lanes:
                self.lanes_of[id(message)] = lanes
                for lane in lanes:
                    back.setdefault(id(lane), (lane, []))[1].append(message)
        for lane, selected in back.values():
            lane.pending.extendleft(selected)
        return [lane for lane, _ in back.values()]

    def stop_waiting(self, message: Message, taken_from: Pending | None = None) -> None:
        """A message left `taken_from` (popped; None: from none yet): it leaves all."""
        if taken_from is not self.pending:
            self.pending.remove(message)
        if self.lanes_of:
            for lane in self.lanes_of.pop(id(message), ()):
                if lane.pending is not taken_from:
                    lane.pending.remove(message)

    def open_lane(self, selector: Selector) -> _Lane:
        """A lane for a selector no consumer of the queue had: one scan of the backlog."""
        if not isinstance(self.pending, IndexedPending):
            # The first selector: messages must now leave `pending` from the middle too.
            self.pending = self.plain.pending = IndexedPending(self.pending)
        lane = self.lanes[selector.text] = _Lane(selector, IndexedPending())
        matches = selector.matches
        for message in self.pending:
            if matches(message):
                lane.pending.append(message)
                self.lanes_of.setdefault(id(message), []).append(lane)
        self.selector_index().add(lane, selector)
        return lane

    def close_lane(self, lane: _Lane) -> None:
        """A lane's last consumer left: its messages stay in `pending`."""
        assert lane.selector is not None
        del self.lanes[lane.selector.text]
        self.selector_index().remove(lane)
        for message in lane.pending:
            lanes = self.lanes_of[id(message)]
            lanes.remove(lane)
            if not lanes:
                del self.lanes_of[id(message)]


def _discard(queue: str) -> ExpiryPolicy:
    return DISCARD


def _is_dead_letter_queue(destination: str, prefix: str) -> bool:
    return destination.startswith("/queue/" + prefix)


def _paged_body_bytes(message: Message) -> int:
    """The size of a paged message's body (on disk): its size less what stayed in memory
    (its header text)."""
    return message.size - message_size(message)


def _redelivery(message: Message) -> Message:
    return msgspec.structs.replace(message, redelivered=True, deliveries=message.deliveries + 1)


class QueueEngine(Engine):
    """Owns the queues of one p2p partition: each message goes to exactly one consumer
    whose selector selects it (see `_Queue` for how selectors avoid head-of-line blocking).

    Ready consumers (window not full) are served round robin. NACK, and a consumer that
    goes away with unsettled messages, put those messages back at the head of the queue
    with `redelivered` set, in their original order.
    """

    role = "p2p"

    def __init__(
        self,
        settings: QueueSettings,
        pipeline: int,
        outbox: Outbox,
        *,
        window_bytes_for: Callable[[str], int] = no_byte_window,
        flow_volatile: FlowTracker | None = None,
        flow_persistent: FlowTracker | None = None,
        expiry_for: Callable[[str], ExpiryPolicy] = _discard,
        quotas: QuotaBook | None = None,
        index_cache: IndexCache | None = None,
        pager: Pager | None = None,
    ) -> None:
        """`flow_volatile`, `flow_persistent`: flow control's count of what each store
        holds per queue (waiting or unacknowledged), against its watermarks; the worker
        announces their changes. `expiry_for`: each queue's expiry policy. `quotas`: named
        quotas, given room back as messages leave (the SENDs that may go then are in the
        effects). `index_cache`: where stored messages beyond the cache are read back from
        (without it, every body stays in memory). `pager`: where non-persistent messages
        go while `paging` is on (flow-to-disk)."""
        super().__init__(pipeline, outbox, window_bytes_for)
        self.settings = settings
        self.queues: dict[str, _Queue] = {}
        self.held_bytes = 0
        self._effects = QueueEffects()
        self.expiry_for = expiry_for
        self.expired = 0
        self.index_cache = index_cache
        self.cached = 0
        self.cached_bytes = 0
        # Flow-to-disk of non-persistent messages: with a `pager` (the temp store), while
        # `paging` is on (the worker's paging decision) every message left waiting after
        # dispatch is paged out (its body to disk; in memory what order and expiry need,
        # and its headers, which selectors read), and `page_out` moves those already
        # waiting. `held_bytes` counts what is in memory (a paged message's header text
        # included); `paged_bytes` the bodies on disk.
        self.pager = pager
        self.paging = False
        self.paged_bytes = 0
        self.paged_messages = 0
        self.flow_volatile = flow_volatile
        self.flow_persistent = flow_persistent
        self.quotas = quotas

    def take_effects(self) -> QueueEffects:
        """What the engine's work since the last call left for the worker."""
        effects, self._effects = self._effects, QueueEffects()
        return effects

    def configure_expiry(self, expiry_for: Callable[[str], ExpiryPolicy]) -> None:
        """New expiry policies (a configuration reload)."""
        self.expiry_for = expiry_for

    # -- producers -----------------------------------------------------------------------

    def _send(self, gateway: int, record: Send) -> None:
        # A stored message was admitted before the worker stored it.
        if not record.message.seq and not self.admit(gateway, record):
            return
        limit = self.destination_limit
        if limit is not None and limit.reserved:
            limit.made(record.message.destination)  # (its queue is made just below)
        self.received += 1
        self.totals.add(record.message.destination, ENQUEUED)
        self._enqueue(record.message)
        self._receipt(gateway, record.conn, record.receipt)

    def admit(self, gateway: int, record: Send) -> bool:
        """Whether a message fits the limits; if not, a Refuse goes to its producer."""
        message = record.message
        queue = self.queues.get(message.destination)
        size = message.size = message_size(message)
        refusal = self._refusal(message.destination, queue, size, message.persistent)
        if refusal is None:
            return queue is not None or self._admit_new(gateway, record)
        self.outbox.add(gateway, Refuse.of(record.conn, refusal, record.receipt))
        return False

    def _admit_new(self, gateway: int, record: Send) -> bool:
        """A message to a queue that does not exist: within `destination_limit` (else a
        Refuse goes to its producer). A stored one's queue is made once it is stored:
        counted meanwhile (reserved)."""
        limit = self.destination_limit
        destination = record.message.destination
        if limit is None or destination in limit.reserved:
            return True
        if self.refuses_new(gateway, record.conn, destination, record.receipt, "SEND"):
            return False
        if record.message.persistent:
            limit.reserve(destination)
        return True

    def holds(self, destination: str) -> bool:
        return destination in self.queues

    def _stored_ack(
        self, gateway: int, record: Ack | Nack, queue: str, messages: list[Message]
    ) -> None:
        frame = "NACK" if isinstance(record, Nack) else "ACK"
        self._effects.acks.append(
            StoredAck(gateway, record.conn, record.receipt, frame, queue, messages)
        )

    def unsettle(self, queue_name: str, messages: list[Message]) -> None:
        """Acknowledged stored messages whose settlement the store could not record: they
        were not acknowledged after all. Back at the head of their queue, flagged
        redelivered but not counted against `max_redeliveries` (the store failed, not the
        consumer), and counted as held again."""
        queue = self._held_again(queue_name, messages)
        self._dispatch(queue, self._requeue(queue, messages, counted=False))

    def unmove(self, messages: list[Message]) -> None:
        """Stored messages whose move to another queue (a dead-letter queue, an expiry
        redirect) the store could not record: back at the head of their own queue as they
        were, held again. The move is tried again when they next come back or expire."""
        by_queue: dict[str, list[Message]] = {}
        for message in messages:
            by_queue.setdefault(message.destination, []).append(message)
        for queue_name, back in by_queue.items():
            queue = self._held_again(queue_name, back)
            self._dispatch(queue, self._back_at_head(queue, back))

    def _held_again(self, queue_name: str, messages: list[Message]) -> _Queue:
        """Messages that had left their queue's accounting (settled, moved) count in it,
        its quota and its flow control again; returns the queue."""
        queue = self.queues.get(queue_name)
        if queue is None:
            queue = self.queues[queue_name] = _Queue(queue_name)
        queue.held_messages += len(messages)
        self.held_bytes += sum(m.size for m in messages if not m.persistent)
        for message in messages:
            if self.quotas is not None:
                self.quotas.take(queue_name, 1, message.size)
            flow = self.flow_persistent if message.persistent else self.flow_volatile
            if flow is not None:
                flow.add(queue_name, 1, message.size)
        return queue

    def restore(self, message: Message, queue: str = "") -> None:
        """A stored message back in memory (after a restart, or replayed), in `queue`
        (default: its destination), past the limits: it was admitted once already."""
        if not message.size:
            message.size = message_size(message)
        if self.quotas is not None:
            self.quotas.take(queue or message.destination, 1, message.size)
        self._enqueue(message, queue)

    def _enqueue(self, message: Message, queue_name: str = "") -> None:
        name = queue_name or message.destination
        queue = self.queues.get(name)
        if queue is None:
            queue = self.queues[name] = _Queue(name)
        # A message restored already paged (index only) stays so.
        cache = self.index_cache
        if message.seq and cache is not None and not message.paged:
            if self.cached >= cache.max_entries or -1 < cache.max_bytes < self.cached_bytes + len(
                message.body
            ):
                # The headers stay: selectors read them without a trip to the store.
                message = msgspec.structs.replace(message, body=b"", paged=True)
            else:
                self.cached += 1
                self.cached_bytes += len(message.body)
        if queue.lanes:
            queue.add_waiting(message)
        else:
            queue.pending.append(message)  # (the common case, inlined)
        queue.held_messages += 1
        if not message.persistent:
            self.held_bytes += message.size
        flow = self.flow_persistent if message.persistent else self.flow_volatile
        if flow is not None:
            flow.add(name, 1, message.size)
        # Only the lanes holding it can deliver it (every ready consumer's lane was empty).
        if queue.lanes_of:
            self._dispatch(queue, queue.lanes_of.get(id(message), []))
        else:
            self._drain(queue, queue.plain)
        # Still waiting after dispatch, while memory is short: its body goes to disk.
        if (
            self.paging
            and not message.persistent
            and queue.pending.newest(message.priority) is message
        ):
            self._page(queue.name, message)

    def _page(self, queue: str, message: Message) -> bool:
        """Page one waiting message out; False when the pager has no room."""
        assert self.pager is not None
        key = self.pager.put(encode_page(message))
        if key is None:
            return False
        # The message is ours alone while it waits: changed in place (it stays where it
        # waits). Its destination is its queue's name: one string for all of them. The
        # headers stay: selectors read them without a trip to the temp store.
        body_bytes = len(message.body)
        message.body = b""
        message.destination = queue
        message.temp_key = key
        self._paged(queue, body_bytes)
        return True

    def _paged(self, queue: str, nbytes: int) -> None:
        self.held_bytes -= nbytes
        self.paged_bytes += nbytes
        self.paged_messages += 1
        if self.flow_volatile is not None:
            self.flow_volatile.remove(queue, 0, nbytes)

    def _unpaged(self, queue: str, nbytes: int) -> None:
        self.held_bytes += nbytes
        self.paged_bytes -= nbytes
        self.paged_messages -= 1
        if self.flow_volatile is not None:
            self.flow_volatile.add(queue, 0, nbytes)

    def page_out(self, max_bytes: int) -> int:
        """Page out bodies of waiting non-persistent messages, about `max_bytes` of them
        (the newest first, from the longest queues); returns the bytes paged. Stops early
        when the pager has no room."""
        if self.pager is None:
            return 0
        paged = 0
        for queue in sorted(self.queues.values(), key=lambda q: len(q.pending), reverse=True):
            for message in queue.pending.paging_candidates():
                if not self._page(queue.name, message):
                    return paged
                paged += _paged_body_bytes(message)
                if paged >= max_bytes:
                    return paged
        return paged

    def _refusal(
        self, destination: str, queue: _Queue | None, size: int, persistent: bool
    ) -> LimitReached | None:
        """The limit a new message of `size` bytes would break, or None if it fits.

        `max_bytes` bounds the memory of non-persistent messages; persistent ones live in
        the store, their memory bounded by the index cache.
        """
        settings = self.settings
        limit: tuple[str, int] | None = None
        if queue is not None and queue.held_messages >= settings.max_messages:
            limit = ("max_messages", settings.max_messages)
        elif not persistent and self.held_bytes + size > settings.max_bytes:
            limit = ("max_bytes", settings.max_bytes)
        if limit is None:
            return None
        flow = self.flow_persistent if persistent else self.flow_volatile
        if flow is not None and flow.holds(destination):
            # Its producers are stopped: the gateways hold what they send from now on, so
            # this one was in flight when the stop began (sent in good faith). Taken past
            # the limit; what can be in flight is bounded (docs/flow-control-and-memory.md).
            return None
        return LimitReached(
            destination,
            *limit,
            "The message was not accepted. Consume from the queue, or raise the "
            "limit in the broker's [queues] configuration.",
        )

    def _taken_index(self, message: Message, queue: str) -> Message:
        """A message leaves `pending` without being delivered: the cache count moves, a
        paged-out body is forgotten."""
        if message.temp_key:
            assert self.pager is not None
            self.pager.drop(message.temp_key)
            self._unpaged(queue, _paged_body_bytes(message))
            return msgspec.structs.replace(message, temp_key=0)
        if message.seq and not message.paged and self.index_cache is not None:
            self.cached -= 1
            self.cached_bytes -= len(message.body)
        return message

    def _taken(self, message: Message, queue: str) -> Message:
        """A message leaves `pending`: the whole of it, read back from the store (or the
        temp store) if paged."""
        if message.temp_key:
            assert self.pager is not None
            headers, body = decode_page(self.pager.take(message.temp_key))
            self._unpaged(queue, _paged_body_bytes(message))
            return msgspec.structs.replace(message, headers=headers, body=body, temp_key=0)
        if not message.seq:
            return message
        if not message.paged:
            if self.index_cache is not None:
                self.cached -= 1
                self.cached_bytes -= len(message.body)
            return message
        assert self.index_cache is not None
        stored = self.index_cache.load(message.seq)
        return msgspec.structs.replace(
            stored,
            redelivered=message.redelivered,
            deliveries=message.deliveries,
            size=message.size,
            seq=message.seq,
            paged=False,
        )

    # -- consumers -----------------------------------------------------------------------

    def _added(self, consumer: Consumer) -> None:
        queue = self.queues.get(consumer.destination)
        if queue is None:
            queue = self.queues[consumer.destination] = _Queue(consumer.destination)
        queue.consumers.append(consumer)
        selector = consumer.selector
        if selector is None:
            lane = queue.plain
        else:
            lane = queue.lanes.get(selector.text) or queue.open_lane(selector)
        lane.consumers.append(consumer)
        self._drain(queue, lane)

    def _removed(
        self, consumers: list[Consumer], *, requeue_auto: bool, counted: bool = True
    ) -> None:
        """Put the unsettled messages of departed consumers back, then dispatch
        (`counted`: their deliveries count against `max_redeliveries`; see `_requeue`).

        All are out of their queues before anything is dispatched, so messages requeued
        from one can never be handed to another that is going away too.
        """
        touched: dict[str, _Queue] = {}
        refilled: dict[str, list[_Lane]] = {}
        for consumer in consumers:
            queue = self.queues[consumer.destination]
            queue.consumers.remove(consumer)
            lane = queue.lane(consumer)
            lane.consumers.remove(consumer)
            if not lane.consumers and lane is not queue.plain:
                queue.close_lane(lane)
            touched[queue.name] = queue
        for consumer in consumers:
            queue = touched[consumer.destination]
            unsettled = consumer.release_all()
            if consumer.ack_mode == ACK_AUTO and not requeue_auto:
                # Non-persistent: at most once, so they are gone. Persistent: at least
                # once, so they come back.
                self._forget(queue, [m for m in unsettled if not m.persistent])
                unsettled = [m for m in unsettled if m.persistent]
            refilled.setdefault(queue.name, []).extend(
                self._requeue(queue, unsettled, counted=counted)
            )
        for queue in touched.values():
            # Only lanes that got messages back can have new work (nobody else got room).
            self._dispatch(queue, refilled.get(queue.name, []))
            self._drop_if_idle(queue)

    def _settled(
        self, consumer: Consumer, messages: list[Message], *, nack: bool, requeue: bool = True
    ) -> None:
        queue = self.queues[consumer.destination]
        if nack and not requeue:
            self._reject(queue, messages)
            self._drain(queue, queue.lane(consumer))
        elif nack:
            refilled = self._requeue(queue, messages)
            own = queue.lane(consumer)
            self._dispatch(queue, [*refilled, own] if own.selector else refilled)
        else:
            # Settled messages leave the store; the consumer's window has room again
            # (and only its lane can have something for it).
            self._forget(queue, messages)
            self._drain(queue, queue.lane(consumer))

    def _reject(self, queue: _Queue, messages: list[Message]) -> None:
        """NACKed with requeue:false: to the dead-letter queue at once. A queue without one
        (a dead-letter queue itself, a durable subscription's) settles them: the client
        refused them for good."""
        for message in messages:
            if self._has_dead_letter_queue(queue):
                self._dead_letter(queue, _redelivery(message), "rejected: NACK with requeue:false")
            else:
                self._forget(queue, [message])

    def _has_dead_letter_queue(self, queue: _Queue) -> bool:
        # Only named queues have dead-letter queues (not durable subscriptions' own).
        return queue.name.startswith("/queue/") and not _is_dead_letter_queue(
            queue.name, self.settings.dead_letter_prefix
        )

    def _requeue(
        self, queue: _Queue, messages: list[Message], *, counted: bool = True
    ) -> list[_Lane]:
        """Delivered messages come back to the head of the queue, in their order, flagged
        redelivered; returns the selector lanes that got some back.

        A delivery that came back through its consumer (NACK, unsubscribe, a connection
        that ended) is `counted`: a message returned more than `max_redeliveries` times
        goes to the dead-letter queue. One that came back through the broker's own failure
        (an ACK the store could not write, and the connection the broker closed for it)
        is not: a full disk must not dead-letter what consumers accepted. It is flagged
        all the same, in the store too (`flagged`), since it may have reached a client.
        """
        if not counted:
            back = [msgspec.structs.replace(m, redelivered=True) for m in messages]
            self._effects.flagged.extend((queue.name, m.seq) for m in back if m.seq)
            return self._back_at_head(queue, back)
        limit = self.settings.max_redeliveries
        back = []
        for message in messages:
            again = _redelivery(message)
            if 0 <= limit < again.deliveries and self._has_dead_letter_queue(queue):
                reason = f"max_redeliveries {limit} exceeded ({again.deliveries} deliveries)"
                self._dead_letter(queue, again, reason)
            else:
                back.append(again)
        self._effects.returned.extend((queue.name, m.seq) for m in back if m.seq)
        return self._back_at_head(queue, back)

    def _back_at_head(self, queue: _Queue, back: list[Message]) -> list[_Lane]:
        """Messages that were out of the queue wait at its head again, in their order."""
        if self.index_cache is not None:
            # Back with their bodies: they count in the cache again (entries and bytes).
            stored = [m for m in back if m.seq]
            self.cached += len(stored)
            self.cached_bytes += sum(len(m.body) for m in stored)
        return queue.add_waiting_at_head(back)

    def _dead_letter_queue(self, queue: str) -> str:
        return f"/queue/{self.settings.dead_letter_prefix}{queue[len('/queue/') :]}"

    def _dead_letter(self, queue: _Queue, message: Message, reason: str) -> None:
        self.totals.add(queue.name, DEAD_LETTERED)
        dead_letter_queue = self._dead_letter_queue(queue.name)
        headers = {
            **message.headers,
            "original-destination": queue.name,
            "dead-letter-reason": reason,
        }
        copy = msgspec.structs.replace(
            message,
            destination=dead_letter_queue,
            headers=headers,
            seq=0,
            deliveries=0,
            redelivered=False,
        )
        self._move(queue, message, copy, "dead-lettered")

    def _move(self, queue: _Queue, message: Message, copy: Message, outcome: str) -> None:
        """`message` leaves its queue for another (`copy`): a stored one through the store
        (copy stored, then the original settled with `outcome`), others at once."""
        # Sized before it is stored: the copy carries more headers than the original.
        copy.size = message_size(copy)
        # The original leaves its queue: accounted like a settled message.
        queue.held_messages -= 1
        if not message.persistent:
            self.held_bytes -= message.size
        self._flow_left(queue, [message])
        if message.seq:
            self._effects.dead_letters.append((message, copy, outcome))
        else:
            self.enqueue_dead_letters([copy])

    def enqueue_dead_letters(self, messages: list[Message]) -> None:
        """Dead-letter copies join their dead-letter queues (past the queue limits: a
        dead letter is never refused or dropped)."""
        for message in messages:
            if self.quotas is not None:
                self.quotas.take(message.destination, 1, message.size)
            self.totals.add(message.destination, ENQUEUED)
            self._enqueue(message)

    def _forget(self, queue: _Queue, messages: list[Message], *, expired: bool = False) -> None:
        """Messages leave the store: acknowledged (or consumed at most once), or expired."""
        queue.held_messages -= len(messages)
        self.held_bytes -= sum(m.size for m in messages if not m.persistent)
        self._flow_left(queue, messages)
        refs = self._effects.expired if expired else self._effects.settled
        refs.extend((queue.name, m.seq) for m in messages if m.seq)

    def _flow_left(self, queue: _Queue, messages: list[Message]) -> None:
        if self.quotas is not None and messages:
            size = sum(m.size for m in messages)
            self._effects.quota_granted += self.quotas.release(queue.name, len(messages), size)
        for flow, persistent in ((self.flow_volatile, False), (self.flow_persistent, True)):
            if flow is None:
                continue
            gone = [m for m in messages if m.persistent is persistent]
            if gone:
                flow.remove(queue.name, len(gone), sum(m.size for m in gone))

    def evict(self, destination: str) -> list[Message]:
        """Take every waiting message of a queue out of memory WITHOUT settling it (the
        store keeps it: a durable subscription gone inactive, or paged back to its
        store); returns them. Only for a queue without consumers, or whose consumer's
        in-flight messages stay with it."""
        queue = self.queues.get(destination)
        if queue is None:
            return []
        evicted: list[Message] = []
        while queue.pending:
            message = queue.pending.popleft()
            queue.stop_waiting(message, queue.pending)
            # A paged-out body comes back: the caller keeps what it evicts.
            taken = self._taken(message, queue.name) if message.temp_key else message
            evicted.append(self._taken_index(taken, queue.name))
        queue.held_messages -= len(evicted)
        self.held_bytes -= sum(m.size for m in evicted if not m.persistent)
        self._flow_left(queue, evicted)
        self._drop_if_idle(queue)
        return evicted

    def expire_scan(self, now_ms: int) -> int:
        """Remove every waiting message whose time is up; returns how many.

        Delivered, unacknowledged messages are left to their consumer.
        """
        total = 0
        for queue in list(self.queues.values()):
            doomed = {m.message_id for m in queue.pending if 0 < m.expires_ms <= now_ms}
            if doomed:
                removed = list(queue.pending.remove_where(doomed))
                for message in removed:
                    queue.stop_waiting(message, queue.pending)
                self._expire(queue, removed)
                total += len(removed)
                self._drop_if_idle(queue)
        return total

    def _expire(self, queue: _Queue, messages: list[Message]) -> None:
        """Expired messages (just out of `pending`) meet their queue's expiry policy."""
        self.expired += len(messages)
        self.totals.add(queue.name, EXPIRED, len(messages))
        policy = self.expiry_for(queue.name)
        target = policy.destination or self._dead_letter_queue(queue.name)
        if policy.policy == "discard" or (policy.policy == "redirect" and target == queue.name):
            self._forget(queue, [self._taken_index(m, queue.name) for m in messages], expired=True)
            return
        # Logging or moving them needs the whole message, read back if paged.
        whole = [self._taken(m, queue.name) for m in messages]
        if policy.policy == "log":
            self._effects.expiry_log.extend(expired_log_line(m, policy.log_fields) for m in whole)
            self._forget(queue, whole, expired=True)
            return
        for message in whole:
            headers = {
                **message.headers,
                "expired-from": queue.name,
                "dead-letter-reason": f"expired at {message.expires_ms}",
            }
            # It must not expire again where it goes.
            copy = msgspec.structs.replace(
                message,
                destination=target,
                headers=headers,
                expires_ms=0,
                seq=0,
                deliveries=0,
                redelivered=False,
            )
            self._move(queue, message, copy, "expired")

    def _dispatch(self, queue: _Queue, lanes: list[_Lane]) -> None:
        """Hand waiting messages to ready consumers: the plain lane's and `lanes`' (with
        their turns: see `_Queue.turn`)."""
        if not lanes:
            self._drain(queue, queue.plain)
            return
        groups = list(dict.fromkeys(lanes))
        if queue.plain.consumers:
            groups.insert(0, queue.plain)
        start = queue.turn % len(groups)
        queue.turn += 1
        for lane in groups[start:] + groups[:start]:
            self._drain(queue, lane)

    def _drain(self, queue: _Queue, lane: _Lane) -> None:
        """Hand a lane's waiting messages to its ready consumers, round robin."""
        consumers = lane.consumers
        count = len(consumers)
        if not count:
            return
        pending = lane.pending
        plain_only = pending is queue.pending and not queue.lanes
        expiry_on_read = self.settings.expiry_on_read
        misses = 0
        index = lane.next_consumer
        while pending and misses < count:
            consumer = consumers[index % count]
            index += 1
            if not consumer.ready:
                misses += 1
                continue
            misses = 0
            message = pending.popleft()
            if not plain_only:  # (else it was only in `pending`, and is out of it now)
                queue.stop_waiting(message, pending)
            if message.expires_ms and message.expires_ms <= self.now_ms and expiry_on_read:
                # Never deliver an expired message (no need to read it back to drop it).
                self._expire(queue, [message])
                index -= 1  # this consumer was not served
                continue
            message = self._taken(message, queue.name)
            consumer.take(message)
            gateway, conn, sub = consumer.key
            self.outbox.add(gateway, Deliver([(conn, sub)], message))
            self.delivered += 1
        lane.next_consumer = index % count

    def _drop_if_idle(self, queue: _Queue) -> None:
        # Queues are created on first use; forget empty ones so names don't accumulate.
        if not queue.consumers and not queue.pending and not queue.held_messages:
            del self.queues[queue.name]

    # -- introspection -------------------------------------------------------------------

    def stored_in_windows(self) -> list[StoredRef]:
        """Stored messages delivered and not yet settled (in some consumer's window), as
        (queue, seq): what a clean stop counts as delivered."""
        return [
            (c.destination, m.seq)
            for c in self.consumers.values()
            for m in c.unacked.values()
            if m.seq
        ]

    def depth(self, destination: str) -> int:
        """Messages waiting in a queue for a consumer (not counting unacknowledged ones)."""
        queue = self.queues.get(destination)
        return len(queue.pending) if queue else 0
