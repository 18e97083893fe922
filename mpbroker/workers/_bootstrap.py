"""Start-up common to every worker process: title, logging, dying with the supervisor."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

from ._layout import WorkerSpec

__all__ = ["worker_entry"]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Ask Linux to send SIGTERM when the supervisor dies, even by kill -9."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the workers' ppid check covers it
        pass


def worker_entry(spec: WorkerSpec) -> None:
    """Target of every spawned worker process."""
    _die_with_parent()
    from setproctitle import setproctitle

    from mpbroker.logs import setup_logging

    setproctitle(f"mpbroker: {spec.title}")
    setup_logging(spec.title.replace(" ", "-"), spec.config.broker.log_level)
    log = logging.getLogger("mpbroker.worker")
    # The supervisor may already be gone if it died while spawning us.
    if os.getppid() == 1:
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
