"""Persistent stores: one partition's messages as a sequence of SQLite WAL segment files.

- :class:`MessageStore`: append (one transaction per group-commit batch), settle, delivery
  counts, live messages in delivery order, expiry scan; segments roll by size or age and are
  retired (deleted or archived) when all their messages are settled.
- :class:`TopicStore`: one pubsub partition's durable topic subscriptions: each persistent
  message stored once (in a MessageStore) plus, per durable subscription, a "pending" row
  until it acks; a message is settled once no pending row is left. Its
  :class:`TopicStoreReader` reads a subscription's backlog in :class:`BacklogBatch`es from
  another process (the replay worker) while the owner writes: highest JMS priority first,
  FIFO within a priority, after one cursor per priority.
- :class:`TempStore`: bodies of non-persistent messages paged out of memory (flow-to-disk),
  in allocation units, bounded by `temp_store.limit_bytes`; emptied at every start.
- :class:`CommitBuffer`: the small processing buffer that decides when to group-commit
  (pure: the caller passes the time).
- :class:`StoreError` (:class:`DiskLimitReached`: an append the disk guard refused), and the
  result types (settings: :class:`mpbroker.config.StoreSettings`)
  :class:`StoredMessage`, :class:`SegmentInfo`, :class:`StoreStatistics`.

Typical use in a pipeline worker::

    store = MessageStore.open(data_dir / "p2p-0", config.store)
    for sm in store.live():                 # rebuild the in-memory queues after a restart
        enqueue(sm.seq, sm.message, sm.deliveries)
    buffer = CommitBuffer.for_settings(config.store)   # [store] commit_max_delay_ms, ...
    if buffer.add(send, send.message.size, now_ms):      # or when due_in_ms() reaches 0
        batch = buffer.take()
        seqs = store.append([s.message for s in batch])  # StoreError -> refuse the batch
        ...                                              # then send the receipts
    store.settle([seq], "acked", now_ms)

and in a pubsub worker, for durable subscriptions::

    topics = TopicStore(data_dir / "pubsub-0", data_dir / "pubsub-0-durable.db", config.store)
    topics.recover(now_ms)                  # settle what a crash left owed to nobody
    seqs = topics.append([(message, ["client-1/orders", "client-2/audit"])])
    topics.ack([("client-1/orders", seqs[0])], "acked", now_ms)   # still owed to client-2

See docs/architecture.md, "The life of a message" and "Delivery guarantees".
"""

from ._commit import CommitBuffer
from ._errors import DiskLimitReached, StoreError
from ._segment import CHECKPOINT_PAGES, MIGRATIONS, NEW_SEGMENT_PAGES, PAGE_BYTES
from ._store import (
    MESSAGE_OVERHEAD_BYTES,
    OUTCOMES,
    MessageStore,
    RowWrites,
    SegmentInfo,
    StoredMessage,
    StoreStatistics,
)
from ._temp import TempStatistics, TempStore
from ._topic import (
    PENDING_OVERHEAD_BYTES,
    REGISTRY_MIGRATIONS,
    BacklogBatch,
    TopicStore,
    TopicStoreReader,
)

__all__ = [
    "CHECKPOINT_PAGES",
    "MESSAGE_OVERHEAD_BYTES",
    "MIGRATIONS",
    "NEW_SEGMENT_PAGES",
    "OUTCOMES",
    "PAGE_BYTES",
    "PENDING_OVERHEAD_BYTES",
    "REGISTRY_MIGRATIONS",
    "BacklogBatch",
    "CommitBuffer",
    "DiskLimitReached",
    "MessageStore",
    "RowWrites",
    "SegmentInfo",
    "StoreError",
    "StoreStatistics",
    "StoredMessage",
    "TempStatistics",
    "TempStore",
    "TopicStore",
    "TopicStoreReader",
]
