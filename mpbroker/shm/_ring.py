"""Single-producer single-consumer byte ring in one POSIX shared-memory segment.

Layout (all integers little-endian; x86-64 and aarch64 Linux are little-endian)::

    offset 0     header page (4096 bytes), read as u64 words
                   word 0  magic "mpbRING\\0"     written once at creation (last)
                   word 1  layout version         written once at creation
                   word 2  capacity               written once at creation
                   word 3  incarnation            bumped by each reader that attaches
                   word 8  head  (byte 64)        bytes ever published; writer only
                   word 16 tail  (byte 128)       bytes ever consumed; reader only
                   word 24 reader_waiting (192)   1 while the reader parks; reader only
    offset 4096  data area, ``capacity`` bytes (a power of two, 4096 to 1 GiB)

head, tail and the flag each have a 64-byte cache line to themselves, so the writer's stores to
head do not invalidate the line the reader stores tail to (and vice versa). The header is a whole
page so that the data area can be mapped on its own at offset 0: a record position is then
``counter & (capacity - 1)`` with no base offset to add on every access.

head and tail are free-running byte counters (they never wrap: 2**64 bytes is decades at memory
bandwidth); ``head - tail`` is the number of bytes in use. They are published with one aligned
8-byte store (``memoryview.cast('Q')[i] = v``) and read with one aligned 8-byte load, never with
``struct.pack_into``, which zero-fills its target first so a reader can see 0 mid-write.

Records are ``[u32 length][u32 kind][payload]``, padded to a multiple of 8 bytes. Because the
capacity and every record size are multiples of 8, the 8-byte record header never splits at the
end of the data area; the payload may, and is then copied in two pieces. There are no padding
records. Kind 0 is reserved (a record of kind 0 is treated as corruption).

Fragments (layout version 2): a record is at most a quarter of the ring
(:attr:`Ring.max_record_payload_bytes` = ``capacity / 4 - 8`` bytes of payload), so that one large
record never needs the whole ring to itself. A larger payload is written as a run of fragment
records, each at most that large, which the reader joins back into one payload: callers on both
sides see one record whatever its size, and a payload may be far larger than the ring. The top
two bits of the length word say what a record is; the low 30 bits are its length::

    00 whole record     01 first fragment     10 middle fragment     11 last fragment

A ring is at most 1 GiB, so a whole record's length never reaches the flag bits, and the length
word of a fragment is larger than anything published: the reader's existing check for a record
longer than what was published is what sends fragments off its fast path, at no extra cost.

Every fragment carries the payload's kind. The writer is the only one, so the fragments of one
payload follow each other with no other record in between. The writer waits for room between
fragments as it waits for a record, and the reader consumes fragments as they come (publishes
its tail past them): the writer never needs room for more than one fragment at a time. A payload
whose start was consumed by a reader that then died is lost, as records that reader had copied
out are; its successor skips the remaining fragments. A writer that gives a payload up halfway
(a cancelled ``put``, a timeout, a writer killed) leaves fragments the reader drops: the next
payload it writes in fragments starts with a first fragment, or is not where the rest of the
abandoned one would have to be (whole records in between are returned as usual).

Memory ordering: the writer copies the payload and then stores head; the reader loads head and
then reads the payload; the reader copies records out and then stores tail. x86 (TSO) keeps
these in order. The parking flag is the exception: "reader stores flag, loads head" against
"writer stores head, loads flag" can be reordered even on x86, which is why parking always
re-checks after setting the flag *and* waits with a timeout backstop (see ``_park.park``).
On a weakly ordered CPU (ARM) the data stores could become visible after the head store; pure
Python has no fence, so this module relies on x86-64 ordering (docs/architecture.md, "Traps": on ARM a system call
would have to sit between writing the data and publishing the counter).
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass
from typing import NoReturn

from ._doorbell import Doorbell
from ._errors import RingBrokenError, RingClosedError
from ._segment import create_segment_fd, map_fd, open_segment_fd, unlink_segment

__all__ = [
    "MAX_CAPACITY",
    "MAX_KIND",
    "MIN_CAPACITY",
    "RECORD_HEADER_BYTES",
    "Payload",
    "Ring",
    "RingReader",
    "RingStatistics",
    "RingWriter",
    "record_bytes",
]

MIN_CAPACITY = 4096
"""Smallest ring data area in bytes (one page)."""
MAX_CAPACITY = 1 << 30
"""Largest ring data area in bytes: record lengths must stay below the fragment flag bits."""
RECORD_HEADER_BYTES = 8
"""``[u32 length][u32 kind]`` in front of every payload."""
MAX_KIND = 0xFFFF_FFFF
"""Largest record kind; kinds are 1..MAX_KIND, 0 is reserved."""

HEADER_BYTES = 4096
_MAGIC = int.from_bytes(b"mpbRING\x00", "little")
_LAYOUT_VERSION = 2
_W_MAGIC = 0
_W_VERSION = 1
_W_CAPACITY = 2
_W_INCARNATION = 3
_W_HEAD = 64 // 8
_W_TAIL = 128 // 8
_W_WAITING = 192 // 8

Payload = bytes | bytearray | memoryview
"""What a record payload may be given as (any C-contiguous memoryview format)."""

_RECORD_HEADER = struct.Struct("<II")
# The length word of a record: fragment flag in bits 30-31, length below.
_FLAG_SHIFT = 30
_LENGTH_MASK = (1 << _FLAG_SHIFT) - 1
_FIRST = 1
_MIDDLE = 2
_LAST = 3
# Polling back-off of the blocking puts: short enough that a reader freeing space is noticed
# within a few tens of microseconds when things move fast, long enough at the top that a stuck
# reader costs a sleeping writer almost no CPU.
_BACKOFF_FIRST_S = 50e-6
_BACKOFF_MAX_S = 5e-3


def record_bytes(payload_bytes: int) -> int:
    """Bytes a record with a payload of ``payload_bytes`` occupies in the ring (8-aligned)."""
    return (payload_bytes + RECORD_HEADER_BYTES + 7) & -8


def _check_capacity(capacity_bytes: int) -> None:
    if (
        not isinstance(capacity_bytes, int)
        or not MIN_CAPACITY <= capacity_bytes <= MAX_CAPACITY
        or capacity_bytes & (capacity_bytes - 1)
    ):
        raise ValueError(
            f"ring capacity must be a power of two from {MIN_CAPACITY} to {MAX_CAPACITY} bytes, "
            f"got {capacity_bytes!r}"
        )


@dataclass(frozen=True, slots=True)
class RingStatistics:
    """A snapshot of a ring, as seen by one handle (one process)."""

    capacity: int
    """Size of the data area in bytes."""
    used_bytes: int
    """Bytes published by the writer and not yet consumed by the reader (``head - tail``)."""
    peak_used_bytes: int
    """Largest ``used_bytes`` this handle has observed (when publishing, reading, or now)."""
    head: int
    """Bytes ever published by the writer."""
    tail: int
    """Bytes ever consumed by the reader."""
    incarnation: int
    """How many readers have attached so far (each :meth:`Ring.reader` adds one)."""
    records_written: int
    """Records published through writers of this handle (a fragmented payload counts once)."""
    records_read: int
    """Records returned by readers of this handle (a fragmented payload counts once)."""
    fragments_written: int
    """Fragment records staged by writers of this handle (payloads too large for one record)."""
    fragments_read: int
    """Fragment records consumed by readers of this handle."""
    payloads_dropped: int
    """Fragmented payloads readers of this handle got only part of and dropped: given up by
    the writer halfway, or begun before this reader attached."""


class Ring:
    """A handle on one ring segment. Use :meth:`create` or :meth:`attach`, not the constructor.

    One process writes (through :meth:`writer`), one process reads (through :meth:`reader`);
    neither takes a lock. A ring's messages survive the death of its reader: the successor
    attaches, calls :meth:`reader`, and continues from the published tail.
    """

    name: str
    """posix_ipc name of the segment (``/mpb.<instance>.<purpose>``)."""
    capacity: int
    """Size of the data area in bytes."""
    max_record_payload_bytes: int
    """Largest payload written as one record: ``capacity / 4 - 8``. A larger payload is split
    into fragments of this size, invisibly to callers (payload size has no limit)."""

    def __init__(self, name: str, fd: int, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self.max_record_payload_bytes = capacity // 4 - RECORD_HEADER_BYTES
        self._closed = False
        self._hmm = map_fd(fd, HEADER_BYTES)
        try:
            self._dmm = map_fd(fd, capacity, offset=HEADER_BYTES)
        except BaseException:
            self._hmm.close()
            raise
        self._hmv = memoryview(self._hmm)
        self._hq = self._hmv.cast("Q")
        self._records_written = 0
        self._records_read = 0
        self._fragments_written = 0
        self._fragments_read = 0
        self._payloads_dropped = 0
        self._peak_used = 0

    @classmethod
    def create(cls, name: str, capacity_bytes: int) -> Ring:
        """Create the segment (mode 0600, all pages reserved) and return a handle on it.

        ``capacity_bytes`` must be a power of two >= 4096, else :class:`ValueError`. Raises
        :class:`SegmentExistsError` if the name is taken and :class:`ShmSpaceError` if /dev/shm
        cannot hold it; on any failure nothing is left behind.
        """
        _check_capacity(capacity_bytes)
        fd = create_segment_fd(name, HEADER_BYTES + capacity_bytes, "ring")
        ring = None
        try:
            ring = cls(name, fd, capacity_bytes)
            q = ring._hq
            # The segment starts zeroed (head = tail = incarnation = flag = 0). Magic goes last
            # so that attach() never accepts a half-initialised header.
            q[_W_VERSION] = _LAYOUT_VERSION
            q[_W_CAPACITY] = capacity_bytes
            q[_W_MAGIC] = _MAGIC
        except BaseException:
            if ring is not None:
                ring.close()
            unlink_segment(name)
            raise
        finally:
            os.close(fd)
        return ring

    @classmethod
    def attach(cls, name: str) -> Ring:
        """Open an existing ring.

        Raises :class:`SegmentNotFoundError` if it does not exist and :class:`RingBrokenError`
        if it is not an mpbroker ring of this layout version.
        """
        fd, size = open_segment_fd(name, "ring")
        try:
            if size < HEADER_BYTES:
                raise RingBrokenError(name, f"segment is {size} bytes, smaller than a ring header")
            with mmap.mmap(fd, HEADER_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as hdr:
                magic, version, capacity = struct.unpack_from("<QQQ", hdr, 0)
            if magic != _MAGIC:
                raise RingBrokenError(name, f"bad magic {magic:#018x}: not an mpbroker ring")
            if version != _LAYOUT_VERSION:
                raise RingBrokenError(
                    name, f"layout version {version}, this code reads version {_LAYOUT_VERSION}"
                )
            if not MIN_CAPACITY <= capacity <= MAX_CAPACITY or capacity & (capacity - 1):
                raise RingBrokenError(name, f"header says capacity {capacity}")
            if size != HEADER_BYTES + capacity:
                raise RingBrokenError(
                    name,
                    f"segment is {size} bytes, capacity {capacity} needs {HEADER_BYTES + capacity}",
                )
            return cls(name, fd, capacity)
        finally:
            os.close(fd)

    def writer(self, doorbell: Doorbell | None = None) -> RingWriter:
        """Return the writing end, continuing after the published head.

        ``doorbell`` is the reading process's doorbell (:meth:`Doorbell.attach`); it is rung
        after a publish when the reader said it is parking. Without one, a parked reader only
        notices new records when its park timeout expires.
        """
        self._check_open()
        return RingWriter(self, doorbell)

    def reader(self) -> RingReader:
        """Return the reading end; bumps the incarnation and continues from the published tail.

        Records a previous reader had not consumed (published its tail past) when it died are
        read again by this one. Only one reader may be active at a time.
        """
        self._check_open()
        return RingReader(self)

    def statistics(self) -> RingStatistics:
        """Return a snapshot of the counters (see :class:`RingStatistics`)."""
        self._check_open()
        q = self._hq
        head = q[_W_HEAD]
        tail = q[_W_TAIL]
        # Loaded separately, so a reader may have moved tail past the head loaded before it.
        used = max(0, head - tail)
        self._peak_used = max(self._peak_used, used)
        return RingStatistics(
            capacity=self.capacity,
            used_bytes=used,
            peak_used_bytes=self._peak_used,
            head=head,
            tail=tail,
            incarnation=q[_W_INCARNATION],
            records_written=self._records_written,
            records_read=self._records_read,
            fragments_written=self._fragments_written,
            fragments_read=self._fragments_read,
            payloads_dropped=self._payloads_dropped,
        )

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called on this handle."""
        return self._closed

    def close(self) -> None:
        """Unmap the segment; idempotent. Writers and readers of this handle become unusable
        (:class:`RingClosedError`). The segment itself stays; see :meth:`unlink`."""
        if self._closed:
            return
        self._closed = True
        # Writers and readers hold these very objects: releasing them is what makes any later
        # use fail with ValueError, which they turn into RingClosedError.
        self._hq.release()
        self._hmv.release()
        self._hmm.close()
        self._dmm.close()

    def unlink(self) -> None:
        """Remove the segment name; idempotent. Processes that have it mapped keep working."""
        unlink_segment(self.name)

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"capacity={self.capacity}"
        return f"<Ring {self.name} {state}>"

    def _check_open(self) -> None:
        if self._closed:
            raise RingClosedError(f"ring {self.name} was closed by this process")

    def _fail(self, exc: BaseException) -> NoReturn:
        """Turn the ValueError/TypeError of a released view or closed mmap into
        RingClosedError; re-raise anything else unchanged."""
        self._check_open()
        raise exc


class RingWriter:
    """The writing end of a ring. Only one writer per ring may exist at a time (in all processes).

    Records are staged (copied into the ring, invisible to the reader) and then published all
    at once with a single store of head: publishing per batch is the main speed lever.

    A payload larger than ``max_record_payload_bytes`` goes as fragments (see the module
    docstring). When the ring cannot take all of them now, :meth:`stage` stages those that fit
    and returns False; called again with the *same payload object* and kind (as a caller that
    retries a record that did not fit does), it goes on with the next fragment. Staging any
    other record first abandons the rest: the reader drops the part it got.
    """

    def __init__(self, ring: Ring, doorbell: Doorbell | None) -> None:
        self._ring = ring
        self._q = ring._hq
        self._mm = ring._dmm
        self._cap = ring.capacity
        self._mask = ring.capacity - 1
        self._max = ring.max_record_payload_bytes
        self._doorbell = doorbell
        self._head = self._staged = self._q[_W_HEAD]
        # Cached copy of the reader's tail; refreshed only when the free space it implies is
        # not enough, so the common stage() does not touch the reader's cache line.
        self._tail = self._q[_W_TAIL]
        self._staged_records = 0
        # The fragmented payload under way: the caller's object (compared by identity), its
        # kind, the payload bytes staged so far, and where its last fragment ended (it can
        # only go on if nothing else was staged since).
        self._frag_payload: Payload | None = None
        self._frag_kind = 0
        self._frag_done = 0
        self._frag_end = -1

    @property
    def staged_bytes(self) -> int:
        """Bytes staged and not yet published (record headers and padding included)."""
        return self._staged - self._head

    @property
    def free_bytes(self) -> int:
        """Bytes a new record can use now: capacity minus published-unread and staged bytes."""
        try:
            self._tail = self._q[_W_TAIL]
        except (ValueError, TypeError) as e:
            self._ring._fail(e)
        return self._cap - (self._staged - self._tail)

    def stage(self, kind: int, payload: Payload) -> bool:
        """Append one record after the staged ones, without publishing it.

        Returns True once the whole payload is staged. Returns False if it does not fit in the
        free space now: a payload of at most ``max_record_payload_bytes`` then wrote nothing; a
        larger one staged the fragments that fit, and the next call with the same payload
        object and kind continues it. ``kind`` must be 1..2**32-1 (:class:`ValueError`).
        """
        try:
            if type(payload) is memoryview:
                return self._stage_aside(kind, payload)
            n = len(payload)
            if n > self._max:
                return self._stage_aside(kind, payload)
            if not 0 < kind <= MAX_KIND:
                raise ValueError(f"record kind must be 1..{MAX_KIND}, got {kind!r}")
            staged = self._staged
            end = staged + ((n + 15) & -8)
            cap = self._cap
            if end - self._tail > cap:
                self._tail = self._q[_W_TAIL]
                if end - self._tail > cap:
                    return False
            mm = self._mm
            pos = staged & self._mask
            _RECORD_HEADER.pack_into(mm, pos, n, kind)
            start = (pos + 8) & self._mask
            stop = start + n
            if stop <= cap:
                mm[start:stop] = payload
            else:
                # The payload crosses the end of the data area: copy it in two pieces.
                first = cap - start
                view = memoryview(payload)
                mm[start:cap] = view[:first]
                mm[0 : n - first] = view[first:]
            self._staged = end
            self._staged_records += 1
            return True
        except (ValueError, TypeError) as e:
            self._ring._fail(e)

    def _stage_aside(self, kind: int, payload: Payload) -> bool:
        """stage() off the fast path: a memoryview (len() may count items, not bytes), or a
        payload larger than one record, staged as as many fragments as fit now."""
        if not 0 < kind <= MAX_KIND:
            raise ValueError(f"record kind must be 1..{MAX_KIND}, got {kind!r}")
        view = memoryview(payload)
        if view.format != "B" or view.ndim != 1:
            # len() of a memoryview counts items of its format and shape, not bytes; measuring
            # and copying need a flat byte view (cast() also refuses non-contiguous views).
            view = view.cast("B")
        n = len(view)
        if n <= self._max:
            if not self._stage_record(n, kind, view, n):
                return False
            self._staged_records += 1
            return True
        # The caller's object, not our view of it, says whether this continues a payload.
        if (
            payload is self._frag_payload
            and kind == self._frag_kind
            and self._staged == self._frag_end
        ):
            done = self._frag_done
        else:
            done = 0
        fragments = 0
        while done < n:
            chunk = min(self._max, n - done)
            if done == 0:
                flag = _FIRST
            elif done + chunk == n:
                flag = _LAST
            else:
                flag = _MIDDLE
            if not self._stage_record(flag << _FLAG_SHIFT | chunk, kind, view[done:], chunk):
                break
            done += chunk
            fragments += 1
        self._ring._fragments_written += fragments
        if done == n:
            self._frag_payload = None
            self._staged_records += 1
            return True
        self._frag_payload = payload
        self._frag_kind = kind
        self._frag_done = done
        self._frag_end = self._staged
        return False

    def _stage_record(self, word: int, kind: int, view: memoryview, n: int) -> bool:
        """Stage one record of the first ``n`` bytes of ``view``, its length word ``word``
        (length and fragment flag); False, writing nothing, if it does not fit now."""
        staged = self._staged
        end = staged + ((n + 15) & -8)
        cap = self._cap
        if end - self._tail > cap:
            self._tail = self._q[_W_TAIL]
            if end - self._tail > cap:
                return False
        mm = self._mm
        pos = staged & self._mask
        _RECORD_HEADER.pack_into(mm, pos, word, kind)
        start = (pos + 8) & self._mask
        stop = start + n
        if stop <= cap:
            mm[start:stop] = view[:n]
        else:
            first = cap - start
            mm[start:cap] = view[:first]
            mm[0 : stop - cap] = view[first:n]
        self._staged = end
        return True

    def publish(self) -> None:
        """Make every staged record visible with one store of head; then, if the reader said it
        is parking, ring its doorbell. Nothing staged: nothing happens."""
        staged = self._staged
        if staged == self._head:
            return
        try:
            q = self._q
            q[_W_HEAD] = staged
            self._head = staged
            ring = self._ring
            ring._records_written += self._staged_records
            self._staged_records = 0
            # The tail is on another cache line; loading it here keeps both the cached copy
            # (fewer refreshes in stage) and the peak statistic close to the truth.
            self._tail = tail = q[_W_TAIL]
            if staged - tail > ring._peak_used:
                ring._peak_used = staged - tail
            # Load the flag only after storing head (see the module docstring on ordering).
            if q[_W_WAITING] and self._doorbell is not None:
                self._doorbell.ring()
        except (ValueError, TypeError) as e:
            self._ring._fail(e)

    def try_put(self, kind: int, payload: Payload) -> bool:
        """Stage one record and publish. Returns False if it did not fit (records staged before,
        and the fragments of this one that fitted, are published all the same, so the reader
        can make room; call again with the same payload to go on)."""
        ok = self.stage(kind, payload)
        self.publish()
        return ok

    def put_blocking(self, kind: int, payload: Payload, timeout: float | None = None) -> bool:
        """Stage and publish one record, waiting for room if needed (polling with back-off).

        What is already staged is published *before* waiting: a batch larger than the free
        space would otherwise wait for a reader that cannot see it. A fragmented payload is
        published fragment by fragment as room appears. Returns False if no room for the record
        (or for its next fragment) came within ``timeout`` seconds: nothing of a record of at
        most ``max_record_payload_bytes`` was written then, and the fragments written of a
        larger one are dropped by the reader unless the same payload is put again.
        """
        if self.stage(kind, payload):
            self.publish()
            return True
        self.publish()
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = _BACKOFF_FIRST_S
        while True:
            if deadline is None:
                time.sleep(delay)
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                time.sleep(min(delay, remaining))
            delay = min(delay * 2, _BACKOFF_MAX_S)
            staged = self._staged
            if self.stage(kind, payload):
                self.publish()
                return True
            if self._staged != staged:
                # A fragment went in: publish it, and wait for the next one's room afresh.
                self.publish()
                delay = _BACKOFF_FIRST_S
                if timeout is not None:
                    deadline = time.monotonic() + timeout

    async def put(self, kind: int, payload: Payload) -> None:
        """Trio version of :meth:`put_blocking`, without timeout (wrap in ``trio.move_on_after``).

        Always a checkpoint, as trio's own ``send``. If cancelled while waiting, nothing of this
        record is written (what was staged before was published), except the fragments already
        published of a payload larger than ``max_record_payload_bytes``, which the reader drops
        when the next record starts. Hot loops should call :meth:`stage`/:meth:`try_put` and
        fall back to this only when the ring is full.
        """
        import trio  # lazily: sync pipeline workers never import trio (idle memory budget)

        await trio.lowlevel.checkpoint_if_cancelled()
        if self.stage(kind, payload):
            self.publish()
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        self.publish()
        delay = _BACKOFF_FIRST_S
        while True:
            await trio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX_S)
            staged = self._staged
            if self.stage(kind, payload):
                self.publish()
                return
            if self._staged != staged:
                self.publish()
                delay = _BACKOFF_FIRST_S


class RingReader:
    """The reading end of a ring. Only one reader per ring may be active at a time."""

    def __init__(self, ring: Ring) -> None:
        self._ring = ring
        self._q = q = ring._hq
        self._mm = ring._dmm
        self._cap = ring.capacity
        self._mask = ring.capacity - 1
        self.incarnation: int = q[_W_INCARNATION] + 1
        """The ring's incarnation this reader got (1 for the first reader, and so on)."""
        q[_W_INCARNATION] = self.incarnation
        # A predecessor killed while parked leaves its flag set; ours starts cleared.
        q[_W_WAITING] = 0
        self._tail = tail = q[_W_TAIL]
        head = q[_W_HEAD]
        if not 0 <= head - tail <= self._cap:
            raise RingBrokenError(ring.name, f"head {head} and tail {tail} are inconsistent")
        # The fragmented payload being joined: its pieces so far, its kind, and where its
        # next fragment must start (None: no payload under way).
        self._parts: list[bytes] | None = None
        self._part_kind = 0
        self._part_next = 0

    def has_data(self) -> bool:
        """Whether the writer has published records this reader has not read (a fragment of a
        payload not complete yet counts: :meth:`read_batch` may then return ``[]``)."""
        try:
            return bool(self._q[_W_HEAD] != self._tail)
        except (ValueError, TypeError) as e:
            self._ring._fail(e)

    def set_waiting(self, flag: bool) -> None:
        """Tell the writer whether this reader is parking (then it rings the doorbell)."""
        try:
            self._q[_W_WAITING] = 1 if flag else 0
        except (ValueError, TypeError) as e:
            self._ring._fail(e)

    def read_batch(
        self, max_records: int = 1024, max_bytes: int | None = None
    ) -> list[tuple[int, bytes]]:
        """Copy out up to ``max_records`` published records as ``(kind, payload)`` and publish
        the new tail once. Payload bytes stay within ``max_bytes`` (default: the ring's
        capacity, so a batch is never more than the ring held), except that at least one
        record is returned even if it alone is larger. Returns ``[]`` when the ring is empty.

        A payload written as fragments is returned whole, as one record, once its last fragment
        is read; the fragments before are consumed (their room freed for the writer) as they
        arrive, so a call may consume fragments and return ``[]``. Once its first fragment is
        taken, the rest of a payload is taken whatever ``max_bytes`` says.
        """
        if max_bytes is None:
            max_bytes = self._cap
        try:
            q = self._q
            head = q[_W_HEAD]
            tail = self._tail
            if head == tail:
                return []
            avail = head - tail
            ring = self._ring
            if not 0 < avail <= self._cap:
                raise RingBrokenError(ring.name, f"head {head} and tail {tail} are inconsistent")
            if avail > ring._peak_used:
                ring._peak_used = avail
            mm = self._mm
            mask = self._mask
            cap = self._cap
            unpack = _RECORD_HEADER.unpack_from
            out: list[tuple[int, bytes]] = []
            nbytes = 0
            while True:
                pos = tail & mask
                n, kind = unpack(mm, pos)
                size = (n + 15) & -8
                if size > head - tail or kind == 0:
                    # A fragment's flag bits make its length word larger than any ring, so
                    # fragments come this way too (and whole records stay on the fast path).
                    taken = self._take_fragment(
                        n, kind, tail, head, max_bytes - nbytes if out else None
                    )
                    if taken is None:
                        break
                    tail, whole = taken
                    if whole is not None:
                        out.append((kind, whole))
                        nbytes += len(whole)
                    if tail == head or len(out) >= max_records:
                        break
                    continue
                if out and nbytes + n > max_bytes:
                    break
                start = (pos + 8) & mask
                stop = start + n
                if stop <= cap:
                    out.append((kind, mm[start:stop]))
                else:
                    out.append((kind, mm[start:cap] + mm[0 : stop - cap]))
                tail += size
                nbytes += n
                if tail == head or len(out) >= max_records:
                    break
            q[_W_TAIL] = tail
            self._tail = tail
            ring._records_read += len(out)
            return out
        except (ValueError, TypeError) as e:
            self._ring._fail(e)

    def _take_fragment(
        self, word: int, kind: int, tail: int, head: int, room: int | None
    ) -> tuple[int, bytes | None] | None:
        """Consume the fragment at ``tail`` (its header says ``word``, ``kind``): the new tail,
        and the whole payload if that was its last fragment. None, consuming nothing, if it
        would begin a payload larger than ``room`` (None: no limit). Corruption raises."""
        flag = word >> _FLAG_SHIFT
        n = word & _LENGTH_MASK
        size = (n + 15) & -8
        if not flag or size > head - tail or kind == 0:
            raise RingBrokenError(
                self._ring.name,
                f"record at {tail} claims length {n} kind {kind}"
                + (f" fragment flag {flag}" if flag else "")
                + f", head is {head}",
            )
        if flag == _FIRST and room is not None and n > room:
            return None
        mm = self._mm
        cap = self._cap
        start = (tail + 8) & self._mask
        stop = start + n
        chunk = mm[start:stop] if stop <= cap else mm[start:cap] + mm[0 : stop - cap]
        self._ring._fragments_read += 1
        return tail + size, self._join(flag, kind, chunk, tail)

    def _join(self, flag: int, kind: int, chunk: bytes, at: int) -> bytes | None:
        """Take the fragment found at ring position ``at``; the whole payload after its last."""
        parts = self._parts
        ring = self._ring
        if parts is not None and (flag == _FIRST or at != self._part_next):
            # The writer gave the payload under way up (only it can start another record).
            self._parts = parts = None
            ring._payloads_dropped += 1
        if flag == _FIRST:
            self._parts = [chunk]
            self._part_kind = kind
            self._part_next = at + ((len(chunk) + 15) & -8)
            return None
        if parts is None:
            # The rest of a payload whose start a predecessor of this reader consumed.
            if flag == _LAST:
                ring._payloads_dropped += 1
            return None
        if kind != self._part_kind:
            raise RingBrokenError(
                ring.name, f"fragment at {at} has kind {kind}, its payload kind {self._part_kind}"
            )
        parts.append(chunk)
        if flag == _LAST:
            self._parts = None
            return b"".join(parts)
        self._part_next = at + ((len(chunk) + 15) & -8)
        return None
