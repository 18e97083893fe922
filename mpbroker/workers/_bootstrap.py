"""Start-up common to every worker process: title, logging, dying with the supervisor, and
the role's own main."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Final

from setproctitle import setproctitle

from mpbroker.logs import setup_logging
from mpbroker.stores import StoreError

from ._layout import WorkerSpec
from ._parent import die_with_parent
from .gateway import run_gateway
from .pipeline import run_pipeline
from .replay import run_replay

__all__ = ["worker_entry"]

# Each role's main. The fork server imported them all before it forked (PRELOAD).
_MAINS: Final[dict[str, Callable[[WorkerSpec], None]]] = {
    "gateway": run_gateway,
    "p2p": run_pipeline,
    "pubsub": run_pipeline,
    "replay": run_replay,
}


def worker_entry(spec: WorkerSpec, parent: int | None = None) -> None:
    """What every worker process runs, forked by the fork server (`parent`, its pid)."""
    # The fork server dies with the supervisor (and exits when the supervisor stops), so
    # dying with our parent is dying with the supervisor.
    die_with_parent()
    setproctitle(f"mpbroker: {spec.title}")
    broker = spec.config.broker
    setup_logging(spec.title.replace(" ", "-"), broker.log_level, broker.log_format)
    log = logging.getLogger("mpbroker.worker")
    # Our parent may already be gone if it died while forking us.
    ppid = os.getppid()
    if ppid == 1 or (parent is not None and ppid != parent):
        sys.exit(1)
    try:
        _MAINS[spec.role](spec)
    except KeyboardInterrupt:
        pass
    except StoreError as exc:
        # It names the file, the operation and the reason: one line says it all.
        log.error("%s cannot go on: %s", spec.title, exc)
        sys.exit(1)
    except Exception:
        log.exception("%s crashed", spec.title)
        sys.exit(1)
