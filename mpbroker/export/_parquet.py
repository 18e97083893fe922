"""Parquet files of the export (pyarrow, imported only here and only when called).

A file is written batch by batch (a row group each) under a hidden temporary name
(``.NAME.tmp``: Spark and pyarrow's dataset readers skip names starting with a dot), fsynced
and renamed into place when complete.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import heapq
import itertools
import os
from array import array
from bisect import bisect_left
from collections.abc import Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ._errors import ExportError
from ._schema import (
    COLUMNS,
    PENDING,
    READABLE_SCHEMA_VERSIONS,
    SCHEMA_VERSION,
    UPDATE_COLUMNS,
    Column,
)

__all__ = [
    "INSTALL_HINT",
    "KIND_KEY",
    "ROWS",
    "SCHEMA_KEY",
    "UPDATES",
    "ParquetOut",
    "PendingKeys",
    "RowCounts",
    "SeqSet",
    "arrow_schema",
    "check_file",
    "count_rows",
    "pending_keys",
    "temporary_name",
    "update_seqs",
    "use_system_allocator",
]

SCHEMA_KEY: Final = b"mpbroker.export.schema_version"
SOURCE_KEY: Final = b"mpbroker.export.source"
# What a file holds: row files (no key: schema version 1 wrote only those) or update files.
KIND_KEY: Final = b"mpbroker.export.kind"
ROWS: Final = "rows"
UPDATES: Final = "updates"

INSTALL_HINT: Final = (
    "mpbroker export needs pyarrow: pip install -e '.[export]' in the mpbroker checkout "
    "(or '.[spark]' for the Spark job too, or pip install 'pyarrow>=14')"
)
# The columns the lookup of pending rows reads from a row file (never the body).
_KEY_COLUMNS: Final = ("seq", "message_id", "destination", "timestamp", "segment", "outcome")
_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _pa() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise ExportError("pyarrow", INSTALL_HINT) from None
    return pyarrow


def _pq() -> Any:
    _pa()
    import pyarrow.parquet

    return pyarrow.parquet


def use_system_allocator() -> None:
    """Have Arrow allocate with the C library's malloc rather than its default (mimalloc),
    for a process whose memory is bounded: mimalloc keeps what Arrow freed reserved for
    reuse, per thread, and the export's memory settled about 20 MB higher with it
    (measured on a million rows); malloc gives large blocks back as they are freed."""
    pa = _pa()
    pa.set_memory_pool(pa.system_memory_pool())


def temporary_name(path: Path) -> Path:
    """Where `path` is written before it is complete (hidden from dataset readers)."""
    return path.with_name(f".{path.name}.tmp")


def _schema(columns: Sequence[Column], kind: str, source: str) -> Any:
    pa = _pa()
    types = {
        "string": pa.string(),
        "bool": pa.bool_(),
        "int8": pa.int8(),
        "int32": pa.int32(),
        "int64": pa.int64(),
        "binary": pa.binary(),
        "timestamp[ms, UTC]": pa.timestamp("ms", tz="UTC"),
        "map<string, string>": pa.map_(pa.string(), pa.string()),
    }
    fields = [pa.field(c.name, types[c.type], nullable=c.nullable) for c in columns]
    metadata = {
        SCHEMA_KEY: str(SCHEMA_VERSION).encode(),
        KIND_KEY: kind.encode(),
        SOURCE_KEY: source.encode(),
    }
    return pa.schema(fields, metadata=metadata)


def arrow_schema(include_body: bool, source: str = "", kind: str = ROWS) -> Any:
    """The Arrow schema of a row file (or, with ``kind=UPDATES``, of an update file)."""
    if kind == UPDATES:
        return _schema(UPDATE_COLUMNS, UPDATES, source)
    columns = [c for c in COLUMNS if include_body or c.name != "body"]
    return _schema(columns, ROWS, source)


class ParquetOut:
    """One Parquet file written batch by batch, a row group per batch; `commit` makes it
    appear whole, `abort` (or leaving the `open` context by an exception) leaves nothing.

    Written for bounded memory (measured on a million rows, in what the process holds
    beyond what it held before): gathering batches into bigger row groups cost 7 MB more
    per 2 MB of row group; dictionary encoding of every column 8 MB more than of the few
    with few distinct values; and every row group's statistics stay in memory until the
    file is closed, so only the columns a reader prunes by keep them.
    """

    STATISTICS: Final = ("destination", "timestamp", "outcome", "seq", "store", "segment")
    DICTIONARY: Final = ("destination", "kind", "outcome", "store")

    def __init__(self, path: Path, schema: Any) -> None:
        self.path = path
        self.schema = schema
        self.rows = 0
        self._tmp = temporary_name(path)
        self._writer: Any = None

    @classmethod
    @contextlib.contextmanager
    def open(cls, path: Path, schema: Any) -> Iterator[ParquetOut]:
        out = cls(path, schema)
        try:
            yield out
        except BaseException:
            out.abort()
            raise

    def write(self, rows: Sequence[dict[str, object]]) -> None:
        """Append `rows` (dicts keyed by column name) as a row group."""
        if not rows:
            return
        pa = _pa()
        # Arrow's own row-to-column conversion: 40 % faster than a list per column in Python.
        table = pa.Table.from_pylist(list(rows), schema=self.schema)
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            names = set(self.schema.names)
            self._writer = _pq().ParquetWriter(
                self._tmp,
                self.schema,
                compression="zstd",
                use_dictionary=[c for c in self.DICTIONARY if c in names],
                write_statistics=[c for c in self.STATISTICS if c in names],
            )
        self._writer.write_table(table, row_group_size=table.num_rows)
        self.rows += len(rows)

    def commit(self) -> bool:
        """Close, fsync and rename into place; False (and no file) when no row was written."""
        if self._writer is None:
            return False
        self._writer.close()
        self._writer = None
        with open(self._tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(self._tmp, self.path)
        return True

    def abort(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        self._tmp.unlink(missing_ok=True)


def check_file(path: Path) -> str:
    """The kind of export file `path` is (`ROWS` or `UPDATES`); ExportError naming it unless
    it is an export file of a schema version this code reads."""
    pq = _pq()
    try:
        schema = pq.read_schema(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for a bad footer
        raise ExportError(path, f"damaged or not a Parquet file ({exc})") from None
    metadata = schema.metadata or {}
    version = metadata.get(SCHEMA_KEY)
    if version is None:
        raise ExportError(path, "a Parquet file not written by mpbroker export (foreign file)")
    if version.decode(errors="replace") not in {str(v) for v in READABLE_SCHEMA_VERSIONS}:
        raise ExportError(
            path,
            f"schema version {version.decode(errors='replace')!r} unknown"
            f" (this mpbroker writes {SCHEMA_VERSION})",
        )
    kind: str = metadata.get(KIND_KEY, ROWS.encode()).decode(errors="replace")
    if kind not in (ROWS, UPDATES):
        raise ExportError(path, f"unknown kind of export file {kind!r}")
    return kind


def _unreadable(path: Path, exc: Exception) -> ExportError:
    """The ExportError for an export file that could not be read: one line naming it."""
    if isinstance(exc, FileNotFoundError):
        return ExportError(path, "missing (the manifest lists it)")
    # pyarrow's messages can run over several lines (a thrift error, then what failed) and
    # quote the damaged bytes.
    text = "".join(c if c.isprintable() else " " for c in str(exc))
    detail = " ".join(text.split()) or type(exc).__name__
    return ExportError(path, f"damaged, cannot be read ({detail})")


def _read_batches(path: Path, columns: list[str], batch_size: int) -> Iterator[Any]:
    """The record batches of `columns` of an export file; ExportError naming it when it is
    missing or a page of it cannot be read (a footer can be whole and a data page not)."""
    pq = _pq()
    try:
        batches = iter(pq.ParquetFile(path).iter_batches(columns=columns, batch_size=batch_size))
    except Exception as exc:  # pyarrow raises OSError, ArrowInvalid, ... for a bad file
        raise _unreadable(path, exc) from None
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as exc:  # as above, for a bad data page
            raise _unreadable(path, exc) from None
        yield batch


@dataclass(frozen=True, slots=True)
class RowCounts:
    """What the manifest records of a row file, counted from the file."""

    rows: int
    pending: int
    """Rows whose outcome is pending."""
    max_seq: int
    """The highest seq in it (0 for a file without rows)."""


def count_rows(path: Path) -> RowCounts:
    """Rows, pending rows and highest seq of a row file (reading every page of its `seq`
    and `outcome` columns); ExportError naming it when it is missing or damaged."""
    rows = pending = max_seq = 0
    for batch in _read_batches(path, ["seq", "outcome"], 65_536):
        seqs = batch.column(0).to_pylist()
        rows += len(seqs)
        max_seq = max(max_seq, max(seqs, default=0))
        pending += batch.column(1).to_pylist().count(PENDING)
    return RowCounts(rows, pending, max_seq)


@dataclass(frozen=True, slots=True)
class PendingKeys:
    """Rows of a row file still pending, as the lookup needs them."""

    seq: list[int]
    message_id: list[str]
    destination: list[str]
    timestamp_ms: list[int]
    segment: list[int]


class SeqSet:
    """A set of seqs in 8 bytes each (a sorted ``array('q')``, looked up by bisection):
    a Python set of ints takes about 57 bytes per seq, 55 MiB for a segment of a million
    rows, beyond what the batches of `--max-memory` account for."""

    __slots__ = ("_seqs",)

    def __init__(self, *runs: Iterable[int]) -> None:
        """The seqs of `runs`: each is usually ascending already (an update file is
        written in seq order), so they are merged, without a Python int per seq at once."""
        ordered = [r if isinstance(r, array) else array("q", r) for r in runs]
        ordered = [r if _ascending(r) else array("q", sorted(r)) for r in ordered if r]
        if len(ordered) == 1 and _ascending(ordered[0], strictly=True):
            self._seqs = ordered[0]
            return
        self._seqs = array("q")
        for seq in heapq.merge(*ordered):
            if not self._seqs or self._seqs[-1] != seq:
                self._seqs.append(seq)

    def __contains__(self, seq: object) -> bool:
        if not isinstance(seq, int):
            return False
        i = bisect_left(self._seqs, seq)
        return i < len(self._seqs) and self._seqs[i] == seq

    def __len__(self) -> int:
        return len(self._seqs)


def _ascending(seqs: array[int], *, strictly: bool = False) -> bool:
    if strictly:
        return all(a < b for a, b in itertools.pairwise(seqs))
    return all(a <= b for a, b in itertools.pairwise(seqs))


def update_seqs(paths: Sequence[Path]) -> SeqSet:
    """The seqs the update files `paths` hold outcomes for; ExportError naming a file that
    is missing or damaged."""
    runs: list[array[int]] = []
    for path in paths:
        run = array("q")
        for batch in _read_batches(path, ["seq"], 65_536):
            run.extend(batch.column(0).to_pylist())
        runs.append(run)
    return SeqSet(*runs)


def pending_keys(path: Path, resolved: Container[int], batch_rows: int) -> Iterator[PendingKeys]:
    """The row file's pending rows not in `resolved` (seqs an update file already holds),
    ascending seq, at most `batch_rows` at a time; ExportError naming the file when it is
    missing or damaged. (Plain Python over each batch: pyarrow's compute module would add
    12 MiB to the export's memory for this.)"""
    for batch in _read_batches(path, list(_KEY_COLUMNS), batch_rows):
        columns = {name: batch.column(name).to_pylist() for name in _KEY_COLUMNS}
        chosen = [
            i
            for i, (outcome, seq) in enumerate(zip(columns["outcome"], columns["seq"], strict=True))
            if outcome == PENDING and seq not in resolved
        ]
        if not chosen:
            continue
        yield PendingKeys(
            [columns["seq"][i] for i in chosen],
            [columns["message_id"][i] for i in chosen],
            [columns["destination"][i] for i in chosen],
            [_epoch_ms(columns["timestamp"][i]) for i in chosen],
            [columns["segment"][i] for i in chosen],
        )


def _epoch_ms(when: dt.datetime) -> int:
    """A timestamp column's value (an aware datetime) as epoch ms, exactly."""
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
