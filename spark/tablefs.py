"""A directory on any filesystem Spark's Hadoop layer reaches, through the driver's JVM.

The ingest job's own files (its state, lock, staged partitions, reports) go where Spark
writes the table, so they go through the same Hadoop `FileSystem`: a local path, a
``file://`` URI, ``hdfs://``, ``abfss://`` or ``s3a://`` with the user's connectors on the
classpath. Python's own file calls would take ``file:/tmp/t`` for a relative local path.

What a scheme can do decides whether it can hold the table (`support`): the job swaps
rewritten partitions and its state in by renaming, and keeps other runs out with a lock.
An object store (S3, GCS, Azure Blob) renames by copying, one file at a time, and cannot
create a file only if none is there; the job refuses it as `--output` and says why.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "Entry",
    "SchemeSupport",
    "TableFS",
    "TableFSError",
    "one_line",
    "support",
]

# How a run keeps others out of a table.
FLOCK: Final = "flock"
"""An advisory lock on a local (or NFS) file, released by the kernel when the holder dies."""
CREATE: Final = "exclusive-create"
"""A lock file created only if none is there (the namenode decides atomically); a killed run
leaves it behind: the next run takes it over when it names a process of this host that has
ended, and otherwise names it."""


@dataclass(frozen=True, slots=True)
class SchemeSupport:
    """Whether a scheme can hold the table, and how its runs are kept apart."""

    lock: str | None
    atomic_rename: bool
    why_not: str = ""
    """For a scheme that cannot hold the table: what it lacks."""


_OBJECT_STORE: Final = (
    "an object store renames by copying, one file at a time (a rewritten partition would be"
    " half there while it moves), and cannot create a lock file only if none is there"
)
_SUPPORT: Final[dict[str, SchemeSupport]] = {
    "file": SchemeSupport(FLOCK, True),
    # HDFS and what fronts it: renames and exclusive creates are single namenode operations.
    "hdfs": SchemeSupport(CREATE, True),
    "viewfs": SchemeSupport(CREATE, True),
    "webhdfs": SchemeSupport(CREATE, True),
    "swebhdfs": SchemeSupport(CREATE, True),
    # ADLS Gen2 (hierarchical namespace): atomic renames, conditional creates.
    "abfs": SchemeSupport(CREATE, True),
    "abfss": SchemeSupport(CREATE, True),
    **{
        scheme: SchemeSupport(None, False, _OBJECT_STORE)
        for scheme in ("s3", "s3a", "s3n", "gs", "wasb", "wasbs", "oss", "cosn", "obs")
    },
}


def support(scheme: str) -> SchemeSupport:
    """What `scheme` gives the job (an unknown scheme: nothing is assumed)."""
    return _SUPPORT.get(
        scheme.lower(),
        SchemeSupport(
            None,
            False,
            "the job does not know whether it renames atomically and creates files"
            " exclusively (the schemes it knows: " + ", ".join(sorted(_SUPPORT)) + ")",
        ),
    )


class TableFSError(Exception):
    """A filesystem operation failed or was refused; names the location and why."""

    def __init__(self, location: str, detail: str) -> None:
        self.location = location
        self.detail = detail
        super().__init__(f"{location}: {detail}")


@dataclass(frozen=True, slots=True)
class Entry:
    """A file or directory under the root, by its path relative to it."""

    name: str
    size: int
    is_dir: bool


class TableFS:
    """A root directory (any Hadoop filesystem) and the operations the ingest needs on what
    is under it, by relative names ("_state/state-00000003.json")."""

    def __init__(self, spark: SparkSession, location: str) -> None:
        jvm: Any = spark._jvm
        jsc: Any = spark._jsc
        self._jvm = jvm
        self._conf: Any = jsc.hadoopConfiguration()
        jpath = jvm.org.apache.hadoop.fs.Path(location)
        try:
            self._fs: Any = jpath.getFileSystem(self._conf)
        except Exception as exc:  # py4j's Java exception: no filesystem for the scheme, ...
            raise TableFSError(location, one_line(exc)) from None
        if str(self._fs.getScheme()) == "file" and not jpath.isAbsolute():
            # Relative to where the user is: this process's directory, which is not the
            # JVM's once the process has changed directory.
            jpath = jvm.org.apache.hadoop.fs.Path(os.path.abspath(location))
        # Absolute and with its scheme: a relative local path is taken from the working
        # directory once, here.
        self._root: Any = self._fs.makeQualified(jpath)
        self.uri: str = str(self._root.toString())
        self.scheme: str = str(self._fs.getScheme())
        if self.scheme == "file":
            # Hadoop's local filesystem keeps a .crc file beside each file it writes and
            # refuses a file edited without it; the job's own small files need neither.
            self._fs = self._fs.getRawFileSystem()

    def _path(self, name: str = "") -> Any:
        if not name:
            return self._root
        return self._jvm.org.apache.hadoop.fs.Path(self._root, name)

    def child(self, name: str) -> str:
        """The URI of `name` under the root."""
        return str(self._path(name).toString())

    def local_path(self) -> Path | None:
        """The root as a local path, for a ``file`` root (else None)."""
        if self.scheme != "file":
            return None
        return Path(unquote(urlparse(self.uri).path))

    def _call(self, what: str, name: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception as exc:
            raise TableFSError(self.child(name), f"{what}: {one_line(exc)}") from None

    def exists(self, name: str = "") -> bool:
        return bool(self._call("exists", name, lambda: self._fs.exists(self._path(name))))

    def is_dir(self, name: str = "") -> bool:
        path = self._path(name)
        return bool(
            self._call(
                "stat",
                name,
                lambda: self._fs.exists(path) and self._fs.getFileStatus(path).isDirectory(),
            )
        )

    def mkdirs(self, name: str = "") -> None:
        if not self._call("mkdirs", name, lambda: self._fs.mkdirs(self._path(name))):
            raise TableFSError(self.child(name), "cannot create the directory")

    def delete(self, name: str) -> None:
        """Delete `name` (a directory with what it holds); nothing if it is not there."""
        self._call("delete", name, lambda: self._fs.delete(self._path(name), True))

    def rename(self, source: str, target: str) -> None:
        """Move `source` to `target`, which must not exist (its parent is made)."""
        parent = self._path(target).getParent()
        self._call("mkdirs", target, lambda: self._fs.mkdirs(parent))
        moved = self._call(
            "rename", source, lambda: self._fs.rename(self._path(source), self._path(target))
        )
        if not moved:
            raise TableFSError(self.child(source), f"could not be renamed to {self.child(target)}")

    def list(self, name: str = "", *, recursive: bool = False) -> list[Entry]:
        """What is under `name` (files only when `recursive`), by name relative to the root,
        sorted; nothing when `name` is not there."""
        base = self._path(name)
        if not self.exists(name):
            return []
        root = str(self._root.toUri().getPath()).rstrip("/") + "/"
        entries: list[Entry] = []

        def relative(status: Any) -> str:
            path = str(status.getPath().toUri().getPath())
            return path[len(root) :] if path.startswith(root) else path

        if recursive:
            iterator = self._call("list", name, lambda: self._fs.listFiles(base, True))
            while self._call("list", name, iterator.hasNext):
                status = iterator.next()
                entries.append(Entry(relative(status), int(status.getLen()), False))
        else:
            for status in self._call("list", name, lambda: self._fs.listStatus(base)):
                entries.append(
                    Entry(relative(status), int(status.getLen()), bool(status.isDirectory()))
                )
        return sorted(entries, key=lambda e: e.name)

    def read_text(self, name: str) -> str:
        def read() -> str:
            stream = self._fs.open(self._path(name))
            try:
                data = self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
            finally:
                stream.close()
            return bytes(data).decode("utf-8")

        return str(self._call("read", name, read))

    def create_text(self, name: str, text: str) -> None:
        """Write a new file `name` whole: under a hidden name first, renamed into place (so a
        reader never sees it half written; `name` must not exist)."""
        parent, _, leaf = name.rpartition("/")
        hidden = f"{parent}/.{leaf}.tmp" if parent else f".{leaf}.tmp"
        self.delete(hidden)  # a killed run's

        def write() -> None:
            stream = self._fs.create(self._path(hidden), True)
            try:
                stream.write(text.encode("utf-8"))
            finally:
                stream.close()

        self._call("write", hidden, write)
        self.rename(hidden, name)

    def footer_metadata(self, name: str) -> dict[str, str]:
        """The key-value metadata in a Parquet file's footer (read by the JVM's Parquet
        reader, so any filesystem works and the driver needs no pyarrow)."""

        def read() -> dict[str, str]:
            parquet = self._jvm.org.apache.parquet.hadoop
            source = parquet.util.HadoopInputFile.fromPath(self._path(name), self._conf)
            reader = parquet.ParquetFileReader.open(source)
            try:
                metadata = reader.getFooter().getFileMetaData().getKeyValueMetaData()
                return {str(k): str(v) for k, v in dict(metadata).items()}
            finally:
                reader.close()

        result: dict[str, str] = self._call("read the Parquet footer", name, read)
        return result

    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[str | None]:
        """Hold the lock `name` (one run at a time per table): TableFSError naming the holder
        when another run holds it. How depends on the scheme (`support`). Yields what a
        killed run left and this one took over (an exclusive-create lock file), else None."""
        how = support(self.scheme).lock
        if how == FLOCK:
            local = self.local_path()
            assert local is not None
            with _flock(local / name, self.child(name)):
                yield None
        elif how == CREATE:
            with self._create_lock(name) as taken_over:
                yield taken_over
        else:
            raise TableFSError(self.uri, f"no lock on {self.scheme}://")

    @contextlib.contextmanager
    def _create_lock(self, name: str) -> Iterator[str | None]:
        host = socket.gethostname()
        holder = f"{host} pid {os.getpid()} since {time.strftime('%FT%TZ', time.gmtime())}"

        def create() -> None:
            stream = self._fs.create(self._path(name), False)
            try:
                stream.write(holder.encode())
            finally:
                stream.close()

        def held_by() -> str:
            try:
                return self.read_text(name).strip() or "unknown"
            except TableFSError:
                return "unknown"

        taken_over: str | None = None
        for attempt in range(2):
            try:
                create()
                break
            except Exception as exc:
                if "FileAlreadyExists" not in type(exc).__name__ + str(exc):
                    raise TableFSError(self.child(name), f"lock: {one_line(exc)}") from None
                other = held_by()
                if attempt == 0 and _dead_here(other, host):
                    # A killed run on this host: its process is gone, so is its claim. (A
                    # second run taking it over at the same moment: one create wins.)
                    self.delete(name)
                    taken_over = f"{self.child(name)} (held by {other}, no longer running)"
                    continue
                raise TableFSError(
                    self.child(name),
                    f"another ingest into this table holds its lock ({other}); if none is"
                    " running (a run killed on another host leaves the file behind), delete"
                    " the file and run again",
                ) from None
        try:
            yield taken_over
        finally:
            self.delete(name)


def _dead_here(holder: str, host: str) -> bool:
    """Whether the lock file text `holder` names a process of this host that has ended."""
    found = re.match(r"(\S+) pid (\d+) since ", holder)
    if found is None or found.group(1) != host:
        return False
    try:
        os.kill(int(found.group(2)), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


@contextlib.contextmanager
def _flock(path: Path, shown: str) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise TableFSError(
                shown, f"another ingest into this table is running (pid {holder})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays, so its inode is the lock


def one_line(exc: BaseException) -> str:
    """An exception's first line: a Java exception's own message, not py4j's page of stack."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        with contextlib.suppress(Exception):
            text = str(java.toString())
            return text.splitlines()[0]
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
