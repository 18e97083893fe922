"""LiveSet: the seqs and sizes of a segment's unsettled messages, a few bytes per message.

The store needs, per segment, which messages are still unsettled and their sizes (byte
totals for statistics and limits, membership for settle, retirement when none is left). A
`dict[int, int]` costs about 100 bytes a message (hash slot plus two int objects), so an
inactive subscription's backlog of a few million messages would pin hundreds of MiB in the
worker. Seqs of a segment are dense: they are appended in order, without gaps, while it is
the active segment, and only ever removed afterwards. So a base seq, one flag byte and one
size slot per seq suffice: 5 bytes a message (9 once a size needs 64 bits).

Pure data structure, no I/O. Memory follows the span from the oldest live seq to the newest:
the prefix of settled seqs is dropped once it is the larger half (so a segment consumed in
order shrinks as it goes), and everything is freed when the last live seq is removed.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import ClassVar, Final

__all__ = ["LiveSet"]

# 'I' is 4 bytes on every platform CPython supports; sizes are message bytes, bounded by the
# frame limit, so 64-bit slots are only taken when a size does not fit.
_SMALL: Final = "I"
_LARGE: Final = "Q"
_SMALL_MAX: Final = (1 << (8 * array(_SMALL).itemsize)) - 1
_LARGE_MAX: Final = (1 << (8 * array(_LARGE).itemsize)) - 1


class LiveSet:
    """A set of seqs, each with a size, for seqs that are added in ascending order.

    `extend()` adds seqs past every seq added so far (gaps are allowed, a slot each);
    `discard()` removes one. Length and the total size are kept up to date, so both are
    O(1). Iteration is ascending; do not change the set while iterating over it.
    """

    __slots__ = ("_base", "_count", "_flags", "_head", "_sizes", "_total")

    # Dropping a settled prefix copies the rest; below this many seqs it is not worth a copy.
    # A class attribute so tests can exercise trimming with small sets.
    trim_min: ClassVar[int] = 4096

    def __init__(self) -> None:
        self._base = 0  # the seq of slot 0
        self._flags = bytearray()  # slot i: 1 if seq base + i is live, else 0
        self._sizes = array(_SMALL)  # slot i: size of seq base + i (meaningless if not live)
        self._count = 0  # live slots; 0 iff there are no slots at all
        self._total = 0  # sum of the sizes of the live slots
        self._head = 0  # the first live slot (when count > 0)

    @classmethod
    def from_items(cls, items: Iterable[tuple[int, int]]) -> LiveSet:
        """A LiveSet of `(seq, size)` pairs given in ascending seq order (e.g. the rows of a
        segment read at open, settled ones left out)."""
        live = cls()
        # One extend() per run of consecutive seqs: a segment opened at start-up is mostly
        # runs, and this is called for every row of it.
        first = 0
        run: list[int] = []
        for seq, size in items:
            if seq != first + len(run):
                live.extend(first, run)
                first, run = seq, []
            run.append(size)
        live.extend(first, run)
        return live

    def extend(self, first: int, sizes: Sequence[int]) -> None:
        """Add seqs `first`, `first + 1`, ... with `sizes`.

        Unless the set is empty, `first` must lie past every seq added since it last was:
        ValueError otherwise, or for a size out of range, and nothing changes.
        """
        n = len(sizes)
        if n == 0:
            return
        lo, hi = min(sizes), max(sizes)
        if lo < 0 or hi > _LARGE_MAX:
            raise ValueError(f"size out of range 0..{_LARGE_MAX}: {lo if lo < 0 else hi}")
        if self._count == 0:
            self._base = first
        end = self._base + len(self._flags)
        if first < end:
            raise ValueError(f"seq {first}: seqs up to {end - 1} were already added")
        if hi > _SMALL_MAX and self._sizes.typecode == _SMALL:
            self._sizes = array(_LARGE, self._sizes)
        gap = first - end
        if gap:
            self._flags.extend(bytes(gap))
            self._sizes.frombytes(bytes(gap * self._sizes.itemsize))
        if isinstance(sizes, array) and sizes.typecode != self._sizes.typecode:
            sizes = sizes.tolist()  # array.extend() takes only an array of its own kind
        self._sizes.extend(sizes)
        self._flags.extend(b"\x01" * n)
        self._count += n
        self._total += sum(sizes)

    def discard(self, seq: int) -> bool:
        """Remove `seq`; False (and nothing changes) when it is not in the set."""
        i = seq - self._base
        flags = self._flags
        if i < 0 or i >= len(flags) or not flags[i]:
            return False
        flags[i] = 0
        self._count -= 1
        self._total -= self._sizes[i]
        if self._count == 0:
            self._clear()
        elif i == self._head:
            self._head = head = flags.find(1, i + 1)
            if head >= self.trim_min and 2 * head >= len(flags):
                del flags[:head]
                del self._sizes[:head]
                self._base += head
                self._head = 0
        return True

    def _clear(self) -> None:
        # New empty objects: the old buffers are freed (also back to 32-bit size slots).
        self._flags = bytearray()
        self._sizes = array(_SMALL)
        self._count = 0
        self._total = 0
        self._head = 0

    @property
    def total_size(self) -> int:
        """Sum of the sizes of the seqs in the set."""
        return self._total

    def __contains__(self, seq: object) -> bool:
        if not isinstance(seq, int):
            return False
        i = seq - self._base
        return 0 <= i < len(self._flags) and self._flags[i] == 1

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[int]:
        base = self._base
        return itertools.compress(range(base, base + len(self._flags)), self._flags)

    def __repr__(self) -> str:
        return f"LiveSet(len={self._count}, total_size={self._total})"
