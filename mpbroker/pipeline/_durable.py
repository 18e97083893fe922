"""Durable topic subscriptions in a pubsub worker.

Storage (`TopicStore`): one stored row per persistent topic message, plus a pending row
per durable subscription that still has to acknowledge it; the message is settled when
its last pending row goes. A subscription's backlog is its pending rows: nothing of it is
in memory while its subscriber is away.

Delivery: a subscriber coming back starts REPLAYING. Its owner (this worker) asks the
replay worker for the backlog in batches (`ReplayRequest` -> `ReplayBatch`), each read
only when the previous one has mostly been delivered, and keeps those messages in an
in-memory queue of the subscription (`durable:<name>` in the queue engine, which does
windows, acks and redelivery). Messages stored meanwhile are not taken into memory: the
replay reaches them. When a batch finds nothing left and nothing was stored for the
subscription past it, the subscription goes LIVE (in one step of this single-threaded
loop, so nothing falls between replay and live delivery, and nothing comes twice): from
then on new messages go to its queue as they are stored. A live subscriber that falls
more than `topics.max_pending_messages` behind is paged back: its waiting messages leave
memory and it replays again from the store.

Non-persistent messages published while a durable subscriber is away (or replaying) are
kept for it too (JMS 1.1, 6.11), in memory and the temp store, not in the store: the topic
engine holds them in a *parked* subscription (`TopicEngine.park`), a backlog counted,
bounded and paged like a slow subscriber's, so the topic's live-buffer watermarks and
`max_pending_messages` apply. Each carries `kept_after`, the last persistent seq stored
before it: the replay hands it over just before the first persistent message stored after
it, so both kinds arrive in the order they were published. They are lost when the broker
stops or crashes, as non-persistent messages are.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from mpbroker.admin import DurableRow
from mpbroker.clock import epoch_ms
from mpbroker.config import Config
from mpbroker.engine import (
    DEQUEUED,
    EXPIRED,
    ConsumerKey,
    Outbox,
    QueueEffects,
    QueueEngine,
    StoredRef,
    TopicEngine,
)
from mpbroker.errors import AccessDenied
from mpbroker.flow import FlowTracker, expired_log_line, expiry_policies
from mpbroker.records import (
    Ack,
    ConnClosed,
    Credit,
    Hello,
    Message,
    Nack,
    Receipt,
    Record,
    Refuse,
    ReplayBatch,
    ReplayRelease,
    ReplayRequest,
    Send,
    Subscribe,
    Unsubscribe,
    conn_incarnation,
    message_size,
)
from mpbroker.security import ANONYMOUS
from mpbroker.selector import Selector, SelectorError, SelectorIndex, compile_selector
from mpbroker.stores import CommitBuffer, StoreError, TopicStore

from ._acks import CountRetry, WriteFailures, answer_stored_acks, log_store_error
from ._persistence import refuse_unstored

__all__ = ["Durables", "TopicPersistence", "durable_queue"]

log = logging.getLogger("mpbroker.pipeline")
expiry_log = logging.getLogger("mpbroker.expiry")

_QUEUE_PREFIX = "durable:"
PRIORITIES = 10  # JMS priorities 0-9: the replay keeps a position in each


def durable_queue(name: str) -> str:
    """The in-memory queue (of the queue engine) holding a subscription's deliveries."""
    return _QUEUE_PREFIX + name


def _subscription(queue: str) -> str:
    return queue[len(_QUEUE_PREFIX) :]


def _by_subscription(refs: list[StoredRef]) -> list[tuple[str, int]]:
    return [(_subscription(queue), seq) for queue, seq in refs]


def _text(selector: Selector | None) -> str:
    return "" if selector is None else selector.text


def _never_gone(gateway: int, incarnation: int) -> bool:
    return False


def _stored_selector(name: str, text: str | None) -> Selector | None:
    """A stored subscription's selector. One this version cannot compile (stored by
    another) selects everything, loudly: keeping too much beats losing messages."""
    if not text:
        return None
    try:
        return compile_selector(text)
    except SelectorError as exc:
        log.error(
            "durable subscription %r: stored selector %r no longer compiles (%s); "
            "it selects every message until it subscribes again",
            name,
            text,
            exc,
        )
        return None


# A buffered persistent publish: the gateway, the SEND, the subscriptions it is kept for.
_Pending = tuple[int, Send, tuple[str, ...]]


class TopicPersistence:
    """Persistent topic messages kept for durable subscribers: group commit into the
    TopicStore (as QueuePersistence does for queues), acks and expiry written back."""

    def __init__(
        self,
        store: TopicStore,
        outbox: Outbox,
        config: Config,
        subscribed: Callable[[str], bool],
        stored: Callable[[Send, tuple[str, ...], int], None],
        takes_back: Callable[[str], bool],
    ) -> None:
        self.store = store
        self.outbox = outbox
        self.subscribed = subscribed
        self.stored = stored
        # Whether a durable queue still wants messages whose ACK could not be stored.
        self.takes_back = takes_back
        settings = config.store
        self.buffer: CommitBuffer[_Pending] = CommitBuffer.for_settings(settings)
        self.cleanup_batch = settings.cleanup_batch
        self.cleanup_gap_ms = settings.cleanup_gap_ms
        self.scan_interval_ms = int(config.queues.expiry_scan_interval_s * 1000)
        self.next_scan_ms = 0
        self.count_retry = CountRetry()
        self.configure_expiry(config)

    def configure_expiry(self, config: Config) -> None:
        self.expiry_for = expiry_policies(config, owns=lambda destination: False)
        # Reading expired messages back only pays when some topic logs them.
        self.logs_expiry = config.queues.expiry_policy != "discard" or any(
            t.expiry_policy not in (None, "discard")
            for t in config.destinations
            if t.pattern.startswith("/topic/")
        )

    def offer(self, gateway: int, record: Send, names: tuple[str, ...]) -> None:
        if self.buffer.add((gateway, record, names), record.message.size, epoch_ms()):
            self.commit()

    def commit(self) -> None:
        """Store what is buffered in one transaction, then deliver and answer receipts."""
        batch = self.buffer.take()
        if not batch:
            return
        # A subscription removed since the message was buffered no longer wants it.
        entries = [
            (gateway, record, tuple(n for n in names if self.subscribed(n)))
            for gateway, record, names in batch
        ]
        try:
            seqs = self.store.append([(record.message, names) for _, record, names in entries])
        except StoreError as exc:
            refuse_unstored(self.outbox, [(g, r) for g, r, _ in entries], exc)
            return
        for (gateway, record, names), seq in zip(entries, seqs, strict=True):
            self.stored(record, names, seq)
            if record.receipt:
                self.outbox.add(gateway, Receipt(record.conn, record.receipt))

    def due_in_s(self) -> float | None:
        due = self.buffer.due_in_ms(epoch_ms())
        return None if due is None else due / 1000

    def commit_if_due(self) -> None:
        due = self.buffer.due_in_ms(epoch_ms())
        if due is not None and due <= 0:
            self.commit()

    def expire(self, seqs: list[int], now: int) -> None:
        """Stored messages whose time is up, for every subscription (expiry is the
        message's): the `log` policy describes each first. Topics have no error
        destination of their own here, so `redirect` logs them too (noted in the log)."""
        if self.logs_expiry:
            for seq in seqs:
                try:
                    message = self.store.messages.read(seq).message
                except KeyError:
                    continue  # settled meanwhile
                policy = self.expiry_for(message.destination)
                if policy.policy != "discard":
                    expiry_log.info("%s", expired_log_line(message, policy.log_fields))
        self.store.expire(seqs, now)

    def write_back(self, effects: QueueEffects, engine: QueueEngine) -> None:
        """Record what the subscriptions acknowledged, returned and let expire in a step
        (their queue `engine`'s effects), then answer the ACKs and NACKs (a RECEIPT once
        written, else an ERROR: see `answer_stored_acks`); run the store's expiry scan when
        it is due (a batch at a time, `cleanup_gap_ms` apart). What is not written stays
        pending in the store: it comes back after a restart, redelivered."""
        now = epoch_ms()
        store = self.store
        failures = WriteFailures()
        self.count_retry.step(store, now)
        if effects.settled:
            try:
                store.ack(_by_subscription(effects.settled), "acked", now)
            except StoreError as exc:
                log_store_error("recording acknowledgements", exc)
                failures.failed((seq for _, seq in effects.settled), exc, settle=True)
        # A durable subscription has no max_redeliveries: a delivery the broker's failure
        # brought back (`flagged`) is counted like any other.
        returned = effects.returned + effects.flagged
        if returned:
            try:
                store.returned(_by_subscription(returned))
            except StoreError as exc:
                log_store_error("counting deliveries (kept in memory, written later)", exc)
                failures.failed((seq for _, seq in effects.returned), exc, settle=False)
        try:
            if effects.expired:
                store.ack(_by_subscription(effects.expired), "expired", now)
            if self.scan_interval_ms and now >= self.next_scan_ms:
                seqs = store.expired(now, self.cleanup_batch)
                if seqs:
                    self.expire(seqs, now)
                    log.info("expired %d stored topic messages", len(seqs))
                full = len(seqs) == self.cleanup_batch
                self.next_scan_ms = now + (self.cleanup_gap_ms if full else self.scan_interval_ms)
        except StoreError as exc:
            # Still pending in the store: the next scan finds them again.
            log_store_error("settling expired messages", exc)
        answer_stored_acks(engine, self.outbox, effects.acks, failures, self.takes_back)


@dataclass(eq=False)
class _Durable:
    name: str
    topic: str
    # Its JMS selector: only the messages it selects are kept for it (None: all).
    selector: Selector | None = None
    # The user it belongs to ("": nobody, as before there were users).
    owner: str = ""
    consumer: ConsumerKey | None = None
    replaying: bool = False
    request_id: int = 0  # the batch we wait for (0: none asked)
    # Per JMS priority 0-9: the replay continues after this seq (highest priority first).
    after: list[int] = field(default_factory=lambda: [0] * PRIORITIES)
    # Its key in the topic engine while parked (non-persistent messages kept for it);
    # None while it is live.
    parked_key: ConsumerKey | None = None
    # Seqs in the subscriber's window when it was paged back: they stay with it in
    # memory (acked, or returned to its queue), so the replay must not bring them again.
    skip: set[int] = field(default_factory=set)


class Durables:
    """The durable subscriptions of one pubsub partition: their store, their replays, and
    the seam between replay and live delivery (see the module's docstring).

    `flow` is flow control's count of what the topic store holds per topic."""

    def __init__(
        self,
        store: TopicStore,
        topics: TopicEngine,
        queues: QueueEngine,
        outbox: Outbox,
        config: Config,
        pipeline: int,
        incarnation: int,
        flow: FlowTracker,
    ) -> None:
        self.store = store
        self.topics = topics
        self.queues = queues
        self.outbox = outbox
        self.pipeline = pipeline
        self.persistence = TopicPersistence(
            store, outbox, config, lambda name: name in self.subs, self._stored, self._takes_back
        )
        self.subs: dict[str, _Durable] = {}
        # Keys of parked subscriptions in the topic engine: no gateway is -1.
        self._parked_keys = itertools.count(1)
        # Per topic: the subscriptions that want every message, and an index of those
        # with a selector (a publish tests only the ones its indexed values select).
        self.unfiltered: dict[str, set[str]] = {}
        self.selective: dict[str, SelectorIndex[str]] = {}
        selectors = store.selectors()
        owners = store.owners()
        for name, topic in store.subscriptions().items():
            selector = _stored_selector(name, selectors.get(name))
            self._register(_Durable(name, topic, selector, owners.get(name, "")))
        self.active: dict[ConsumerKey, str] = {}
        self.replaying: set[str] = set()
        # Records for our replay worker (`take_replay_records`).
        self._to_replay: list[Record] = []
        # Request ids of different incarnations never collide: a batch asked for by our
        # predecessor is never taken for ours.
        self.last_request = incarnation << 32
        self.redeliver_below = 0
        self.last_stored = 0  # the highest seq stored so far
        self.max_live = config.topics.max_pending_messages
        self.flow = flow
        self.low_water = config.replay.replay_messages // 2
        # Whether an incarnation of a gateway is gone (its process died): the worker's
        # shell tells (`workers.pipeline`); without it, no holder is ever taken for dead.
        self.gateway_gone: Callable[[int, int], bool] = _never_gone
        # Nobody is connected yet: every subscription keeps what is published meanwhile.
        for d in self.subs.values():
            self._park(d)

    def take_replay_records(self) -> list[Record]:
        """Requests and releases for our replay worker since the last call, in order."""
        records, self._to_replay = self._to_replay, []
        return records

    # -- start-up ------------------------------------------------------------------------

    def recover(self) -> int:
        """Clean up after a crash; returns the messages nobody was waiting for any more.

        Anything stored before now may have been delivered before the restart: it is
        replayed as redelivered (at least once, never a silent duplicate).
        """
        orphans = self.store.recover(epoch_ms())
        self.last_stored = max(self.store.messages.live_seqs(), default=0)
        # After a clean stop (`stop_cleanly`) the delivery counts are complete.
        self.redeliver_below = 0 if self.store.messages.stopped_cleanly else self.last_stored + 1
        # What the store holds per topic, from index rows only (no bodies read).
        for stored in self.store.messages.live(full=0):
            self.flow.add(stored.message.destination, 1, stored.message.size)
        self.store.messages.on_settled = self._settled_in_store
        # Our predecessor's places in the replay worker are ours to give back.
        self._to_replay.append(ReplayRelease(self.pipeline))
        return orphans

    def stop_cleanly(self) -> None:
        """The worker stops in order: what is in durable subscribers' windows may have
        reached them, so it counts as delivered; then the store is marked, and the next start
        flags `redelivered` only on what was delivered (after a crash, on everything stored
        before it)."""
        in_windows = _by_subscription(self.queues.stored_in_windows())
        try:
            if in_windows:
                self.store.returned(in_windows)
            self.store.messages.mark_clean_stop()
        except StoreError as exc:
            log.error("store error while stopping (the next start flags every message): %s", exc)

    def stats(self) -> list[DurableRow]:
        """For the admin API: every durable subscription and what it is doing."""
        parked = self.topics.consumers
        windows = self.queues.consumers
        totals = self.queues.totals
        rows = []
        for d in sorted(self.subs.values(), key=lambda d: d.name):
            kept = parked.get(d.parked_key) if d.parked_key is not None else None
            window = windows.get(d.consumer) if d.consumer is not None else None
            counts = totals.of(durable_queue(d.name))
            rows.append(
                DurableRow(
                    name=d.name,
                    topic=d.topic,
                    state="replaying" if d.replaying else "live" if d.consumer else "inactive",
                    kept=0 if kept is None else len(kept.pending),
                    unacknowledged=0 if window is None else len(window.unacked),
                    dequeued=counts[DEQUEUED],
                    expired=counts[EXPIRED],
                )
            )
        if len(totals.counts) > totals.cap:
            totals.prune({durable_queue(name) for name in self.subs})
        return rows

    def _settled_in_store(self, rows: list[tuple[str, int]]) -> None:
        """Stored messages every subscription is done with left the store."""
        for destination, size in rows:
            self.flow.remove(destination, 1, size)

    # -- records -------------------------------------------------------------------------

    def handle(self, gateway: int, record: Record) -> None:
        """Route a gateway's record to the durable subscriptions or the live topic engine."""
        match record:
            case Send():
                self._publish(gateway, record)
            case Subscribe(durable=name) if name:
                self._subscribe(gateway, record, name)
            case Ack() | Nack() | Unsubscribe():
                key = (gateway, record.conn, record.sub)
                if key in self.queues.consumers:
                    self.queues.handle(gateway, record)
                    if isinstance(record, Unsubscribe):
                        self._departed(key if record.remove_durable else None)
                else:
                    self.topics.handle(gateway, record)
            case Credit():
                # Both engines ignore the consumers they do not have.
                self.topics.handle(gateway, record)
                self.queues.handle(gateway, record)
            case ConnClosed() | Hello():
                self.topics.handle(gateway, record)
                self.queues.handle(gateway, record)
                self._departed()
            case _:
                self.topics.handle(gateway, record)

    def replayed(self, batch: ReplayBatch) -> None:
        """A batch of a subscription's backlog, read by the replay worker."""
        d = self.subs.get(batch.name)
        if d is None or d.consumer is None or batch.request_id != d.request_id:
            return  # asked for by a subscriber since gone, or by our predecessor
        d.request_id = 0
        if batch.expired:
            try:
                self.persistence.expire(batch.expired, epoch_ms())
            except StoreError as exc:
                log.error("store error while settling expired messages: %s", exc)
        queue = durable_queue(d.name)
        skip = d.skip
        for message in batch.messages:
            if d.parked_key is not None:
                # The non-persistent messages published before this one come first.
                for kept in self.topics.take_parked(d.parked_key, message.seq):
                    self.queues.restore(kept, queue)
            if message.seq not in skip:
                self.queues.restore(message, queue)
        d.after = [max(a, b) for a, b in zip(d.after, batch.scanned_upto, strict=True)]
        # Caught up: the replay found nothing more, and nothing was stored for the
        # subscription since it looked (we are the only writer, and this is one step).
        if not batch.more and not self.store.pending_after(d.name, d.after):
            self._go_live(d)

    def replayer_restarted(self) -> None:
        """The replay worker lost what it was doing: ask again for what we wait for."""
        for name in self.replaying:
            d = self.subs[name]
            if d.request_id:
                self._request(d)

    def pump(self) -> None:
        """Ask for the next batch of every replaying subscription that runs low."""
        for name in self.replaying:
            d = self.subs[name]
            if not d.request_id and self.queues.depth(durable_queue(name)) <= self.low_water:
                self._request(d)

    # -- publishing ----------------------------------------------------------------------

    def _publish(self, gateway: int, record: Send) -> None:
        message = record.message
        names = self._selecting(message)
        if not names:
            self.topics.handle(gateway, record)
            return
        if message.persistent:
            message.size = message.size or message_size(message)
            # Live non-durable subscribers now; the receipt once the store has it.
            self.topics.handle(gateway, msgspec.structs.replace(record, receipt=""))
            self.persistence.offer(gateway, record, tuple(sorted(names)))
            return
        if len(self.persistence.buffer) and any(self.subs[name].parked_key for name in names):
            # The persistent messages published before it get their seqs first: it is
            # replayed after them.
            self.persistence.commit()
        message.kept_after = self.last_stored
        received = self.topics.received
        # Live subscribers, and the parked subscriptions that keep it.
        self.topics.handle(gateway, record)
        if self.topics.received == received:
            return  # refused (a subscriber's backlog is full): nobody gets it
        for name in names:
            d = self.subs[name]
            if d.parked_key is None:
                self._deliver(d, msgspec.structs.replace(message))

    def _takes_back(self, queue: str) -> bool:
        """Messages whose ACK could not be stored go back to the durable queue only while
        its subscriber is there; otherwise the store keeps them for the replay."""
        d = self.subs.get(_subscription(queue))
        return d is not None and d.consumer is not None

    def _stored(self, record: Send, names: tuple[str, ...], seq: int) -> None:
        """A persistent message is in the store: live subscribers get it now."""
        self.last_stored = seq
        self.flow.add(record.message.destination, 1, record.message.size)
        for name in names:
            d = self.subs.get(name)
            if d is not None and d.consumer is not None and not d.replaying:
                self._deliver(d, msgspec.structs.replace(record.message, seq=seq))

    def _deliver(self, d: _Durable, message: Message) -> None:
        queue = durable_queue(d.name)
        self.queues.restore(message, queue)
        if self.queues.depth(queue) > self.max_live:
            self._page_out(d)

    def _page_out(self, d: _Durable) -> None:
        """A live subscriber fell too far behind: its waiting messages leave memory and
        it replays them from the store; the non-persistent ones wait parked meanwhile
        (with no stored message among them there is no replay: they are dropped, and the
        log says so)."""
        evicted = self.queues.evict(durable_queue(d.name))
        assert d.consumer is not None
        d.skip = {m.seq for m in self.queues.consumers[d.consumer].unacked.values() if m.seq}
        log.info(
            "durable subscription %r is %d messages behind: replaying it from the store",
            d.name,
            len(evicted),
        )
        # Per priority, the replay starts at the first message that left memory; where
        # none did, everything stored so far was delivered (or is in the window).
        after = [self.last_stored] * PRIORITIES
        stored = False
        for message in evicted:
            if message.seq:
                stored = True
                after[message.priority] = min(after[message.priority], message.seq - 1)
        volatile = [m for m in evicted if not m.seq]
        if stored:
            self._park(d, volatile)
            self._replay_from(d, after)
        elif volatile:
            log.warning(
                "durable subscription %r: %d non-persistent messages dropped: its subscriber "
                "is more than topics.max_pending_messages (%d) behind",
                d.name,
                len(volatile),
                self.max_live,
            )

    # -- subscribers ---------------------------------------------------------------------

    def _refuses_new(self, gateway: int, record: Subscribe) -> bool:
        """A new durable subscription is one destination more (broker.max_destinations,
        counted with the topic engine's): refused past the limit, naming its topic."""
        limit = self.topics.destination_limit
        refusal = None if limit is None else limit.refusal(record.destination, "SUBSCRIBE")
        if refusal is None:
            return False
        self.outbox.add(gateway, Refuse.of(record.conn, refusal, record.receipt))
        return True

    def _subscribe(self, gateway: int, record: Subscribe, name: str) -> None:
        key = (gateway, record.conn, record.sub)
        # Its queue holds only what the selector selected: its consumer selects all of it.
        queue_record = msgspec.structs.replace(record, destination=durable_queue(name), selector="")
        d = self.subs.get(name)
        if d is not None and d.consumer == key:
            # Re-registration repeating a Subscribe still in the ring.
            self.queues.handle(gateway, queue_record)
            return
        if d is not None and d.owner and d.owner != record.user:
            # Another application reusing the client-id and name must not read (or by
            # replacing it, delete) this one's backlog.
            refusal = AccessDenied(
                record.user or ANONYMOUS,
                "use",
                f"durable subscription {name!r}",
                "It belongs to another user. Nothing was subscribed.",
            )
            self.outbox.add(gateway, Refuse.of(record.conn, refusal, record.receipt))
            log.warning("%s (it belongs to %s)", refusal.message, d.owner)
            return
        # One subscriber at a time; but one whose gateway died (kill -9), and has not said
        # Hello again yet, is gone: the subscription is free (ActiveMQ, too, lets the next
        # subscriber in once the old connection is known dead).
        if d is not None and d.consumer is not None and not self._held_by_the_dead(gateway, d):
            self.outbox.add(
                gateway,
                Refuse(
                    record.conn,
                    f"durable subscription {name!r} is already active",
                    "A durable subscription has one subscriber at a time.",
                    record.receipt,
                ),
            )
            return
        selector = self.queues.selector_of(gateway, record)
        if record.selector and selector is None:
            return  # refused
        if d is None and self._refuses_new(gateway, record):
            return
        if d is None or d.topic != record.destination or _text(d.selector) != record.selector:
            if d is not None:
                # The same name on another topic, or with another selector, replaces the
                # old subscription and drops its backlog (JMS 1.1, 6.11.1).
                log.info(
                    "durable subscription %r on %s with selector %r replaced by one on %s "
                    "with selector %r",
                    name,
                    d.topic,
                    _text(d.selector),
                    record.destination,
                    record.selector,
                )
                self._remove(d)
            try:
                self.store.subscribe(name, record.destination, record.selector, record.user)
            except StoreError as exc:
                self.outbox.add(
                    gateway,
                    Refuse(
                        record.conn,
                        exc.client_text,
                        "The durable subscription was not created.",
                        record.receipt,
                    ),
                )
                return
            d = _Durable(name, record.destination, selector, record.user)
            self._register(d)
            # Until its first (empty) replay ends, like any subscription that replays.
            self._park(d)
            log.info(
                "durable subscription %r on %s created%s",
                name,
                d.topic,
                f" with selector {record.selector!r}" if selector else "",
            )
        elif not d.owner and record.user:
            # Made before there were users: the first user to subscribe takes it.
            try:
                self.store.claim(name, record.user)
            except StoreError as exc:
                self.outbox.add(
                    gateway,
                    Refuse(record.conn, exc.client_text, "Nothing was subscribed.", record.receipt),
                )
                return
            d.owner = record.user
            log.info("durable subscription %r now belongs to %s", name, record.user)
        self.queues.handle(gateway, queue_record)
        d.consumer = key
        self.active[key] = name
        self._replay_from(d, [0] * PRIORITIES)

    def _held_by_the_dead(self, gateway: int, d: _Durable) -> bool:
        """Whether `d`'s subscriber is on a gateway that died (asked of `gateway_gone`
        only when another gateway wants `d`: a gateway sending is alive). Then every
        subscriber of that gateway is dropped now, as its successor's Hello would drop
        them, and `d` is inactive."""
        assert d.consumer is not None
        dead, conn, _ = d.consumer
        incarnation = conn_incarnation(conn)
        if dead == gateway or not self.gateway_gone(dead, incarnation):
            return False
        log.info(
            "durable subscription %r: gateway %d (incarnation %d), which held it, is gone: "
            "dropping its consumers now",
            d.name,
            dead,
            incarnation,
        )
        # What a Hello of its successor does to the engines: the gateway's consumers are
        # all of that incarnation (a successor's come after its Hello in the ring, and
        # the Hello drops the holder).
        hello = Hello(dead, incarnation + 1)
        self.topics.handle(dead, hello)
        self.queues.handle(dead, hello)
        self._departed()
        return True

    def _register(self, d: _Durable) -> None:
        self.subs[d.name] = d
        if d.selector is None:
            self.unfiltered.setdefault(d.topic, set()).add(d.name)
        else:
            self.selective.setdefault(d.topic, SelectorIndex()).add(d.name, d.selector)

    def _unregister(self, d: _Durable) -> None:
        del self.subs[d.name]
        names = self.unfiltered.get(d.topic)
        if names is not None:
            names.discard(d.name)
            if not names:
                del self.unfiltered[d.topic]
        index = self.selective.get(d.topic)
        if index is not None:
            index.remove(d.name)
            if not len(index):
                del self.selective[d.topic]

    def _selecting(self, message: Message) -> set[str]:
        """The durable subscriptions that want `message` (on its topic, selected)."""
        topic = message.destination
        names = self.unfiltered.get(topic, set())
        index = self.selective.get(topic)
        if index is None:
            return names
        return names.union(index.matching(message))

    def _departed(self, removed: ConsumerKey | None = None) -> None:
        """Subscriptions whose subscriber went away become inactive (`removed`: that
        subscriber's subscription is removed, with its backlog)."""
        for key, name in list(self.active.items()):
            if key in self.queues.consumers:
                continue
            d = self.subs[name]
            self._deactivate(d)
            if key == removed:
                self._remove(d)

    def _deactivate(self, d: _Durable) -> None:
        # Its unacknowledged messages were returned (counted in the store); all of it
        # leaves memory: the backlog stays on disk, and the non-persistent messages wait
        # parked, in order (those already in its queue first).
        evicted = self.queues.evict(durable_queue(d.name))
        self._park(d, [m for m in evicted if not m.seq])
        if d.replaying:
            self._to_replay.append(ReplayRelease(self.pipeline, d.name))
            self.replaying.discard(d.name)
        assert d.consumer is not None
        del self.active[d.consumer]
        d.consumer = None
        d.replaying = False
        d.request_id = 0
        d.skip = set()

    def _remove(self, d: _Durable) -> None:
        # Publishes still in the commit buffer were picked for this subscription: stored
        # now, they go with it. (Left there, their rows would go to a subscription made
        # under the same name afterwards, whose selector or topic may not want them.)
        self.persistence.commit()
        if d.consumer is not None:
            self._deactivate(d)
        dropped = len(self._unpark(d))
        if dropped:
            log.info("durable subscription %r: %d non-persistent messages dropped", d.name, dropped)
        self._unregister(d)
        try:
            dropped = self.store.unsubscribe(d.name, epoch_ms())
        except StoreError as exc:
            log.error("store error while removing durable subscription %r: %s", d.name, exc)
            return
        log.info("durable subscription %r removed with %d waiting messages", d.name, dropped)

    # -- replay --------------------------------------------------------------------------

    def _replay_from(self, d: _Durable, after: list[int]) -> None:
        d.replaying = True
        d.after = after
        self.replaying.add(d.name)
        self._request(d)

    def _request(self, d: _Durable) -> None:
        self.last_request += 1
        d.request_id = self.last_request
        self._to_replay.append(
            ReplayRequest(self.pipeline, d.name, d.request_id, d.after, self.redeliver_below)
        )

    def _go_live(self, d: _Durable) -> None:
        d.replaying = False
        self.replaying.discard(d.name)
        self._to_replay.append(ReplayRelease(self.pipeline, d.name))
        d.skip = set()
        for message in self._unpark(d):
            self._deliver(d, message)

    def _park(self, d: _Durable, waiting: list[Message] | None = None) -> None:
        """Keep the non-persistent messages published for `d` from now on (and `waiting`,
        already kept, oldest first) until it is live again (`_unpark`)."""
        if d.parked_key is not None:
            if not waiting:
                return
            # Already parked (it was replaying): `waiting` goes before what it keeps.
            waiting = waiting + self._unpark(d)
        d.parked_key = key = (-1, 0, next(self._parked_keys))
        self.topics.park(key, d.name, d.topic, d.selector, waiting or ())

    def _unpark(self, d: _Durable) -> list[Message]:
        """What `d` kept while parked, oldest first; it is no longer parked."""
        key, d.parked_key = d.parked_key, None
        return [] if key is None else self.topics.unpark(key)
