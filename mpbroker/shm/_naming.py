"""Names of a broker instance's shared-memory entries, and their removal.

Every segment and FIFO of one broker instance is named ``mpb.<instance>.<purpose>``, where
``instance`` starts with the supervisor's pid in decimal. posix_ipc names carry a leading slash
(``/mpb.<instance>.<purpose>``); the files live in /dev/shm, where posix semaphores appear as
``sem.mpb.<instance>.<purpose>``. One name is reserved: ``mpb.<instance>.lock``, the instance's
lock file (:class:`~mpbroker.shm._instance.InstanceLock`), which tells whether the instance is
alive. ``kill -9`` of a broker leaves its files behind, so a starting supervisor calls
:func:`~mpbroker.shm._instance.sweep_stale`, which removes (with :func:`unlink_entries`) the
entries of every instance that is not alive: one whose lock file nobody holds, or, for an
instance without a lock file, one whose pid does not exist (docs/architecture.md, "Segments").
"""

from __future__ import annotations

import os
import pathlib
import re

__all__ = [
    "ENTRY_RE",
    "LOCK_PURPOSE",
    "SHM_DIR",
    "lock_path",
    "remove_instance",
    "segment_name",
    "shm_path",
    "unlink_entries",
]

SHM_DIR = pathlib.Path("/dev/shm")
"""Where Linux keeps POSIX shared memory, POSIX semaphores, and our doorbell FIFOs."""

LOCK_PURPOSE = "lock"
"""The purpose of an instance's lock file, ``mpb.<instance>.lock``; no segment may use it."""

# The instance must start with a pid (sweep_stale reads it back) and may carry a suffix such as
# the "t3" tests use to keep their instances apart; no dot, because the dot ends the instance.
_INSTANCE_RE = re.compile(r"[0-9]+[A-Za-z0-9_-]*")
_PURPOSE_RE = re.compile(r"[A-Za-z0-9_.-]+")
ENTRY_RE = re.compile(r"(?:sem\.)?mpb\.(([0-9]+)[A-Za-z0-9_-]*)\..+")
"""An entry of some instance in /dev/shm: group 1 is the instance, group 2 its leading pid."""

# Linux NAME_MAX; /dev/shm file names (including the "sem." of semaphores) cannot be longer.
_NAME_MAX = 255


def _check_instance(instance: str) -> None:
    if not _INSTANCE_RE.fullmatch(instance):
        raise ValueError(
            f"invalid broker instance {instance!r}: must be a pid in decimal, "
            "optionally followed by [A-Za-z0-9_-] characters"
        )


def segment_name(instance: str, purpose: str) -> str:
    """Return the posix_ipc name ``/mpb.<instance>.<purpose>``.

    ``instance`` must be decimal digits (the supervisor's pid) optionally followed by
    ``[A-Za-z0-9_-]`` characters; ``purpose`` must match ``[A-Za-z0-9_.-]+`` and must not be
    ``"lock"`` (:data:`LOCK_PURPOSE`, the instance's lock file). Raises :class:`ValueError`
    naming the offending value otherwise.
    """
    _check_instance(instance)
    if not _PURPOSE_RE.fullmatch(purpose):
        raise ValueError(f"invalid segment purpose {purpose!r}: must match [A-Za-z0-9_.-]+")
    if purpose == LOCK_PURPOSE:
        raise ValueError(
            f"invalid segment purpose {purpose!r}: reserved for the instance's lock file"
        )
    name = f"/mpb.{instance}.{purpose}"
    if len(name) - 1 + len("sem.") > _NAME_MAX:
        raise ValueError(f"segment name {name!r} is longer than {_NAME_MAX - 4} characters")
    return name


def shm_path(name: str) -> pathlib.Path:
    """Return the /dev/shm path of a posix_ipc name (``/mpb.1.x`` -> ``/dev/shm/mpb.1.x``)."""
    bare = name[1:] if name.startswith("/") else name
    if not bare or "/" in bare or bare in (".", ".."):
        raise ValueError(f"invalid shared-memory name {name!r}: must be one path component")
    return SHM_DIR / bare


def _instance_entries(directory: pathlib.Path, instance: str) -> list[str]:
    prefixes = (f"mpb.{instance}.", f"sem.mpb.{instance}.")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(prefixes))


def lock_path(instance: str, directory: pathlib.Path = SHM_DIR) -> pathlib.Path:
    """Return the path of ``instance``'s lock file, ``<directory>/mpb.<instance>.lock``."""
    _check_instance(instance)
    return directory / f"mpb.{instance}.{LOCK_PURPOSE}"


def unlink_entries(directory: pathlib.Path, instance: str, names: list[str]) -> list[str]:
    """Unlink ``names``, entries of ``instance``, from ``directory``; return those removed, sorted.

    The instance's lock file, if among them, goes last: while any other entry of the instance
    remains, its lock file still decides whether the instance is alive. Entries that vanish
    meanwhile are skipped.
    """
    lock = lock_path(instance, directory).name
    removed = []
    for entry in sorted(names, key=lambda n: (n == lock, n)):
        try:
            os.unlink(directory / entry)
        except FileNotFoundError:
            # Someone else (a concurrent sweep, the owner's own shutdown) was faster: fine.
            continue
        removed.append(entry)
    return sorted(removed)


def remove_instance(instance: str, directory: pathlib.Path = SHM_DIR) -> list[str]:
    """Remove every entry of ``instance`` (``mpb.<instance>.*`` and ``sem.mpb.<instance>.*``),
    its lock file last.

    Returns the file names removed (without directory), sorted. Entries that vanish meanwhile
    are skipped silently. Processes that still have a segment mapped keep using it; only the
    name goes away. The lock file goes too, held or not: call this for your own instance, or
    for one you know is dead.
    """
    _check_instance(instance)  # so that "1" cannot match "1*" by accident
    return unlink_entries(directory, instance, _instance_entries(directory, instance))
