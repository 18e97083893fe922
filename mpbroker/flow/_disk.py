"""RabbitMQ's `disk_free_limit` for a store's filesystem: stop persistent producers before
the disk is full, so that consumers can always drain. Pure logic: the caller reads the
filesystem (`os.statvfs`) and passes the figures in.

The limit is bytes (`64MiB`) or a share of the filesystem (`5%`). A store does not write
evenly: one append may roll its segment and set off a WAL checkpoint, and several stores
share the data dir's filesystem. So the free space is read before every append (a group
commit, with the segment roll and the checkpoint it may bring), and:

- the append goes only if the filesystem keeps the limit after the most that append can
  take (`append_need`, from its rows) and the most every other store of the data dir may
  be writing meanwhile (their `append_margin`s): `DiskFree.room_for`;
- producers stop (flow control: held, then refused naming `disk_free_limit`) below the
  limit plus the margins of every store of the data dir (this one's included), so that the
  appends of the messages already on their way still fit; only getting back above that by
  a tenth of the limit, at least 1 MiB, lets them go, so a store hovering there does not
  flap.

`append_margin` is what the configuration allows one append to write (group commit's
bounds, the largest frame); `append_need` is the same arithmetic on an append's own rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from mpbroker.config import Config, DiskFreeLimit, MiB

__all__ = [
    "DiskFree",
    "SqliteFiles",
    "append_margin",
    "append_need",
    "commit_pages",
    "pages_for_rows",
]

# The release margin: a tenth of the limit, at least this.
_MIN_MARGIN: Final = MiB

# Every page a transaction writes goes to the WAL as a frame: the page and this header.
WAL_FRAME_HEADER: Final = 24
# A WAL database's shared-memory index (-shm) takes this much per 4096 frames of WAL.
SHM_BYTES: Final = 32 * 1024
# The pages every commit rewrites besides its rows': page 1 (its header counts the
# database's pages), the roots and interior pages above the leaves, the freelist.
COMMIT_FIXED_PAGES: Final = 8
# Per place in a B-tree where a commit inserts rows: the leaf, the one a split adds, and
# the interior page above that takes the new pointer.
PAGES_PER_PLACE: Final = 3


@dataclass(frozen=True, slots=True)
class SqliteFiles:
    """What a store's SQLite files are like (mpbroker.stores sets and exports these)."""

    page_bytes: int
    """PRAGMA page_size."""
    checkpoint_pages: int
    """PRAGMA wal_autocheckpoint: a commit that leaves this many frames in the WAL copies
    them into the database file."""
    new_segment_pages: int
    """The most pages a new segment file has (and frames its creation writes)."""
    message_overhead: int
    """Bytes a stored message takes beyond its counted size (`records.message_size`): its
    message id and destination (up to the length assumed here), integer columns, SQLite's
    record and cell headers, its expiry index entry."""
    pending_overhead: int
    """Bytes a topic store's pending row (a message owed to one durable subscription)
    takes in its registry: its three B-tree entries, with a name of the length assumed."""


def pages_for_rows(rows: Sequence[int], page_bytes: int) -> int:
    """The most pages rows of these sizes (bytes, as stored) fill when appended in key
    order: a row that fits a leaf may leave the rest of its page empty (a page of rows
    just over half a page holds one), so at most twice its size in pages; a larger row
    keeps a part on a leaf (counted so) and fills overflow pages, all but its last."""
    usable = page_bytes
    max_local = usable - 35  # SQLite's largest payload kept whole on a table leaf
    min_local = (usable - 12) * 32 // 255 - 23  # ...and the least it keeps there
    overflow = usable - 4  # an overflow page's payload
    on_leaves = sum(rows)
    pages = 0
    if rows and max(rows) > max_local:  # (the common case is one sum: every append)
        for size in rows:
            if size > max_local:
                surplus = min_local + (size - min_local) % overflow
                local = surplus if surplus <= max_local else min_local
                on_leaves -= size - local
                pages += -(-(size - local) // overflow)
    return pages + -(-2 * on_leaves // page_bytes)


def commit_pages(rows: Sequence[int], places: int, page_bytes: int) -> int:
    """The most pages (WAL frames) one transaction appending `rows` writes, inserting at
    `places` places of the database's B-trees."""
    return pages_for_rows(rows, page_bytes) + PAGES_PER_PLACE * places + COMMIT_FIXED_PAGES


def append_need(commits: Iterable[int], files: SqliteFiles) -> int:
    """The most free space one append takes, from before its segment roll to after its
    checkpoint, given the pages of its commit in each database it writes (`commit_pages`).

    Per database: the commit's frames, appended to its WAL, then the checkpoint that a
    commit may set off, copying into the database file what the WAL holds (fewer than
    `checkpoint_pages` frames from earlier commits, plus this one's: the checkpoint after
    the last commit copied the rest). A roll seals the active segment first (its
    checkpoint copies the same fewer than `checkpoint_pages` frames) and makes a new one:
    written under a temporary name with its own WAL and shared-memory index, then opened
    with another index.
    """
    frame = files.page_bytes + WAL_FRAME_HEADER
    frames = sum(files.checkpoint_pages + 2 * pages for pages in commits)
    new_segment = 2 * files.new_segment_pages * frame + 2 * SHM_BYTES
    return frames * frame + new_segment


def append_margin(config: Config, files: SqliteFiles, *, topic: bool) -> int:
    """The most one append of a queue store (`topic` False) or a topic store may take by
    the configuration (`append_need`).

    A group commit holds fewer than `store.commit_max_bytes` counted bytes before its last
    message, and that one is at most `stomp.max_frame_bytes`; at most
    `commit_max_messages` messages (one without group commit), each stored with
    `message_overhead` more. A topic store also writes each message's pending row (one
    durable subscription per message assumed) to its registry, another WAL database.
    """
    store = config.store
    page = files.page_bytes
    largest = config.stomp.max_frame_bytes + files.message_overhead
    if store.group_commit:
        messages = store.commit_max_messages
        before_last = store.commit_max_bytes - 1 + (messages - 1) * files.message_overhead
    else:
        messages = 1
        before_last = 0
    # The bytes before the last message as rows that fit a leaf: the worst fill.
    leaf = page - 35
    rows = [leaf] * (before_last // leaf) + [before_last % leaf, largest]
    # The messages table and its expiry index.
    commits = [commit_pages(rows, 2, page)]
    if topic:
        pending = messages * files.pending_overhead
        # The pending table and its two indexes.
        commits.append(commit_pages([leaf] * (pending // leaf) + [pending % leaf], 3, page))
    return append_need(commits, files)


class DiskFree:
    """One filesystem against its limit: `update(free, total)` with each reading says
    whether persistent producers are stopped (True), let go (False), or nothing changed
    (None); `room_for` whether an append may be written.

    `margin`: what every store of the filesystem may write between two readings, this
    one's included (producers stop at the limit plus this); `reserved`: the part of it
    the other stores may be writing while this one writes."""

    __slots__ = ("limit", "margin", "reserved", "stopped")

    def __init__(self, limit: DiskFreeLimit, margin: int = 0, reserved: int = 0) -> None:
        self.limit = limit
        self.margin = margin
        self.reserved = reserved
        self.stopped = False

    def stop_point(self, total_bytes: int) -> int:
        """The free space below which producers stop (0: no limit)."""
        limit = self.limit.of(total_bytes)
        return limit + self.margin if limit else 0

    def update(self, free_bytes: int, total_bytes: int) -> bool | None:
        limit = self.limit.of(total_bytes)
        if not limit:
            return None
        stop = limit + self.margin
        if not self.stopped and free_bytes < stop:
            self.stopped = True
            return True
        if self.stopped and free_bytes >= stop + max(limit // 10, _MIN_MARGIN):
            self.stopped = False
            return False
        return None

    def room_for(self, need_bytes: int, free_bytes: int, total_bytes: int) -> bool:
        """Whether a write of at most `need_bytes` keeps the limit while the other stores
        write up to `reserved`."""
        limit = self.limit.of(total_bytes)
        return not limit or free_bytes - need_bytes >= limit + self.reserved
