"""Start-up common to every worker process: title, logging, dying with the supervisor,
stopping on a signal."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from types import FrameType

from mpbroker.shm import Doorbell

from ._layout import WorkerSpec

__all__ = ["StopOnSignal", "die_with_parent", "worker_entry"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Ask Linux to send `signum` when our parent dies, even by kill -9."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the workers' ppid check covers it
        pass


class StopOnSignal:
    """SIGTERM or SIGINT asks a synchronous worker's loop to stop at the top of its next turn
    (``while not stop.requested``), then it closes what it holds.

    Raising from the handler instead stopped the loop wherever it was (in a store commit, in
    a ring write) and, when a second signal came while the worker was closing (Ctrl-C reaches
    every process of the group, then the supervisor's SIGTERM follows), broke off the close:
    logged as a crash. The handler only sets the flag and rings the worker's own doorbell, so
    a parked loop wakes at once. Install it first thing: a signal that comes before the
    doorbell exists is seen at the first turn.
    """

    def __init__(self) -> None:
        self.requested = False
        self._bell: Doorbell | None = None
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def wake(self, bell: Doorbell) -> None:
        """Ring `bell` (the worker parks on it) when a stop is asked for."""
        self._bell = bell

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        bell = self._bell
        if bell is not None and not bell.closed:
            bell.ring()


def worker_entry(spec: WorkerSpec, parent: int | None = None) -> None:
    """What every worker process runs, forked by the fork server (`parent`, its pid)."""
    # The fork server dies with the supervisor (and exits when the supervisor stops), so
    # dying with our parent is dying with the supervisor.
    die_with_parent()
    from setproctitle import setproctitle

    from mpbroker.logs import setup_logging

    setproctitle(f"mpbroker: {spec.title}")
    setup_logging(spec.title.replace(" ", "-"), spec.config.broker.log_level)
    log = logging.getLogger("mpbroker.worker")
    # Our parent may already be gone if it died while forking us.
    ppid = os.getppid()
    if ppid == 1 or (parent is not None and ppid != parent):
        sys.exit(1)
    try:
        if spec.role == "gateway":
            from .gateway import run_gateway

            run_gateway(spec)
        elif spec.role == "replay":
            from .replay import run_replay

            run_replay(spec)
        else:
            from .pipeline import run_pipeline

            run_pipeline(spec)
    except KeyboardInterrupt:
        pass
    except Exception:
        log.exception("%s crashed", spec.title)
        sys.exit(1)
