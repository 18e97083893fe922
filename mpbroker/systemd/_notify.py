"""The sd_notify protocol, written out: a datagram of `KEY=value` lines to the AF_UNIX socket
named by `$NOTIFY_SOCKET` (a path, or an abstract name written with a leading `@`).

What is sent is built by pure functions (`encode`, `notify_address`, `watchdog_interval_s`);
`Notifier` is the socket. A broker started without `$NOTIFY_SOCKET` (not under systemd, or
not `Type=notify`) gets no notifier and sends nothing. A send that fails is logged once and
otherwise ignored: the service manager's state must never stop the broker.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping, MutableMapping

__all__ = ["Notifier", "NotifyError", "encode", "notify_address", "watchdog_interval_s"]

log = logging.getLogger("mpbroker.systemd")

# What the service manager sets for its main process; taken out of the environment once
# read, so that the fork server and the workers (which must not notify) do not inherit it
# (sd_notify's `unset_environment`).
_ENVIRONMENT = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class NotifyError(ValueError):
    """`$NOTIFY_SOCKET` or `$WATCHDOG_USEC` holds what the protocol does not allow."""

    def __init__(self, variable: str, value: str, why: str) -> None:
        self.variable = variable
        self.value = value
        super().__init__(f"${variable} = {value!r}: {why}")


def notify_address(value: str) -> str:
    """The socket address `$NOTIFY_SOCKET` names: an absolute path, or an abstract name
    (`@name`, which the kernel spells with a leading NUL). Anything else is refused: systemd
    254's `vsock:` addresses among them, which this broker does not speak."""
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    raise NotifyError("NOTIFY_SOCKET", value, "not an absolute path nor an @abstract name")


def watchdog_interval_s(environ: Mapping[str, str], pid: int) -> float | None:
    """How often to send `WATCHDOG=1`: half of `$WATCHDOG_USEC`, as systemd advises, so a
    late ping still arrives in time. None without a watchdog, or when `$WATCHDOG_PID` names
    another process (the watchdog is that process's to feed)."""
    usec = environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    owner = environ.get("WATCHDOG_PID")
    if owner and owner.strip() != str(pid):
        return None
    try:
        value = int(usec)
    except ValueError:
        raise NotifyError("WATCHDOG_USEC", usec, "not a number of microseconds") from None
    if value <= 0:
        raise NotifyError("WATCHDOG_USEC", usec, "must be more than 0")
    return value / 2_000_000


def encode(fields: Mapping[str, str | int]) -> bytes:
    """One notification: `KEY=value` lines. A value is one line (a STATUS text with a
    newline would end the field early and start a bogus one), so newlines become spaces."""
    lines = []
    for key, value in fields.items():
        text = str(value).replace("\r", " ").replace("\n", " ")
        lines.append(f"{key}={text}")
    return "\n".join(lines).encode()


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds: what RELOADING=1 carries as MONOTONIC_USEC."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class Notifier:
    """The service manager's notify socket, for the broker's main process.

    `from_environment` makes one when `$NOTIFY_SOCKET` is set (and removes the variables,
    so no child process inherits them). Every method sends one datagram and returns
    whether it went; the first failure is logged, the rest are not.
    """

    def __init__(self, address: str, watchdog_s: float | None = None) -> None:
        self.address = address
        self.watchdog_s = watchdog_s
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._failed = False

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str] | None = None) -> Notifier | None:
        """The notifier `$NOTIFY_SOCKET` asks for, or None; NotifyError for a value the
        protocol does not allow."""
        env = os.environ if environ is None else environ
        value = env.get("NOTIFY_SOCKET")
        try:
            if not value:
                return None
            return cls(notify_address(value), watchdog_interval_s(env, os.getpid()))
        finally:
            for name in _ENVIRONMENT:
                env.pop(name, None)

    def send(self, **fields: str | int) -> bool:
        """Send `fields` (`send(READY=1, STATUS="...")`) as one notification."""
        try:
            self._sock.sendto(encode(fields), self.address)
        except OSError as exc:
            if not self._failed:
                self._failed = True
                shown = self.address.replace("\0", "@")
                log.warning(
                    "cannot notify the service manager at %s: %s (further failures are not logged)",
                    shown,
                    exc.strerror or exc,
                )
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send(READY=1, STATUS=status)

    def status(self, status: str) -> bool:
        return self.send(STATUS=status)

    def reloading(self, status: str) -> bool:
        # systemd 253 and newer match the reload to this timestamp; older ones ignore it.
        return self.send(RELOADING=1, MONOTONIC_USEC=monotonic_usec(), STATUS=status)

    def stopping(self, status: str) -> bool:
        return self.send(STOPPING=1, STATUS=status)

    def watchdog(self) -> bool:
        return self.send(WATCHDOG=1)

    def close(self) -> None:
        self._sock.close()
