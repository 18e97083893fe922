"""The publish/subscribe pipeline: the topics of one partition.

Non-persistent publishes go to the subscribers connected now (the topic engine; a slow
subscriber's backlog is its live buffer, paged to the temp store while memory is short).
Persistent ones are also stored for the topic's durable subscriptions (the topic store),
whose subscribers get them live, or replayed by the replay worker when they come back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mpbroker.admin import TopicWorkerStats, topic_worker_stats
from mpbroker.config import Config
from mpbroker.engine import Engine, Outbox, QueueEngine, TopicEngine
from mpbroker.flow import (
    STORE_LIVE,
    STORE_TOPICS,
    ExpiryPolicy,
    FlowChange,
    FlowTracker,
    Watermark,
    destination_limits,
    expiry_policies,
    store_limits,
)
from mpbroker.records import Barrier, FlowState, Record, ReplayBatch, ReplayHello, Send
from mpbroker.stores import TempStore, TopicStore

from ._base import Pipeline
from ._disk import DiskWatch
from ._durable import Durables
from ._paging import VolatilePaging, live_byte_mark, topic_paging_mark

__all__ = ["PubSubPipeline"]

log = logging.getLogger("mpbroker.pipeline")
# The expiry policy `log`: one line per expired message, in WebLogic's format.
expiry_log = logging.getLogger("mpbroker.expiry")


# Topics whose live-buffer watermarks are remembered, forgotten all at once beyond this.
_MARKS_REMEMBERED = 4096


def _live_marks(config: Config) -> Callable[[str], Watermark]:
    """A topic's live-buffer watermarks: its [destinations] table's, or topics.live_*."""
    default = Watermark(config.topics.live_msg_high, config.topics.live_msg_low)
    # Asked for every message published (the topic engine judges its live buffer each
    # time): the [destinations] patterns are matched once per topic.
    known: dict[str, Watermark] = {}

    def mark_for(topic: str) -> Watermark:
        mark = known.get(topic)
        if mark is not None:
            return mark
        table = config.destination(topic)
        if table is None or table.live_msg_high is None or table.live_msg_low is None:
            mark = default
        else:
            # High and low are set together in a table (the config refuses half a pair).
            mark = Watermark(table.live_msg_high, table.live_msg_low)
        if len(known) >= _MARKS_REMEMBERED:
            known.clear()
        known[topic] = mark
        return mark

    return mark_for


def _topic_expiry(config: Config) -> Callable[[str], ExpiryPolicy]:
    """Per topic: its expiry policy for the live buffer ([destinations] over [queues]).
    A topic has no error destination of its own, so `redirect` logs, as for stored topic
    messages (TopicPersistence)."""
    return expiry_policies(config, owns=lambda destination: False)


class PubSubPipeline(Pipeline):
    """The topics of one partition: `store` keeps persistent messages for durable
    subscriptions, `temp_store` (None: no paging) the live buffer paged out of memory."""

    role = "pubsub"

    def __init__(
        self,
        index: int,
        incarnation: int,
        gateways: int,
        config: Config,
        store: TopicStore,
        temp_store: TempStore | None,
    ) -> None:
        outbox = Outbox()
        windows = config.consumer_window_bytes
        self.topics = TopicEngine(
            config.topics,
            index,
            outbox,
            window_bytes_for=windows,
            live_mark_for=_live_marks(config),
            global_live_byte_mark=live_byte_mark(config),
            pager=temp_store,
            expiry_for=_topic_expiry(config),
            expiry_on_read=config.queues.expiry_on_read,
        )
        self._live_flow_changes: list[FlowChange] = []
        paging = None
        if temp_store is not None:
            paging = VolatilePaging(self.topics, temp_store, config, topic_paging_mark)
        # The durable subscriptions' own queues: windows, acks and redelivery.
        queues = QueueEngine(config.queues, index, outbox, window_bytes_for=windows)
        disk = DiskWatch(store.messages, config, topic=True)
        super().__init__(index, incarnation, gateways, config, outbox, queues, paging, disk)
        self.flow_stored = FlowTracker(
            store_limits(config.topic_store), destination_limits(config, STORE_TOPICS)
        )
        self.durables = Durables(
            store, self.topics, queues, outbox, config, index, incarnation, self.flow_stored
        )
        # Topics with subscribers (durable ones away included) and durable subscriptions
        # count against broker.max_destinations; the durable subscriptions' own queues
        # are theirs, not more.
        topics, durables = self.topics, self.durables
        topics.destination_limit = self.destination_limit
        self.destination_limit.count_with(lambda: len(topics.topics) + len(durables.subs))

    @property
    def engine(self) -> Engine:
        return self.topics

    @property
    def flow_trackers(self) -> list[tuple[str, FlowTracker]]:
        return [(STORE_TOPICS, self.flow_stored)]

    def recover(self) -> None:
        orphans = self.durables.recover()
        if orphans:
            log.info("settled %d stored topic messages no subscription wanted", orphans)

    def replayed(self, record: Record) -> None:
        """A record from the replay worker's ring."""
        durables = self.durables
        if isinstance(record, ReplayBatch):
            durables.replayed(record)
        elif isinstance(record, ReplayHello):
            if record.incarnation > 0:
                log.info("replay worker %d restarted: asking again", record.worker)
            durables.replayer_restarted()

    def take_replay_records(self) -> list[Record]:
        """Records for the replay worker since the last call, in order."""
        return self.durables.take_replay_records()

    def due_in_s(self) -> float | None:
        return self.durables.persistence.due_in_s()

    def statistics(self, title: str, pid: int, at_ms: int) -> TopicWorkerStats:
        temp = self.paging.statistics() if self.paging is not None else None
        return topic_worker_stats(
            title,
            pid,
            at_ms,
            self.topics,
            self.queue_engine,
            self.flow_trackers,
            self.durables.stats(),
            temp,
            self.destination_limit.refused,
        )

    def close(self, *, clean: bool = False) -> None:
        if clean:
            self.durables.stop_cleanly()
        self.durables.store.close()
        if self.paging is not None:
            self.paging.close()

    def _handle(self, gateway: int, record: Record) -> None:
        if isinstance(record, Barrier):
            # A barrier answers for every earlier frame: commit those first, and answer
            # the acknowledgements before it (see P2PPipeline._handle).
            self.durables.persistence.commit()
            self._write_back()
        elif isinstance(record, Send):
            durables = self.durables
            topic = record.message.destination
            if topic not in durables.unfiltered and topic not in durables.selective:
                # No durable subscription on the topic: the live engine's alone (as
                # Durables.handle decides, without its interpreted frames per message).
                self.topics.handle(gateway, record)
                return
        self.durables.handle(gateway, record)

    def _take_topic_effects(self) -> None:
        """The topic engine's effects: expiry log lines written, stop changes kept for
        the announcement."""
        effects = self.topics.take_effects()
        for line in effects.expiry_log:
            expiry_log.info("%s", line)
        self._live_flow_changes += effects.flow_changes

    def _step(self) -> None:
        self._take_topic_effects()
        durables = self.durables
        durables.pump()
        durables.persistence.commit_if_due()
        self._write_back()

    def _write_back(self) -> None:
        """The durable queues' effects since the last time: written and answered."""
        effects = self.queue_engine.take_effects()
        self.durables.persistence.write_back(effects, self.queue_engine)
        # The durable subscriptions' queues never dead-letter (they are not /queue/ names),
        # have no quota and expire through the topic store: were that to change, say so.
        if effects.dead_letters or effects.quota_granted or effects.expiry_log:
            log.error(
                "durable queues left work nobody does: %d dead letters, %d quota grants, "
                "%d expiry log lines",
                len(effects.dead_letters),
                len(effects.quota_granted),
                len(effects.expiry_log),
            )

    def _engines(self) -> list[Engine]:
        return [self.topics, self.queue_engine]

    def _reconfigure(self, config: Config) -> None:
        self.flow_stored.reconfigure(
            store_limits(config.topic_store), destination_limits(config, STORE_TOPICS)
        )
        topics = config.topics
        self.topics.reconfigure_live(
            Watermark(topics.live_msg_high, topics.live_msg_low),
            _live_marks(config),
            Watermark(topics.global_live_msg_high, topics.global_live_msg_low),
            live_byte_mark(config),
        )
        self.durables.persistence.configure_expiry(config)
        self.topics.configure_expiry(_topic_expiry(config))

    def _flow_in_force_extra(self) -> list[FlowState]:
        return [
            FlowState(self.index, STORE_LIVE, topic, reason)
            for topic, reason in self.topics.live_stops().items()
        ]

    def _flow_changes_extra(self) -> list[FlowState]:
        self._take_topic_effects()  # (more since the step, after a reload)
        changes, self._live_flow_changes = self._live_flow_changes, []
        return [
            FlowState(self.index, STORE_LIVE, change.destination, change.reason)
            for change in changes
        ]
