"""The control block: one segment with a broker-wide header and one slot per worker.

Layout (u64 words, little-endian)::

    offset 0    header line 0: magic "mpbCTRL\\0", layout version, slot count, slot size
    offset 64   header line 1: memwatch_level, config_generation,
                memwatch_permille                                 supervisor only
    offset 128  slot 0, SLOT_BYTES long                    its worker only
    ...         slot i at 128 + i * SLOT_BYTES

A slot (256 bytes = 4 cache lines, so two workers never write the same cache line)::

    word 0 pid, 1 incarnation, 2 state, 3 heartbeat_ms, 4..7 reserved,
    words 8..23 the 16 general counters, 24..31 reserved

Every field has exactly one writing process, so no locks are needed (docs/architecture.md, "Traps": a lock whose
holder is killed stays taken). Fields are stored and loaded as aligned 8-byte words, never with
``struct.pack_into`` (it zero-fills first, so a reader could see 0 mid-write).
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from typing import NoReturn

from ._errors import ShmClosedError, ShmError
from ._segment import create_segment_fd, map_fd, open_segment_fd, unlink_segment

__all__ = [
    "COUNTERS",
    "SLOT_BYTES",
    "STATE_EMPTY",
    "STATE_READY",
    "STATE_STARTING",
    "STATE_STOPPING",
    "ControlBlock",
    "WorkerSlot",
    "monotonic_ms",
]

STATE_EMPTY = 0
"""No worker has used the slot yet (or the supervisor cleared it)."""
STATE_STARTING = 1
"""The worker runs but is not serving yet."""
STATE_READY = 2
"""The worker is serving."""
STATE_STOPPING = 3
"""The worker is draining before a clean exit."""

COUNTERS = 16
"""Number of general-purpose u64 counters per slot."""
SLOT_BYTES = 256
"""Bytes per slot: four cache lines, room to add fields without a layout change."""

_HEADER_BYTES = 128
_MAGIC = int.from_bytes(b"mpbCTRL\x00", "little")
_LAYOUT_VERSION = 1
_W_MAGIC = 0
_W_VERSION = 1
_W_SLOTS = 2
_W_SLOT_BYTES = 3
_W_MEMWATCH = 64 // 8
_W_CONFIG_GENERATION = 64 // 8 + 1
_W_MEMWATCH_PERMILLE = 64 // 8 + 2
_SLOT_WORDS = SLOT_BYTES // 8
_S_PID = 0
_S_INCARNATION = 1
_S_STATE = 2
_S_HEARTBEAT = 3
_S_COUNTER0 = 8


def monotonic_ms() -> int:
    """CLOCK_MONOTONIC in milliseconds: system-wide on Linux, so comparable across processes."""
    return time.monotonic_ns() // 1_000_000


class ControlBlock:
    """A handle on the control block segment. Use :meth:`create` or :meth:`attach`."""

    name: str
    """posix_ipc name of the segment."""
    slot_count: int
    """Number of worker slots."""

    def __init__(self, name: str, fd: int, slot_count: int) -> None:
        self.name = name
        self.slot_count = slot_count
        self._closed = False
        self._mm = map_fd(fd, _HEADER_BYTES + slot_count * SLOT_BYTES)
        self._mv = memoryview(self._mm)
        self._q = self._mv.cast("Q")

    @classmethod
    def create(cls, name: str, slots: int) -> ControlBlock:
        """Create the segment (mode 0600, pages reserved) with ``slots`` zeroed worker slots.

        Raises :class:`SegmentExistsError` if the name is taken and :class:`ShmSpaceError` if
        /dev/shm cannot hold it; on failure nothing is left behind.
        """
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"control block needs at least 1 slot, got {slots!r}")
        fd = create_segment_fd(name, _HEADER_BYTES + slots * SLOT_BYTES, "control block")
        block = None
        try:
            block = cls(name, fd, slots)
            q = block._q
            q[_W_VERSION] = _LAYOUT_VERSION
            q[_W_SLOTS] = slots
            q[_W_SLOT_BYTES] = SLOT_BYTES
            q[_W_MAGIC] = _MAGIC  # last, so attach never accepts a half-initialised header
        except BaseException:
            if block is not None:
                block.close()
            unlink_segment(name)
            raise
        finally:
            os.close(fd)
        return block

    @classmethod
    def attach(cls, name: str) -> ControlBlock:
        """Open an existing control block.

        Raises :class:`SegmentNotFoundError` if it does not exist and :class:`ShmError` if it is
        not an mpbroker control block of this layout version.
        """
        fd, size = open_segment_fd(name, "control block")
        try:
            if size < _HEADER_BYTES:
                raise ShmError(f"control block {name}: segment is {size} bytes, too small")
            with mmap.mmap(fd, _HEADER_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as hdr:
                magic, version, slots, slot_bytes = struct.unpack_from("<QQQQ", hdr, 0)
            if magic != _MAGIC:
                raise ShmError(f"control block {name}: bad magic {magic:#018x}, not ours")
            if version != _LAYOUT_VERSION or slot_bytes != SLOT_BYTES:
                raise ShmError(
                    f"control block {name}: layout version {version} with {slot_bytes}-byte "
                    f"slots, this code reads version {_LAYOUT_VERSION} with {SLOT_BYTES}"
                )
            if size < _HEADER_BYTES + slots * SLOT_BYTES:
                raise ShmError(f"control block {name}: {size} bytes cannot hold {slots} slots")
            return cls(name, fd, slots)
        finally:
            os.close(fd)

    def slot(self, index: int) -> WorkerSlot:
        """The slot of worker ``index`` (0-based); :class:`IndexError` if out of range."""
        self._check_open()
        if not 0 <= index < self.slot_count:
            raise IndexError(f"slot {index} out of range: control block has {self.slot_count}")
        return WorkerSlot(self, index)

    @property
    def memwatch_level(self) -> int:
        """MemWatch level published by the supervisor (0, 1, 2, ...); only it writes this."""
        try:
            return int(self._q[_W_MEMWATCH])
        except ValueError as e:
            self._fail(e)

    @memwatch_level.setter
    def memwatch_level(self, level: int) -> None:
        try:
            self._q[_W_MEMWATCH] = level
        except ValueError as e:
            self._fail(e)

    @property
    def memwatch_permille(self) -> int:
        """MemWatch's last reading in thousandths of max_memory (0 before the first); the
        supervisor only writes this."""
        try:
            return int(self._q[_W_MEMWATCH_PERMILLE])
        except ValueError as e:
            self._fail(e)

    @memwatch_permille.setter
    def memwatch_permille(self, permille: int) -> None:
        try:
            self._q[_W_MEMWATCH_PERMILLE] = permille
        except ValueError as e:
            self._fail(e)

    @property
    def config_generation(self) -> int:
        """Bumped by the supervisor after it reloaded the configuration (SIGHUP): workers
        that see a new value read the reloaded settings. Only the supervisor writes this."""
        try:
            return int(self._q[_W_CONFIG_GENERATION])
        except ValueError as e:
            self._fail(e)

    @config_generation.setter
    def config_generation(self, generation: int) -> None:
        try:
            self._q[_W_CONFIG_GENERATION] = generation
        except ValueError as e:
            self._fail(e)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called on this handle."""
        return self._closed

    def close(self) -> None:
        """Unmap the segment; idempotent. Slots of this handle become unusable."""
        if self._closed:
            return
        self._closed = True
        self._q.release()
        self._mv.release()
        self._mm.close()

    def unlink(self) -> None:
        """Remove the segment name; idempotent."""
        unlink_segment(self.name)

    def __enter__(self) -> ControlBlock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ShmClosedError(f"control block {self.name} was closed by this process")

    def _fail(self, exc: BaseException) -> NoReturn:
        self._check_open()
        raise exc


class WorkerSlot:
    """One worker's slot. Each field is written by that worker only (and cleared by the
    supervisor only while no worker owns the slot); anyone may read."""

    def __init__(self, block: ControlBlock, index: int) -> None:
        self._block = block
        self._q = block._q
        self.index = index
        """Slot number in the control block."""
        self._base = (_HEADER_BYTES // 8) + index * _SLOT_WORDS

    def _get(self, word: int) -> int:
        try:
            return int(self._q[self._base + word])
        except ValueError as e:
            self._block._fail(e)

    def _set(self, word: int, value: int) -> None:
        try:
            self._q[self._base + word] = value
        except ValueError as e:
            self._block._fail(e)

    @property
    def pid(self) -> int:
        """Process id of the worker that owns the slot (0: none yet)."""
        return self._get(_S_PID)

    @pid.setter
    def pid(self, value: int) -> None:
        self._set(_S_PID, value)

    @property
    def incarnation(self) -> int:
        """How many times a worker has started in this slot."""
        return self._get(_S_INCARNATION)

    @incarnation.setter
    def incarnation(self, value: int) -> None:
        self._set(_S_INCARNATION, value)

    @property
    def state(self) -> int:
        """One of ``STATE_EMPTY``, ``STATE_STARTING``, ``STATE_READY``, ``STATE_STOPPING``."""
        return self._get(_S_STATE)

    @state.setter
    def state(self, value: int) -> None:
        self._set(_S_STATE, value)

    @property
    def heartbeat_ms(self) -> int:
        """Last heartbeat, :func:`monotonic_ms` of the worker (comparable across processes)."""
        return self._get(_S_HEARTBEAT)

    @heartbeat_ms.setter
    def heartbeat_ms(self, value: int) -> None:
        self._set(_S_HEARTBEAT, value)

    def beat(self) -> int:
        """Store ``monotonic_ms()`` as the heartbeat and return it."""
        now = monotonic_ms()
        self._set(_S_HEARTBEAT, now)
        return now

    def counter(self, i: int) -> int:
        """General counter ``i`` (0..15)."""
        return self._get(self._counter_word(i))

    def set_counter(self, i: int, value: int) -> None:
        """Set general counter ``i`` (0..15) to ``value`` (0..2**64-1)."""
        self._set(self._counter_word(i), value)

    def add_counter(self, i: int, n: int = 1) -> int:
        """Add ``n`` to general counter ``i`` and return the new value (single writer: a plain
        load and store is enough)."""
        word = self._counter_word(i)
        value = self._get(word) + n
        self._set(word, value)
        return value

    @staticmethod
    def _counter_word(i: int) -> int:
        if not 0 <= i < COUNTERS:
            raise IndexError(f"counter {i} out of range 0..{COUNTERS - 1}")
        return _S_COUNTER0 + i

    def __repr__(self) -> str:
        return f"<WorkerSlot {self.index} of {self._block.name}>"
