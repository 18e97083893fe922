"""The data directory before anything starts: is it usable, and which partitioning was it
made with.

Checked first (`check_data_dir`), so that a data dir that is a file, on a read-only
filesystem or not ours ends the start with one line naming it and the reason, rather than
with every worker's traceback.

The partitioning (`PartitionRecord`): every queue and topic lives in the store of the
pipeline its name hashes to (`mpbroker.routing`), so the number of p2p and pubsub workers,
and the dead-letter prefix (a DLQ lives with its queue), decide where a message is looked
for. Started with other numbers, the broker would look in the wrong stores, and the
messages in the others would never be delivered. The supervisor records them in the data
dir (`mpbroker-partitions.json`); a start with other explicit numbers is refused
(`PartitionMismatch`, a ConfigError: exit code 2), and `0` (one per CPU) keeps the recorded
ones (`mpbroker.memory.fit_workers`). A data dir from before
the record is read from its store directories' names.

The ports (`PortsRecord`): a running broker records where it listens in the data dir
(`mpbroker-ports.json`), with its supervisor's pid and start time, once it is ready, and
removes the record when it stops; `mpbroker admin` reads it to find the admin API of a
broker started with `--admin-port 0` (or another port). A record left by a broker that was
killed names a process that is gone (`PortsRecord.running`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from mpbroker.config import ConfigError
from mpbroker.routing import Topology

__all__ = [
    "LOCK_FILE",
    "PARTITIONS_FILE",
    "PORTS_FILE",
    "DataDirError",
    "DataDirInUse",
    "DataDirLock",
    "PartitionMismatch",
    "PartitionRecord",
    "PortsRecord",
    "check_data_dir",
    "owner_only",
    "read_partitions",
    "read_ports",
    "remove_ports",
    "write_partitions",
    "write_ports",
]

LOCK_FILE = "mpbroker.lock"
PARTITIONS_FILE = "mpbroker-partitions.json"
PORTS_FILE = "mpbroker-ports.json"
_PROBE = ".mpbroker-write-probe"
_STORE_DIR = re.compile(r"(p2p|pubsub)-(\d+)")


class DataDirError(RuntimeError):
    """The data directory cannot be used; the message names it and says why."""

    def __init__(self, path: Path, why: str) -> None:
        self.path = path
        self.why = why
        super().__init__(f"data dir {path}: {why}")


class DataDirInUse(DataDirError):
    """Another broker runs on the data dir (it holds `DataDirLock`); `pid` is its
    supervisor's, as it wrote it in the lock file (0 if it could not be read)."""

    def __init__(self, path: Path, pid: int) -> None:
        self.pid = pid
        who = f"another broker (pid {pid})" if pid else "another broker"
        super().__init__(
            path,
            f"in use by {who}: stop it, or give this one another --data-dir "
            "(two brokers on one data dir would deliver its stored messages twice)",
        )


class DataDirLock:
    """The exclusive lock (flock) on `<data dir>/mpbroker.lock` that a broker holds while it
    runs, with its supervisor's pid written in the file: two brokers on one data dir would
    both recover its stores, deliver each stored message twice and overwrite each other's
    records. The kernel drops the lock when the last process holding the file ends, so one
    left by a broker that was killed stops nobody."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def acquire(cls, data_dir: Path) -> DataDirLock:
        """Take the lock at once (DataDirInUse if another broker holds it; DataDirError if
        the file cannot be made)."""
        import fcntl

        path = data_dir / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise DataDirError(path, f"cannot open the lock file ({_reason(exc)})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                text = os.read(fd, 32).decode("ascii", "replace").strip()
            except OSError:
                text = ""
            os.close(fd)
            raise DataDirInUse(data_dir, int(text) if text.isdigit() else 0) from None
        except OSError as exc:
            os.close(fd)
            raise DataDirError(path, f"cannot lock it ({_reason(exc)})") from None
        # Who holds it, for the next one's message (the lock, not the text, decides).
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        """Let another broker have the data dir. The file stays: removing it would let two
        brokers lock two different files of the same name."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _probe(directory: Path) -> None:
    """Create and remove a file in `directory` (`access(2)` says yes to root even on a
    read-only filesystem: only trying tells)."""
    probe = directory / _PROBE
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.close(fd)
        probe.unlink()
    except OSError as exc:
        # A full filesystem is ours to write once there is room: the stores start on one
        # (their disk reserve) and drain it (persistence.md, "A full disk").
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return
        raise DataDirError(directory, f"not writable ({_reason(exc)})") from None


def check_data_dir(path: Path, *, create: bool = True) -> None:
    """Make the data dir if it is missing (`create`; else a missing one is fine) and check
    the broker can write in it and in the store directories already there; DataDirError
    naming what is wrong otherwise."""
    try:
        if not stat.S_ISDIR(path.stat().st_mode):
            raise DataDirError(path, "not a directory")
    except FileNotFoundError:
        if not create:
            return
    except OSError as exc:  # a directory on the way that is not ours, say
        raise DataDirError(path, f"cannot reach it ({_reason(exc)})") from None
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise DataDirError(path, f"cannot create it ({_reason(exc)})") from None
    _probe(path)
    try:
        entries = list(path.iterdir())
    except OSError as exc:
        raise DataDirError(path, f"cannot list it ({_reason(exc)})") from None
    for entry in entries:
        if _STORE_DIR.fullmatch(entry.name) or entry.name.endswith("-temp"):
            if not entry.is_dir():
                raise DataDirError(entry, "not a directory (a store directory is expected)")
            _probe(entry)


def owner_only(path: Path) -> int:
    """Take group and other permissions off the data dir and everything in it (it holds
    every stored message); how many entries were changed. The broker runs with umask 077,
    so what it creates is owner-only already: this is for a data dir made before, or by
    hand. Symlinks are left alone; an entry that vanishes meanwhile is skipped."""
    changed = 0
    for entry in (path, *path.rglob("*")):
        with contextlib.suppress(FileNotFoundError):
            st = entry.lstat()
            if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o077:
                continue
            entry.chmod(stat.S_IMODE(st.st_mode) & 0o700)
            changed += 1
    return changed


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    """How a data dir's destinations are partitioned over its stores."""

    p2p_workers: int
    pubsub_workers: int
    dead_letter_prefix: str | None  # None: not known (a data dir from before the record)
    source: str  # where it was read from: the record file, or the store directories

    def check(self, topology: Topology) -> None:
        """PartitionMismatch if `topology` partitions destinations unlike these stores."""
        if topology.p2p != self.p2p_workers:
            raise PartitionMismatch("broker.p2p_workers", topology.p2p, self.p2p_workers, self)
        if topology.pubsub != self.pubsub_workers:
            raise PartitionMismatch(
                "broker.pubsub_workers", topology.pubsub, self.pubsub_workers, self
            )
        # The prefix decides a DLQ's pipeline only when there is more than one.
        prefix = self.dead_letter_prefix
        if self.p2p_workers > 1 and prefix is not None and topology.dead_letter_prefix != prefix:
            raise PartitionMismatch(
                "queues.dead_letter_prefix", topology.dead_letter_prefix, prefix, self
            )


class PartitionMismatch(ConfigError):
    """Settings that would partition destinations unlike the data dir's stores."""

    def __init__(self, key: str, value: object, recorded: object, record: PartitionRecord) -> None:
        self.recorded = recorded
        self.record = record
        super().__init__(
            key,
            value,
            f"the data dir's stores were made with {recorded!r} ({record.source}): each "
            "destination's messages are in the store its name hashes to, and with another "
            f"value they would not be found. Set {key} = {recorded!r}"
            + (" (or 0)" if key != "queues.dead_letter_prefix" else "")
            + ", or start with an empty data dir",
        )


def read_partitions(data_dir: Path) -> PartitionRecord | None:
    """The partitioning the data dir was made with, None for a new (or storeless) one."""
    record = data_dir / PARTITIONS_FILE
    try:
        text: str | None = record.read_text()
    except (FileNotFoundError, NotADirectoryError):
        text = None
    except OSError as exc:
        raise DataDirError(record, f"unreadable ({exc.strerror or exc})") from None
    if text is not None:
        try:
            data = json.loads(text)
            return PartitionRecord(
                int(data["p2p_workers"]),
                int(data["pubsub_workers"]),
                str(data["dead_letter_prefix"]),
                f"recorded in {PARTITIONS_FILE}",
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise DataDirError(
                record,
                f"damaged ({exc!r}); remove it to read the partitioning from the store directories",
            ) from None
    # A data dir of a broker from before the record: the store directories tell.
    p2p: set[int] = set()
    pubsub: set[int] = set()
    with contextlib.suppress(OSError):
        for entry in data_dir.iterdir():
            found = _STORE_DIR.fullmatch(entry.name)
            if found and entry.is_dir():
                (p2p if found[1] == "p2p" else pubsub).add(int(found[2]))
    if not p2p and not pubsub:
        return None
    return PartitionRecord(len(p2p), len(pubsub), None, "seen in its store directories' names")


def write_partitions(data_dir: Path, topology: Topology) -> str | None:
    """Record `topology` in the data dir (atomically, owner-only), unless it holds it
    already; why it could not, or None. (On a full filesystem it cannot: the next start then
    reads the counts from the store directories' names, as for a data dir from before the
    record.)"""
    record = data_dir / PARTITIONS_FILE
    text = (
        json.dumps(
            {
                "p2p_workers": topology.p2p,
                "pubsub_workers": topology.pubsub,
                "dead_letter_prefix": topology.dead_letter_prefix,
            },
            indent=2,
        )
        + "\n"
    )
    with contextlib.suppress(OSError):
        if record.read_text() == text:
            return None
    problem = _write_atomically(record, text)
    if problem is not None:
        return f"cannot record the partitions in {record} ({problem})"
    return None


def _write_atomically(path: Path, text: str) -> str | None:
    """Write `text` to `path` owner-only, all of it or nothing (a temporary file renamed
    over it); why it could not, or None."""
    tmp = path.with_suffix(".tmp")
    try:
        # One left by a broker that was killed may have other permissions: start afresh.
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return _reason(exc)
    return None


@dataclass(frozen=True, slots=True)
class PortsRecord:
    """Where a running broker listens, as its supervisor recorded it once it was ready.
    A port is None when that listener is off (the admin API with admin.port = -1)."""

    pid: int  # the supervisor's
    started: float  # when the supervisor's process started (seconds since the epoch)
    host: str  # broker.host: the STOMP ports' address
    port: int
    tls_port: int | None
    ws_port: int | None
    wss_port: int | None
    admin_host: str | None  # the admin API's address (admin.host)
    admin_port: int | None

    def running(self) -> bool:
        """Whether the supervisor that wrote the record still runs: its pid is alive and
        started when it says (not another process that got the pid since)."""
        import psutil

        try:
            started = psutil.Process(self.pid).create_time()
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:  # alive, another user's
            return True
        return abs(started - self.started) < 1.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


def _port_or_none(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 65536:
        raise ValueError(f"not a port: {value!r}")
    return value


def read_ports(data_dir: Path) -> PortsRecord | None:
    """The ports the broker of `data_dir` recorded (it may have died since: see
    `PortsRecord.running`); None when there is no record. DataDirError for one that cannot
    be read or is damaged."""
    path = data_dir / PORTS_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError) as exc:
        why = _reason(exc) if isinstance(exc, OSError) else str(exc)
        raise DataDirError(path, f"unreadable ({why})") from None
    try:
        data = json.loads(text)
        admin_host = data["admin_host"]
        record = PortsRecord(
            pid=int(data["pid"]),
            started=float(data["started"]),
            host=str(data["host"]),
            port=_port_or_none(data["port"]) or 0,
            tls_port=_port_or_none(data["tls_port"]),
            ws_port=_port_or_none(data["ws_port"]),
            wss_port=_port_or_none(data["wss_port"]),
            admin_host=None if admin_host is None else str(admin_host),
            admin_port=_port_or_none(data["admin_port"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise DataDirError(path, f"damaged ({exc!r})") from None
    if record.pid < 1 or not record.port:
        raise DataDirError(path, f"damaged (pid {record.pid}, port {record.port})")
    return record


def write_ports(data_dir: Path, record: PortsRecord) -> str | None:
    """Record where the broker listens in `data_dir` (atomically, owner-only); why it
    could not, or None."""
    path = data_dir / PORTS_FILE
    problem = _write_atomically(path, record.to_json())
    if problem is not None:
        return f"cannot record the ports in {path} ({problem})"
    return None


def remove_ports(data_dir: Path, pid: int) -> None:
    """Remove the ports record of the broker with supervisor `pid` (one that another
    broker wrote since stays)."""
    path = data_dir / PORTS_FILE
    with contextlib.suppress(DataDirError, OSError):
        record = read_ports(data_dir)
        if record is not None and record.pid == pid:
            path.unlink()
