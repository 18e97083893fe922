"""Whether a broker instance is alive: its lock file, and the sweep of dead instances' entries.

A supervisor holds an exclusive ``flock`` on its instance's lock file, ``/dev/shm/mpb.<instance>
.lock`` (:class:`InstanceLock`), from before it creates its first segment until it has removed
them all. The kernel drops the lock when the process dies, however it dies (``kill -9``
included), so the lock answers "is this instance alive?" without guessing from pids or command
lines: a pid reused by an unrelated process does not hold the lock, and a live broker does,
wherever it was started from.

:func:`sweep_stale` decides per instance found in /dev/shm:

- its lock file exists: alive exactly when somebody holds the lock;
- it has no lock file (an instance of a broker from before the lock, a test's instance, ring
  tools): alive while a process with its pid exists (not a zombie).

Why ``flock`` and not ``fcntl``/``lockf`` record locks: record locks belong to the process, so
a supervisor that tests its own lock file (its sweep sees its own entries) would succeed, and
closing that test descriptor would drop the real lock. ``flock`` locks belong to the open file
description: a second ``open`` of the file conflicts even within the owning process. The
descriptor is close-on-exec, and the supervisor starts its fork server with exec, so no other
process inherits the lock.

Races: the owner creates its lock file with ``open(O_CREAT)`` and then locks it; a sweep can come
in between and find the file unlocked. The sweep removes an instance's entries only while it
holds the lock itself and the file it locked is still the one at the path, and it removes the
lock file last. The owner, for its part, owns the lock only if the file it locked is still the
one at the path once it holds it; otherwise (a sweep removed it meanwhile) it starts over with a
new file. So an owner and a sweep never both act on one instance, and an owner creates no entry
before it owns its lock, so a sweep never removes an entry of a live owner.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pathlib
import stat
import time
from types import TracebackType

from ._errors import InstanceLockedError, ShmError
from ._naming import ENTRY_RE, SHM_DIR, lock_path, unlink_entries

__all__ = ["InstanceLock", "sweep_stale"]

LOCK_MODE = 0o600
"""Only the broker's user may open (and so lock) an instance's lock file."""

_RETRY_S = 0.01


def _same_file(fd: int, path: pathlib.Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (not removed, not replaced)."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


class InstanceLock:
    """The exclusive lock on ``mpb.<instance>.lock`` that makes an instance alive.

    Take it before creating any entry of the instance, release it after removing them::

        lock = InstanceLock.acquire(instance)
        try:
            ...  # create segments, run, remove them
        finally:
            lock.release()
    """

    def __init__(self, instance: str, path: pathlib.Path, fd: int) -> None:
        self.instance = instance
        """The instance whose lock this is."""
        self.path = path
        """The lock file."""
        self._fd = fd

    @classmethod
    def acquire(
        cls, instance: str, directory: pathlib.Path = SHM_DIR, timeout: float = 5.0
    ) -> InstanceLock:
        """Create (or reuse a dead instance's) lock file for ``instance`` and lock it.

        Raises :class:`InstanceLockedError` if another holder keeps it longer than ``timeout``
        seconds (a sweep holds it for a moment only; a live holder is another process using
        our instance name), :class:`ShmError` if the file is not a lock file of our user,
        :class:`ValueError` for an invalid instance. ``directory`` exists for tests.
        """
        path = lock_path(instance, directory)
        deadline = time.monotonic() + timeout
        while True:
            # O_NONBLOCK: a FIFO someone put there fails the check below instead of hanging us.
            flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(path, flags, LOCK_MODE)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                    raise ShmError(f"{path} is not a lock file of this user; remove it")
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise InstanceLockedError(instance, str(path), timeout) from None
                    locked = False
                else:
                    locked = True
                if locked and _same_file(fd, path):
                    # A dead instance's file (pid reuse) may have other permissions.
                    os.fchmod(fd, LOCK_MODE)
                    return cls(instance, path, fd)
            except BaseException:
                os.close(fd)
                raise
            # Held by someone, or a sweep removed the file between our open and our lock.
            os.close(fd)
            if not locked:
                time.sleep(_RETRY_S)

    @property
    def held(self) -> bool:
        """Whether this handle still holds the lock (not released)."""
        return self._fd >= 0

    def release(self) -> None:
        """Remove the lock file (if it is still ours) and drop the lock; idempotent.

        Remove the instance's other entries first: once the lock is gone, entries left behind
        count as those of a dead instance.
        """
        if self._fd < 0:
            return
        try:
            if _same_file(self._fd, self.path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        finally:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> InstanceLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "held" if self.held else "released"
        return f"InstanceLock({self.instance!r}, {state})"


def _pid_exists(pid: int) -> bool:
    """Whether a process with this pid exists and is not a zombie (which holds nothing)."""
    if pid <= 0:
        return False  # os.kill(0, ...) would address our own process group
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        pass  # exists, owned by another user
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True  # cannot tell (hidepid=): it exists, leave it alone
    # "pid (comm) state ...": comm may contain anything, so the state follows the last ")".
    return fields.rpartition(b")")[2].split()[:1] != [b"Z"]


def _sweep_instance(
    directory: pathlib.Path, instance: str, pid: int, names: list[str]
) -> list[str]:
    """Remove the entries ``names`` of ``instance`` if it is not alive; return those removed."""
    path = lock_path(instance, directory)
    try:
        # O_NONBLOCK: never hang on something that is not a lock file (a FIFO, say).
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENAMETOOLONG):
            return []  # another user's lock file, or a symlink: not ours to judge
        # An instance without a lock file (or whose name leaves no room for one): alive while
        # its pid exists.
        if _pid_exists(pid):
            return []
        return unlink_entries(directory, instance, names)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return []  # held: alive
        except OSError:
            return []  # cannot be locked at all: not a lock file of ours
        # Nobody holds it, and while we do, no owner can start using it. Unless the file was
        # replaced meanwhile (another sweep removed it and a new owner made another one): then
        # it is that owner's, and the next sweep decides.
        if not _same_file(fd, path):
            return []
        return unlink_entries(directory, instance, sorted({*names, path.name}))
    finally:
        os.close(fd)  # drops our lock


def sweep_stale(directory: pathlib.Path = SHM_DIR) -> list[str]:
    """Remove the entries of dead broker instances from ``directory`` (default /dev/shm).

    An instance with a lock file (``mpb.<instance>.lock``) is dead when nobody holds its lock
    (its supervisor died, however: the kernel dropped the lock); its entries go, the lock file
    last. An instance without one is dead when no process with the pid its name starts with
    exists (zombies do not count). Entries of live instances (our own included: we hold our
    lock, or our pid exists) and files not named like ours are never touched. Returns the
    removed file names, sorted. ``directory`` exists for tests.
    """
    try:
        listing = os.listdir(directory)
    except FileNotFoundError:
        return []
    instances: dict[str, tuple[int, list[str]]] = {}
    for entry in listing:
        m = ENTRY_RE.fullmatch(entry)
        if m is not None:
            instances.setdefault(m.group(1), (int(m.group(2)), []))[1].append(entry)
    removed = []
    for instance, (pid, names) in sorted(instances.items()):
        removed += _sweep_instance(directory, instance, pid, names)
    return sorted(removed)
