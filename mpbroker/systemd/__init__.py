"""How the broker talks to systemd: the notify protocol (READY, STATUS, RELOADING,
STOPPING, WATCHDOG), the watchdog's interval, and what the STATUS line and the health that
feeds the watchdog are made of. No libsystemd: the protocol is one datagram per message."""

from ._health import StalledWorker, WorkerBeat, stalled
from ._notify import Notifier, NotifyError, encode, notify_address, watchdog_interval_s
from ._status import Counters, RateMeter, status_line

__all__ = [
    "Counters",
    "Notifier",
    "NotifyError",
    "RateMeter",
    "StalledWorker",
    "WorkerBeat",
    "encode",
    "notify_address",
    "stalled",
    "status_line",
    "watchdog_interval_s",
]
