"""Start-up common to every worker process: title, logging, dying with the supervisor."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

from ._layout import WorkerSpec

__all__ = ["die_with_parent", "worker_entry"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Ask Linux to send `signum` when our parent dies, even by kill -9."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the workers' ppid check covers it
        pass


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
