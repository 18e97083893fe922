"""Publish/subscribe engine: non-persistent topics and their subscribers."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from mpbroker.config import TopicSettings
from mpbroker.errors import LimitReached
from mpbroker.flow import DISCARD, ExpiryPolicy, FlowChange, Level, Watermark, expired_log_line
from mpbroker.records import (
    ACK_AUTO,
    NO_HEADERS,
    Message,
    Refuse,
    Send,
    decode_page,
    encode_page,
    message_size,
)
from mpbroker.selector import Selector, SelectorIndex

from ._common import Consumer, ConsumerKey, Engine, Outbox, no_byte_window
from ._totals import ENQUEUED, EXPIRED, STOPS


class SharedPager(Protocol):
    """Where topic messages waiting for slow subscribers go when memory is short (the
    worker's temp store): their pages (headers and body, records.encode_page). One page
    serves every subscriber waiting for the message."""

    def put(self, page: bytes) -> int | None:
        """Keep `page`; its key, or None when there is no room."""

    def read(self, key: int) -> bytes:
        """The page, kept for the other subscribers."""

    def drop(self, key: int) -> None:
        """Forget a page: no subscriber waits for it any more."""


@dataclass(eq=False, slots=True)
class TopicEffects:
    """What a TopicEngine's work left for its worker beyond the records in its outbox,
    taken once per step with `TopicEngine.take_effects()`."""

    #: Topics whose publishers the live buffer stopped or let go ("": every topic).
    flow_changes: list[FlowChange] = field(default_factory=list)
    #: Lines the `log` expiry policy wrote (WebLogic's format), for the expiry log.
    expiry_log: list[str] = field(default_factory=list)


def _discard(topic: str) -> ExpiryPolicy:
    return DISCARD


def _backlog_length(consumer: Consumer) -> int:
    return len(consumer.pending)


class TopicEngine(Engine):
    """Owns the topics of one pubsub partition: every subscriber gets every message its
    selector selects (all of them without one; see `indexes`).

    A subscriber whose window is full keeps later messages in its own backlog, in order,
    up to `max_pending_messages`; a publish that would overflow a backlog is refused with
    an ERROR naming the limit rather than dropped, unless the topic's publishers are
    stopped (its live buffer's watermark, or the global ones): then it was in flight when
    the stop began, and is taken. One producer's messages reach every subscriber in the
    order sent.
    """

    role = "pubsub"

    def __init__(
        self,
        settings: TopicSettings,
        pipeline: int,
        outbox: Outbox,
        *,
        window_bytes_for: Callable[[str], int] = no_byte_window,
        live_mark_for: Callable[[str], Watermark] | None = None,
        global_live_byte_mark: Watermark | None = None,
        pager: SharedPager | None = None,
        expiry_for: Callable[[str], ExpiryPolicy] = _discard,
        expiry_on_read: bool = True,
    ) -> None:
        """`live_mark_for`: a topic's live-buffer watermarks ([destinations] tables; default
        `topics.live_msg_high/low`). `global_live_byte_mark`: the live buffer's global byte
        watermark as flow control applies it (default `topics.global_live_byte_high/low`;
        off where a temp store pages instead). `pager`: where waiting messages go while
        `paging` is on (flow-to-disk). `expiry_for`: each topic's expiry policy for
        messages whose time is up in the live buffer (`discard`, or `log`; a topic has no
        error destination, so `redirect` logs them too); `expiry_on_read`: such messages are
        dropped when met on their way to a subscriber, not only by `expire_scan`."""
        super().__init__(pipeline, outbox, window_bytes_for)
        self.settings = settings
        self.topics: dict[str, list[Consumer]] = {}
        # Topics with subscribers that have a selector: those without one (every message),
        # and an index of the others, so a message is tested only against subscribers
        # whose indexed condition it meets (publish cost flat in subscribers that do not
        # match). Topics without selectors have neither.
        self.plain: dict[str, list[Consumer]] = {}
        self.indexes: dict[str, SelectorIndex[Consumer]] = {}
        # Per topic, the subscribers with a backlog: all that judging its live buffer (or
        # paging it) needs to look at, however many subscribers it has.
        # (Dicts as ordered sets: paging takes ties in the order backlogs formed.)
        self.backlogged: dict[str, dict[Consumer, None]] = {}
        # The live buffer's watermarks, per topic, on its slowest subscriber's backlog:
        # a level exists only while a topic is near or over its high watermark.
        self.live_mark = Watermark(settings.live_msg_high, settings.live_msg_low)
        # Per topic ([destinations] settings); asked when a topic's level is created.
        self.live_mark_for = live_mark_for or self._default_live_mark
        self.live_levels: dict[str, Level] = {}
        self._effects = TopicEffects()
        # Over all topics: messages waiting in subscribers' backlogs, and its watermark.
        # Bytes are counted once per subscriber waiting (an upper bound of the memory:
        # subscribers share one copy of a message).
        self.live_total = 0
        self.live_bytes = 0
        self.global_live = Level(
            Watermark(settings.global_live_msg_high, settings.global_live_msg_low),
            "global_live_msg_high",
        )
        self.global_live_bytes = Level(
            global_live_byte_mark
            or Watermark(settings.global_live_byte_high, settings.global_live_byte_low),
            "global_live_byte_high",
        )
        # Flow-to-disk: with a `pager`, while `paging` is on, a message left waiting in
        # backlogs is paged out (one page for all of them), and `page_out` moves those
        # already waiting. A paged entry is a stub (no headers, no body, `temp_key`: what
        # order needs, ~300 B, one object for every backlog); `page_refs` counts the
        # backlog entries per key and the message's size. `live_bytes` counts only what
        # is in memory.
        self.pager = pager
        self.paging = False
        self.page_refs: dict[int, list[int]] = {}
        self.paged_bytes = 0  # per entry, as live_bytes counts
        self.expiry_for = expiry_for
        self.expiry_on_read = expiry_on_read
        self.expired = 0  # backlog entries (a message once per subscriber it waited for)
        # Subscribers whose windows got room while they have a backlog (dict: ordered set).
        self._to_drain: dict[Consumer, None] = {}
        if outbox.before_take is not None:
            raise ValueError("the outbox already serves an engine that defers work")
        outbox.before_take = self._drain_together

    def configure_expiry(self, expiry_for: Callable[[str], ExpiryPolicy]) -> None:
        """New expiry policies (a configuration reload)."""
        self.expiry_for = expiry_for

    def take_effects(self) -> TopicEffects:
        """What the engine's work since the last call left for the worker (the drains
        it deferred done first: they change what flow control must say)."""
        self._drain_together()
        effects, self._effects = self._effects, TopicEffects()
        return effects

    def _default_live_mark(self, topic: str) -> Watermark:
        return self.live_mark

    def holds(self, destination: str) -> bool:
        return destination in self.topics

    def _send(self, gateway: int, record: Send) -> None:
        message = record.message
        if not message.size:
            message.size = message_size(message)  # once, for every subscriber's byte window
        topic = message.destination
        if self.expiry_on_read and 0 < message.expires_ms <= self.now_ms:
            # Its time was up before it reached anyone (a ttl shorter than the way here).
            self.received += 1
            self.totals.add(topic, ENQUEUED)
            self._expired(topic, message, self.expiry_for(topic))
            self._receipt(gateway, record.conn, record.receipt)
            return
        index = self.indexes.get(topic)
        subscribers: Sequence[Consumer]
        if index is None:
            subscribers = self.topics.get(topic, ())
        else:
            # A subscriber that does not select the message does not see it at all: not
            # in its window, its backlog, or the live buffer's counts.
            subscribers = [*self.plain.get(topic, ()), *index.matching(message)]
        limit = self.settings.max_pending_messages
        for consumer in subscribers:
            if len(consumer.pending) >= limit and consumer in self._to_drain:
                # Its window got room in this batch: the drain that makes room in its
                # backlog too comes first.
                self._drain_together()
            if len(consumer.pending) >= limit and not (consumer.parked and message.persistent):
                if self._holding(topic):
                    # The gateways hold what its publishers send from now on: this one was
                    # in flight when the stop began. Taken past the limit (the overshoot is
                    # bounded by what can be in flight: docs/flow-control-and-memory.md).
                    break
                refusal = LimitReached(
                    message.destination,
                    "max_pending_messages",
                    limit,
                    f"Subscription {consumer.sub_id!r} has {limit} undelivered messages; "
                    "the message was not published to anyone.",
                )
                self.outbox.add(gateway, Refuse.of(record.conn, refusal, record.receipt))
                return
        self.received += 1
        self.totals.add(topic, ENQUEUED)
        # One Deliver per gateway carries every target there (Outbox.deliver), so a
        # fan-out to many subscribers on one gateway costs one ring record.
        stub: Message | None = None
        outbox = self.outbox
        for consumer in subscribers:
            if consumer.pending or not consumer.ready:
                if consumer.parked and message.persistent:
                    continue  # the store keeps it for that subscription
                if self.paging and stub is None:
                    stub = self._stub(message, consumer.destination) or message
                entry = stub or message
                if not consumer.pending:
                    self.backlogged.setdefault(topic, {})[consumer] = None
                consumer.pending.append(entry)
                self.live_total += 1
                self.live_bytes += message.size
                if entry.temp_key:
                    self._page_ref(entry.temp_key)
                continue
            consumer.take(message)
            gateway_index, conn, sub = consumer.key
            outbox.deliver(gateway_index, conn, sub, message)
            self.delivered += 1
        self._receipt(gateway, record.conn, record.receipt)
        self._check_live(topic, subscribers)

    def _settled(
        self, consumer: Consumer, messages: list[Message], *, nack: bool, requeue: bool = True
    ) -> None:
        # A NACK with requeue:false: a topic has no dead-letter queue, so the subscriber
        # has simply refused them (dropped, as an ACK would).
        if nack and requeue:
            # A non-durable subscriber gets a NACKed message again, before newer ones.
            consumer.pending.extendleft(
                msgspec.structs.replace(m, redelivered=True) for m in reversed(messages)
            )
            self.live_total += len(messages)
            self.live_bytes += sum(m.size for m in messages)
            self.backlogged.setdefault(consumer.destination, {})[consumer] = None
        if nack:
            self._drain(consumer)
            self._check_live(consumer.destination, [consumer])
        elif consumer.pending:
            # Drained with every other subscriber that got room in this batch, when the
            # outbox is taken: together, they share one Deliver record per message and
            # gateway (`_drain_together`).
            self._to_drain[consumer] = None

    def _added(self, consumer: Consumer) -> None:
        topic = consumer.destination
        subscribers = self.topics.setdefault(topic, [])
        subscribers.append(consumer)
        index = self.indexes.get(topic)
        if consumer.selector is None:
            if index is not None:
                self.plain[topic].append(consumer)
            return
        if index is None:
            index = self.indexes[topic] = SelectorIndex()
            self.plain[topic] = [c for c in subscribers if c.selector is None]
        index.add(consumer, consumer.selector)

    # -- durable subscriptions whose subscriber is away --------------------------------------

    def park(
        self,
        key: ConsumerKey,
        name: str,
        topic: str,
        selector: Selector | None,
        waiting: Iterable[Message] = (),
    ) -> None:
        """Keep the non-persistent messages of `topic` that `selector` selects for a
        durable subscription (`name`) whose subscriber is away, from now on: a backlog that
        is never delivered, counted, bounded and paged as a slow subscriber's (JMS 1.1
        6.11: a durable subscriber gets what was published while it was inactive; its
        persistent messages wait in the store). `key`: a key of no gateway. `waiting`:
        messages it holds already, oldest first."""
        consumer = Consumer(key, name, topic, ACK_AUTO, 0, selector=selector, parked=True)
        self.consumers[key] = consumer
        self._added(consumer)
        for message in waiting:
            consumer.pending.append(message)
            self.live_total += 1
            self.live_bytes += message.size
        if consumer.pending:
            self.backlogged.setdefault(topic, {})[consumer] = None
        self._check_live(topic, [consumer])

    def take_parked(self, key: ConsumerKey, before: int | None = None) -> list[Message]:
        """The oldest messages a parked subscription keeps, whole, out of its backlog:
        those published before the persistent message `before` was stored (`kept_after`
        below it), or all (None). Expired ones are dropped on the way."""
        consumer = self.consumers[key]
        pending = consumer.pending
        taken: list[Message] = []
        while pending and (before is None or pending[0].kept_after < before):
            # Never handed over expired, whatever expiry_on_read says: it was never read.
            message = self._leave_backlog(consumer.destination, pending.popleft(), expire=True)
            if message is not None:
                taken.append(message)
        if not pending:
            self._caught_up(consumer)
        self._check_live(consumer.destination, ())
        return taken

    def unpark(self, key: ConsumerKey) -> list[Message]:
        """The subscription is delivered to again (or removed): every message it kept,
        whole and in order; it is no longer parked."""
        taken = self.take_parked(key)
        self._remove([key], requeue_auto=False)
        return taken

    def _leave_backlog(self, topic: str, entry: Message, *, expire: bool) -> Message | None:
        """A backlog entry taken out: the whole message, or None when `expire` and its
        time is up (then it expired, under the topic's policy)."""
        if expire and 0 < entry.expires_ms <= self.now_ms:
            self._expire_entry(topic, entry)
            return None
        message = self._unstub(entry, read=True)
        self.live_total -= 1
        self.live_bytes -= message.size
        return message

    def _drain(self, consumer: Consumer, *, judge: bool = True) -> None:
        """Move backlog into the window while it has room (and judge the topic's live
        buffer after, unless the caller does)."""
        gateway, conn, sub = consumer.key
        moved = bool(consumer.pending)
        expire = self.expiry_on_read
        while consumer.pending and consumer.ready:
            message = self._leave_backlog(
                consumer.destination, consumer.pending.popleft(), expire=expire
            )
            if message is None:
                continue
            consumer.take(message)
            self.outbox.deliver(gateway, conn, sub, message)
            self.delivered += 1
        if moved:
            if not consumer.pending:
                self._caught_up(consumer)
            if judge:
                self._check_live(consumer.destination, ())

    def _drain_together(self) -> None:
        """Drain the subscribers that got room since the outbox was last taken, the one
        furthest behind first. Their backlogs end with the same messages (each entry is
        one object, appended to every backlog at publish), so once the laggard has been
        handed a stretch, the next one's deliveries of the same messages join its Deliver
        records (`Outbox.deliver`: a delivery joins a record past its connection's last):
        one record per message and gateway instead of one per subscriber. Each backlog
        is taken in its order. What differs from draining each as its room came: the
        interleaving of deliveries between subscriptions (also two of one connection),
        and a receipt for a later frame of the same batch comes before the deliveries
        the batch made room for (a DISCONNECT's RECEIPT then ends the connection before
        them: a non-durable subscription ends there anyway). A stop of the live buffer
        is never judged on backlogs still waiting for this drain (`_check_live`)."""
        if not self._to_drain:
            return
        waiting, self._to_drain = self._to_drain, {}
        consumers = self.consumers
        ready = [c for c in waiting if consumers.get(c.key) is c]
        ready.sort(key=_backlog_length, reverse=True)
        for consumer in ready:
            self._drain(consumer, judge=False)
        for topic in {c.destination for c in ready}:
            self._check_live(topic, ())

    def expire_scan(self, now_ms: int) -> int:
        """Drop every backlog entry whose time is up (iBus' live-buffer cleanup); returns
        how many. Messages already in a window are left to their subscriber."""
        total = 0
        for topic, backlogged in list(self.backlogged.items()):
            for consumer in list(backlogged):
                pending = consumer.pending
                if not any(0 < m.expires_ms <= now_ms for m in pending):
                    continue
                keep: deque[Message] = deque()
                for entry in pending:
                    if 0 < entry.expires_ms <= now_ms:
                        self._expire_entry(topic, entry)
                        total += 1
                    else:
                        keep.append(entry)
                consumer.pending = keep
                if not keep:
                    self._caught_up(consumer)
            self._check_live(topic, ())
        return total

    def _expire_entry(self, topic: str, entry: Message) -> None:
        """A backlog entry's time is up: out of the live buffer, under the topic's policy
        (a paged one is read back only when the policy logs it)."""
        policy = self.expiry_for(topic)
        message = self._unstub(entry, read=policy.policy != "discard")  # (live_bytes first)
        self.live_total -= 1
        self.live_bytes -= message.size
        self._expired(topic, message, policy)

    def _expired(self, topic: str, message: Message, policy: ExpiryPolicy) -> None:
        self.expired += 1
        self.totals.add(topic, EXPIRED)
        if policy.policy != "discard":
            self._effects.expiry_log.append(expired_log_line(message, policy.log_fields))

    def _caught_up(self, consumer: Consumer) -> None:
        """`consumer` has no backlog any more."""
        topic = consumer.destination
        backlogged = self.backlogged.get(topic)
        if backlogged is not None:
            backlogged.pop(consumer, None)
            if not backlogged:
                del self.backlogged[topic]

    def _check_live(self, topic: str, grown: Iterable[Consumer] | None = None) -> None:
        """Stop the topic's publishers when its slowest subscriber is `live_msg_high`
        behind; let them go once it is back to `live_msg_low`. The same for every
        publisher when all backlogs together reach `global_live_msg_high` or
        `global_live_byte_high`.

        `grown`: the only subscribers whose backlogs may have grown since the topic was
        last judged (None: any). While the topic has no level, every other backlog is
        known to be below its high watermark, so a publish to a few of many subscribers
        costs only those few."""
        if self._to_drain and self._may_arm(topic, grown):
            # Backlogs whose windows got room in this batch are not drained yet: a stop
            # judged on them now could be one that draining at once never armed.
            self._drain_together()
        count_level, bytes_level = self.global_live, self.global_live_bytes
        before = count_level.armed or bytes_level.armed
        # (Each publish comes here: the reason, a string, is made only when a level moved.)
        moved = count_level.update(self.live_total) is not None
        if bytes_level.update(self.live_bytes) is not None or moved:
            reason = self._global_reason()
            if bool(reason) != before:
                if reason:
                    self.totals.add("", STOPS)  # ("": every topic, as in FlowChange)
                self._effects.flow_changes.append(FlowChange("", reason))
        level = self.live_levels.get(topic)
        if level is None and not self.topics.get(topic):
            return
        judged = self.backlogged.get(topic, ()) if level is not None or grown is None else grown
        deepest = _deepest(judged)
        if level is None:
            mark = self.live_mark_for(topic)
            if not mark.enabled or deepest < mark.high:
                return
            level = self.live_levels[topic] = Level(mark, "live_msg_high")
        change = level.update(deepest)
        if change is True:
            self.totals.add(topic, STOPS)
            self._effects.flow_changes.append(FlowChange(topic, level.reason))
        elif change is False:
            self._effects.flow_changes.append(FlowChange(topic, ""))
            del self.live_levels[topic]

    def _may_arm(self, topic: str, grown: Iterable[Consumer] | None) -> bool:
        """Whether judging the live buffer now could arm a stop (see `_check_live`)."""
        if _would_arm(self.global_live, self.live_total) or _would_arm(
            self.global_live_bytes, self.live_bytes
        ):
            return True
        if topic in self.live_levels or not self.topics.get(topic):
            return False  # armed already, or no subscriber
        judged = self.backlogged.get(topic, ()) if grown is None else grown
        mark = self.live_mark_for(topic)
        return mark.enabled and _deepest(judged) >= mark.high

    # -- flow-to-disk ----------------------------------------------------------------------

    @property
    def held_bytes(self) -> int:
        """Bytes of the live buffer in memory (what paging brings down)."""
        return self.live_bytes

    @property
    def paged_messages(self) -> int:
        return len(self.page_refs)

    def _stub(self, message: Message, topic: str) -> Message | None:
        """`message` paged out, or None when the pager has no room. (`topic`: its
        destination, one string for all stubs.)"""
        assert self.pager is not None
        key = self.pager.put(encode_page(message))
        if key is None:
            return None
        self.page_refs[key] = [0, message.size]
        return msgspec.structs.replace(
            message, destination=topic, headers=NO_HEADERS, body=b"", temp_key=key
        )

    def _page_ref(self, key: int) -> None:
        refs = self.page_refs[key]
        refs[0] += 1
        self.live_bytes -= refs[1]
        self.paged_bytes += refs[1]

    def _unstub(self, message: Message, *, read: bool) -> Message:
        """A backlog entry leaves its backlog: the whole message (if `read`) back in the
        accounting of memory; the body's page goes with its last entry."""
        key = message.temp_key
        if not key:
            return message
        assert self.pager is not None
        refs = self.page_refs[key]
        refs[0] -= 1
        self.live_bytes += refs[1]
        self.paged_bytes -= refs[1]
        headers, body = decode_page(self.pager.read(key)) if read else (NO_HEADERS, b"")
        if not refs[0]:
            del self.page_refs[key]
            self.pager.drop(key)
        return msgspec.structs.replace(message, headers=headers, body=body, temp_key=0)

    def page_out(self, max_bytes: int) -> int:
        """Page out bodies of messages waiting in backlogs, about `max_bytes` of memory;
        returns the bytes freed. Topic by topic (the longest backlogs first): its longest
        backlog picks the messages (the newest after its last paged entry, then those
        before its first), and the topic's other backlogs page the same messages where
        they end (or start) with them, so each body is written once. Entries between two
        paged ones are not looked at, so a long paged backlog is not scanned again."""
        if self.pager is None:
            return 0
        by_topic = {topic: list(backlogs) for topic, backlogs in self.backlogged.items()}
        freed = 0
        for backlogs in sorted(
            by_topic.values(), key=lambda cs: sum(len(c.pending) for c in cs), reverse=True
        ):
            backlogs.sort(key=lambda c: len(c.pending), reverse=True)
            topic = backlogs[0].destination
            lead, others = backlogs[0].pending, [c.pending for c in backlogs[1:]]
            for newest_first in (True, False):
                stubs: dict[int, tuple[Message, Message]] = {}  # id(original) -> it, stub
                got, full = self._page_end(lead, topic, newest_first, stubs, max_bytes - freed)
                freed += got
                for backlog in others:
                    freed += self._page_end(backlog, topic, newest_first, stubs, 0)[0]
                if full or freed >= max_bytes:
                    return freed
        return freed

    def _page_end(
        self,
        backlog: deque[Message],
        topic: str,
        newest_first: bool,
        stubs: dict[int, tuple[Message, Message]],
        budget: int,
    ) -> tuple[int, bool]:
        """Page the entries at one end of `backlog` up to its first paged one: with a
        `budget`, new ones until that many bytes are freed (recorded in `stubs`); without,
        only those already in `stubs`. Returns the bytes freed and whether the pager was
        full."""
        taken: list[Message] = []
        freed = 0
        full = False
        while backlog:
            message = backlog[-1] if newest_first else backlog[0]
            if message.temp_key:
                break
            known = stubs.get(id(message))
            if known is not None:
                stub = known[1]
            elif freed >= budget:
                break
            else:
                fresh = self._stub(message, topic)
                if fresh is None:
                    full = True
                    break
                stub = fresh
                stubs[id(message)] = (message, stub)  # the original kept: its id stays its own
            if newest_first:
                backlog.pop()
            else:
                backlog.popleft()
            self._page_ref(stub.temp_key)
            freed += message.size
            taken.append(stub)
        if newest_first:
            backlog.extend(reversed(taken))
        else:
            backlog.extendleft(reversed(taken))
        return freed, full

    def _holding(self, topic: str) -> bool:
        """Whether the topic's publishers are stopped now (its live buffer, or all)."""
        level = self.live_levels.get(topic)
        return (
            (level is not None and level.armed)
            or self.global_live.armed
            or self.global_live_bytes.armed
        )

    def _global_reason(self) -> str:
        for level in (self.global_live, self.global_live_bytes):
            if level.armed:
                return level.reason
        return ""

    def reconfigure_live(
        self,
        mark: Watermark,
        mark_for: Callable[[str], Watermark],
        global_mark: Watermark,
        global_byte_mark: Watermark,
    ) -> None:
        """New live-buffer watermarks (a configuration reload): topics are judged again."""
        self.live_mark = mark
        self.live_mark_for = mark_for
        self.global_live.mark = global_mark
        self.global_live_bytes.mark = global_byte_mark
        for topic, level in list(self.live_levels.items()):
            level.mark = mark_for(topic)
            self._check_live(topic)
        for topic in self.topics:
            self._check_live(topic)

    def live_stops(self) -> dict[str, str]:
        """Topics whose publishers are stopped now, and why ("" for every topic)."""
        stops = {topic: level.reason for topic, level in self.live_levels.items() if level.armed}
        if reason := self._global_reason():
            stops[""] = reason
        return stops

    def _removed(
        self, consumers: list[Consumer], *, requeue_auto: bool, counted: bool = True
    ) -> None:
        # A non-durable subscription's backlog and window go with it.
        for consumer in consumers:
            self.live_total -= len(consumer.pending)
            for entry in consumer.pending:
                message = self._unstub(entry, read=False)  # (changes live_bytes first)
                self.live_bytes -= message.size
            self._caught_up(consumer)
            topic = consumer.destination
            subscribers = self.topics[topic]
            subscribers.remove(consumer)
            index = self.indexes.get(topic)
            if index is not None:
                if consumer.selector is None:
                    self.plain[topic].remove(consumer)
                else:
                    index.remove(consumer)
                    if not len(index):
                        del self.indexes[topic], self.plain[topic]
            if not subscribers:
                del self.topics[topic]
        for topic in {c.destination for c in consumers}:
            self._check_live(topic, ())


def _would_arm(level: Level, value: int) -> bool:
    """Whether `value` would arm `level`, not armed yet."""
    return not level.armed and level.mark.enabled and value >= level.mark.high


def _deepest(consumers: Iterable[Consumer]) -> int:
    """The longest backlog among `consumers` (0 for none). A loop: every publish asks."""
    deepest = 0
    for consumer in consumers:
        waiting = len(consumer.pending)
        if waiting > deepest:
            deepest = waiting
    return deepest
