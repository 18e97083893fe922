"""Names of a broker instance's shared-memory entries, and their removal.

Every segment and FIFO of one broker instance is named ``mpb.<instance>.<purpose>``, where
``instance`` starts with the supervisor's pid in decimal. posix_ipc names carry a leading slash
(``/mpb.<instance>.<purpose>``); the files live in /dev/shm, where posix semaphores appear as
``sem.mpb.<instance>.<purpose>``. ``kill -9`` of a broker leaves those files behind, so a starting
supervisor calls :func:`sweep_stale` (docs/architecture.md, "Segments").
"""

from __future__ import annotations

import os
import pathlib
import re

__all__ = [
    "SHM_DIR",
    "remove_instance",
    "segment_name",
    "shm_path",
    "sweep_stale",
]

SHM_DIR = pathlib.Path("/dev/shm")
"""Where Linux keeps POSIX shared memory, POSIX semaphores, and our doorbell FIFOs."""

# The instance must start with a pid (sweep_stale reads it back) and may carry a suffix such as
# the "t3" tests use to keep their instances apart; no dot, because the dot ends the instance.
_INSTANCE_RE = re.compile(r"[0-9]+[A-Za-z0-9_-]*")
_PURPOSE_RE = re.compile(r"[A-Za-z0-9_.-]+")
# An entry of some instance in /dev/shm: group 1 is the instance, group 2 its leading pid.
_ENTRY_RE = re.compile(r"(?:sem\.)?mpb\.(([0-9]+)[A-Za-z0-9_-]*)\..+")

# Linux NAME_MAX; /dev/shm file names (including the "sem." of semaphores) cannot be longer.
_NAME_MAX = 255
# What a live broker process has in /proc/<pid>/cmdline: `mpbroker serve`, `python -m mpbroker`,
# or the setproctitle title ("mpbroker: gateway 0") the workers and supervisor set.
_PROCESS_MARKER = b"mpbroker"


def segment_name(instance: str, purpose: str) -> str:
    """Return the posix_ipc name ``/mpb.<instance>.<purpose>``.

    ``instance`` must be decimal digits (the supervisor's pid) optionally followed by
    ``[A-Za-z0-9_-]`` characters; ``purpose`` must match ``[A-Za-z0-9_.-]+``. Raises
    :class:`ValueError` naming the offending value otherwise.
    """
    if not _INSTANCE_RE.fullmatch(instance):
        raise ValueError(
            f"invalid broker instance {instance!r}: must be a pid in decimal, "
            "optionally followed by [A-Za-z0-9_-] characters"
        )
    if not _PURPOSE_RE.fullmatch(purpose):
        raise ValueError(f"invalid segment purpose {purpose!r}: must match [A-Za-z0-9_.-]+")
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


def _unlink_entries(directory: pathlib.Path, names: list[str]) -> list[str]:
    removed = []
    for entry in names:
        try:
            os.unlink(directory / entry)
        except FileNotFoundError:
            # Someone else (a concurrent sweep, the owner's own shutdown) was faster: fine.
            continue
        removed.append(entry)
    return removed


def remove_instance(instance: str, directory: pathlib.Path = SHM_DIR) -> list[str]:
    """Remove every entry of ``instance`` (``mpb.<instance>.*`` and ``sem.mpb.<instance>.*``).

    Returns the file names removed (without directory), sorted. Entries that vanish meanwhile
    are skipped silently. Processes that still have a segment mapped keep using it; only the
    name goes away.
    """
    segment_name(instance, "x")  # validates instance, so "1" cannot match "1*" by accident
    return _unlink_entries(directory, _instance_entries(directory, instance))


def _pid_is_live_broker(pid: int) -> bool:
    """Whether ``pid`` may be the live supervisor that named the entries.

    Our own pid always counts as live (a supervisor sweeping at start must not remove what it
    has already created, and a test process may name instances after itself). Otherwise the pid
    must exist and be an mpbroker process: after a crash the pid can be reused by an unrelated
    process, whose command line then does not mention mpbroker.
    """
    if pid == os.getpid():
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        # e.g. EACCES under hidepid=: we cannot tell, so we must not touch it.
        return True
    # A zombie has an empty cmdline: its broker is gone, the pid is only not reaped yet.
    return _PROCESS_MARKER in cmdline


def sweep_stale(directory: pathlib.Path = SHM_DIR) -> list[str]:
    """Remove the entries of dead broker instances from ``directory`` (default /dev/shm).

    An instance is dead when the pid its name starts with no longer exists, or exists but is not
    an mpbroker process (pid reuse: ``/proc/<pid>/cmdline`` does not contain ``mpbroker``). Entries
    of live instances, of our own pid, and files not named like ours are never touched.
    Returns the removed file names, sorted. ``directory`` exists for tests.
    """
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    verdicts: dict[int, bool] = {}
    stale = []
    for entry in names:
        m = _ENTRY_RE.fullmatch(entry)
        if m is None:
            continue
        pid = int(m.group(2))
        if pid not in verdicts:
            verdicts[pid] = _pid_is_live_broker(pid)
        if not verdicts[pid]:
            stale.append(entry)
    return _unlink_entries(directory, sorted(stale))
