"""Shared memory between broker processes: rings, doorbells, the control block, segment names.

- :class:`Ring`: a single-producer single-consumer byte ring in one POSIX shared-memory segment;
  :class:`RingWriter` stages records and publishes them with one counter store,
  :class:`RingReader` copies batches out.
- :class:`Doorbell`, :func:`park`, :func:`park_async`: how a reader with empty rings sleeps and
  how writers wake it.
- :class:`ControlBlock`, :class:`WorkerSlot`: per-worker heartbeat, state and counters, and the
  MemWatch level.
- :class:`AddressCounts`: each gateway's connections per client address, added up by all.
- :func:`segment_name`, :func:`remove_instance`, :func:`sweep_stale`: every entry is named
  ``mpb.<instance>.<purpose>`` so a start can remove what a killed instance left behind.
- :class:`InstanceLock`: the supervisor's lock on ``mpb.<instance>.lock``, held while the
  instance lives (the kernel drops it when the process dies); :func:`sweep_stale` spares an
  instance whose lock is held, or, without a lock file, whose pid exists.

Typical use (names from :func:`segment_name`; the supervisor creates rings, each reading
process creates its own doorbell, writers attach)::

    # writer                                   # reader
    w = Ring.attach(name).writer(              r = Ring.attach(name).reader()
        Doorbell.attach(bell_name))            bell = Doorbell.create(bell_name)
    for kind, payload in batch:                while True:
        if not w.stage(kind, payload):             records = r.read_batch()
            w.put_blocking(kind, payload)          if records:
    w.publish()                                        handle(records)
                                                   else:
                                                       park([r], bell, timeout=0.5)

See docs/architecture.md, "Shared memory", for the traps these modules handle.
"""

from ._addresses import AddressCounts
from ._control import (
    COUNTERS,
    STATE_EMPTY,
    STATE_READY,
    STATE_STARTING,
    STATE_STOPPING,
    ControlBlock,
    WorkerSlot,
    monotonic_ms,
)
from ._doorbell import Doorbell
from ._errors import (
    InstanceLockedError,
    RingBrokenError,
    RingClosedError,
    SegmentExistsError,
    SegmentNotFoundError,
    ShmClosedError,
    ShmError,
    ShmSpaceError,
)
from ._instance import InstanceLock, sweep_stale
from ._naming import SHM_DIR, lock_path, remove_instance, segment_name, shm_path
from ._park import park, park_async
from ._ring import (
    MAX_CAPACITY,
    MAX_KIND,
    MIN_CAPACITY,
    RECORD_HEADER_BYTES,
    Payload,
    Ring,
    RingReader,
    RingStatistics,
    RingWriter,
    record_bytes,
)
from ._stats import StatsBlock

__all__ = [
    "COUNTERS",
    "MAX_CAPACITY",
    "MAX_KIND",
    "MIN_CAPACITY",
    "RECORD_HEADER_BYTES",
    "SHM_DIR",
    "STATE_EMPTY",
    "STATE_READY",
    "STATE_STARTING",
    "STATE_STOPPING",
    "AddressCounts",
    "ControlBlock",
    "Doorbell",
    "InstanceLock",
    "InstanceLockedError",
    "Payload",
    "Ring",
    "RingBrokenError",
    "RingClosedError",
    "RingReader",
    "RingStatistics",
    "RingWriter",
    "SegmentExistsError",
    "SegmentNotFoundError",
    "ShmClosedError",
    "ShmError",
    "ShmSpaceError",
    "StatsBlock",
    "WorkerSlot",
    "lock_path",
    "monotonic_ms",
    "park",
    "park_async",
    "record_bytes",
    "remove_instance",
    "segment_name",
    "shm_path",
    "sweep_stale",
]
