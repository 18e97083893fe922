"""One logging set-up for every process, and the log's defences against its clients.

Each line carries the time, the level, the process role and its pid, so the interleaved
output of a supervisor and its workers can be read (and grepped) as one log.

A client must not be able to flood the log, nor write into it. Every line a client can
cause over and over (a refused frame, a protocol error, a refused connection) goes through
`log_collapsed`: the first of a kind is logged, whatever address it came from, the next
ones within `COLLAPSE_WINDOW_S` are only counted, and one line sums them up when the window
ends ("… and 5,211 more like it from 2,990 addresses (most from 127.0.0.7: 12) in the last
10 s"). So the log grows by a few lines per kind of event and window, however many
addresses a flood comes from (IPv6 gives anyone plenty). Whatever a client wrote that a
line quotes goes through `client_text`: cut, and with control characters escaped, so it
can neither hide the rest of the line nor forge another one; `LineFormatter` escapes every
message the same way, under the lines that quote without it. The deciding is pure
(`Collapser`, with the clock passed in); `log_collapsed` and `flush_collapsed` are its shell.
Every worker's loop calls `flush_collapsed` once per turn, so a window's summary comes when
the window ends, not only when the next event does.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

__all__ = [
    "CLIENT_TEXT_LIMIT",
    "COLLAPSE_WINDOW_S",
    "MAX_COLLAPSE_ADDRESSES",
    "Collapsed",
    "Collapser",
    "JournalFormatter",
    "LineFormatter",
    "client_text",
    "flush_collapsed",
    "journal_priority",
    "log_collapsed",
    "log_format",
    "peer_address",
    "setup_logging",
]

_FORMAT = "%(asctime)s %(levelname)s {role}[%(process)d] %(message)s"
# journald stamps every line itself: no time of our own.
_JOURNAL_FORMAT = "{role}[%(process)d] %(levelname)s %(message)s"

CLIENT_TEXT_LIMIT = 200
"""Characters of client text one log line quotes at most."""

COLLAPSE_WINDOW_S = 10.0
"""How long repeats of a logged event are counted before one line sums them up."""

MAX_COLLAPSE_ADDRESSES = 1000
"""Addresses a kind's window counts apart. Past that the summary says "more than 1,000
addresses", and the ones that sent most stay followed, so many addresses cannot make the
follower grow without bound."""


class LineFormatter(logging.Formatter):
    """One event, one line: control characters and newlines in a message are escaped
    (`client_text`'s escaping, without its cut). The call sites quote client text through
    `client_text` already; this is the net under the ones that do not (a destination in a
    flow-control line, say), so that no text anywhere can break a line or forge one. A
    traceback, added after the message, keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        if not record.message.isprintable():
            record.message = _escaped(record.message)
        return super().formatMessage(record)


class JournalFormatter(LineFormatter):
    """For journald (systemd's stdout/stderr stream): one line per event, starting with
    its syslog priority (`<3>` for ERROR, sd-daemon(3)'s prefixes), which journald takes as
    the entry's priority (`journalctl -p warning`), and with no time of its own. The stream
    makes an entry of every line, so a traceback is folded into its event's line with its
    newlines written `\\n` (as `client_text` escapes them): one entry, at the event's
    priority, not thirty at the stream's default."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record).replace("\n", "\\n")
        return f"<{journal_priority(record.levelno)}>{text}"


def journal_priority(levelno: int) -> int:
    """The syslog priority of a logging level: DEBUG 7, INFO 6, WARNING 4, ERROR 3,
    CRITICAL 2."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


def log_format(setting: str, journal_stream: str | None, stderr_fd: int) -> str:
    """'text' or 'journal' for a `broker.log_format` setting: 'auto' is 'journal' when
    stderr is the stream systemd connected to journald, which it names in
    `$JOURNAL_STREAM` as "device:inode" (a stderr redirected elsewhere no longer
    matches, so `2>file` gets text)."""
    if setting != "auto":
        return setting
    if not journal_stream:
        return "text"
    try:
        st = os.fstat(stderr_fd)
    except OSError:
        return "text"
    return "journal" if journal_stream == f"{st.st_dev}:{st.st_ino}" else "text"


def setup_logging(role: str, level: str, fmt: str = "text") -> None:
    """Send this process's log records to stderr, tagged with `role` (e.g. 'gateway-0'),
    as `fmt` says ('text', 'journal', or 'auto': `log_format`)."""
    handler = logging.StreamHandler(sys.stderr)
    fmt = log_format(fmt, os.environ.get("JOURNAL_STREAM"), sys.stderr.fileno())
    if fmt == "journal":
        handler.setFormatter(JournalFormatter(_JOURNAL_FORMAT.format(role=role)))
    else:
        handler.setFormatter(LineFormatter(_FORMAT.format(role=role)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


# -- client text ---------------------------------------------------------------------------

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    code = ord(char)
    if char in _ESCAPES:
        return _ESCAPES[char]
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _escaped(text: str) -> str:
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def client_text(text: str, limit: int = CLIENT_TEXT_LIMIT) -> str:
    """`text` as a log line may quote it: its first `limit` characters, with what is cut
    said, and every character that is not printable (newlines, escape sequences, line
    separators) escaped as Python's repr does. Printable non-ASCII characters stay as they
    are: they are legible and cannot break a line. So do backslashes: they cannot break a
    line either, and the refusals that quote a name with repr have escaped it already
    (escaping again would double every backslash)."""
    cut = text[:limit]
    if not cut.isprintable():
        cut = _escaped(cut)
    if len(text) > limit:
        cut += f"… ({len(text) - limit:,} more characters)"
    return cut


def peer_address(peer: str) -> str:
    """The address of a peer written "host:port" ("::1:5000" -> "::1"): its connections
    come from many ports, and it is the address that repeats."""
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() else peer


# -- collapsing repeats --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Collapsed:
    """Events of one kind that were counted, not logged, and where they came from.

    Attributes:
        kind: what they were ("refused a frame").
        count: how many.
        seconds: over how long (the window, or less when the process stops first).
        addresses: how many client addresses they came from (0: none had one, as a store
            error has not); with `more_addresses`, more than this many.
        more_addresses: they came from more addresses than a window counts apart
            (`MAX_COLLAPSE_ADDRESSES`).
        busiest: the address most of them came from ("": none had one).
        busiest_count: how many came from it (at least this many, with `more_addresses`).
    """

    kind: str
    count: int
    seconds: float
    addresses: int = 0
    more_addresses: bool = False
    busiest: str = ""
    busiest_count: int = 0

    def text(self) -> str:
        """The line that sums them up."""
        seconds = f"{self.seconds:.0f}" if self.seconds >= 9.95 else f"{self.seconds:.1f}"
        return (
            f"{self.kind}: … and {self.count:,} more like it{self._origin()} "
            f"in the last {seconds} s"
        )

    def _origin(self) -> str:
        if not self.addresses:
            return ""
        if self.addresses == 1 and not self.more_addresses:
            return f" from {self.busiest}"
        many = f"more than {self.addresses:,}" if self.more_addresses else f"{self.addresses:,}"
        if not self.busiest:
            return f" from {many} addresses"
        least = "at least " if self.more_addresses else ""
        return f" from {many} addresses (most from {self.busiest}: {least}{self.busiest_count:,})"


class _Window:
    """One kind's window: when it opened, what it counted, and from where."""

    __slots__ = ("by_address", "held", "more_addresses", "start")

    def __init__(self, start: float) -> None:
        self.start = start
        self.held = 0
        self.by_address: dict[str, int] = {}
        self.more_addresses = False

    def count(self, address: str, max_addresses: int) -> None:
        self.held += 1
        if not address:
            return
        by_address = self.by_address
        seen = by_address.get(address)
        if seen is not None:
            by_address[address] = seen + 1
        elif len(by_address) < max_addresses:
            by_address[address] = 1
        else:
            # Full (Misra and Gries' frequent items): one fewer for every address followed,
            # and the new one is not followed. Whichever address sent more than a
            # 1/(max_addresses + 1) share of the events stays followed, with a count that
            # is at most that share short; each pass takes away as many events as it
            # costs steps, so an event costs O(1) steps on average.
            self.more_addresses = True
            self.by_address = {a: n - 1 for a, n in by_address.items() if n > 1}

    def summary(self, kind: str, now: float, max_addresses: int) -> Collapsed:
        by_address = self.by_address
        busiest = max(by_address, key=by_address.__getitem__, default="")
        return Collapsed(
            kind,
            self.held,
            now - self.start,
            max_addresses if self.more_addresses else len(by_address),
            self.more_addresses,
            busiest,
            by_address.get(busiest, 0),
        )


class Collapser:
    """Which events of a kind get a line of their own. Pure: the caller passes the time
    (seconds, any monotonic clock).

    The first event of a kind, from whatever address, is logged and opens the kind's
    window of `window_s`; the next ones in it, from any address, are counted, with how
    many came from each address (up to `max_addresses` addresses apart: past that, the
    ones that sent most stay followed, see `_Window.count`). When it ends with some
    counted, `take` hands out their summary and a new window opens at once, so a kind
    that keeps coming costs one line per window however many addresses it comes from; a
    window that ends with none counted closes, and the next event is logged again.
    """

    def __init__(
        self, window_s: float = COLLAPSE_WINDOW_S, max_addresses: int = MAX_COLLAPSE_ADDRESSES
    ) -> None:
        self.window_s = window_s
        self.max_addresses = max_addresses
        # Oldest window first: every window is as long, so the first one ends first.
        self._windows: OrderedDict[str, _Window] = OrderedDict()
        self._summaries: list[Collapsed] = []

    def admit(self, kind: str, address: str, now: float) -> bool:
        """Whether this event gets a line of its own (else it is counted). `kind` is a
        constant of the code, never client text, so there are few; `address` is where the
        event came from ("": nowhere, a store error say)."""
        self._expire(now)
        window = self._windows.get(kind)
        if window is None:
            self._windows[kind] = _Window(now)
            return True
        window.count(address, self.max_addresses)
        return False

    def take(self, now: float) -> list[Collapsed]:
        """The summaries of the windows that ended by `now`."""
        self._expire(now)
        summaries, self._summaries = self._summaries, []
        return summaries

    def take_all(self, now: float) -> list[Collapsed]:
        """Every summary, windows still open included (the process stops)."""
        self._expire(now)
        summaries, self._summaries = self._summaries, []
        summaries += [
            window.summary(kind, now, self.max_addresses)
            for kind, window in self._windows.items()
            if window.held
        ]
        self._windows.clear()
        return summaries

    def __len__(self) -> int:
        """Kinds followed now."""
        return len(self._windows)

    def _expire(self, now: float) -> None:
        windows = self._windows
        while windows:
            kind, window = next(iter(windows.items()))
            if now - window.start < self.window_s:
                return
            del windows[kind]
            if window.held:
                self._summaries.append(window.summary(kind, now, self.max_addresses))
                windows[kind] = _Window(now)  # at the end: it ends last


# -- the shell -----------------------------------------------------------------------------

_collapser = Collapser()
# Where each kind's summaries go: the logger and level of its first line.
_sinks: dict[str, tuple[logging.Logger, int]] = {}
# The admin API's threads log too; the gateways, where clients are, have one thread.
_lock = threading.Lock()


def log_collapsed(
    logger: logging.Logger,
    level: int,
    kind: str,
    peer: str,
    message: str,
    *args: object,
    exc_info: bool = False,
) -> None:
    """Log `message % args` unless an event of `kind` was logged within the window (from
    any address): then only count it, with `peer`'s address ("": none), for the summary
    (`Collapser`). The line logged in full should name the peer: it stands for every
    address of its window. Quote client text in `args` through `client_text`."""
    now = time.monotonic()
    with _lock:
        _sinks[kind] = (logger, level)
        admitted = _collapser.admit(kind, peer_address(peer), now)
        summaries = _collapser.take(now)
    _emit(summaries)
    if admitted:
        logger.log(level, message, *args, exc_info=exc_info)


def flush_collapsed(*, everything: bool = False) -> None:
    """Log the summaries of the windows that ended (`everything`: of every window, when
    the process stops). Cheap when none ended: a worker calls it once per loop turn."""
    now = time.monotonic()
    with _lock:
        summaries = _collapser.take_all(now) if everything else _collapser.take(now)
    _emit(summaries)


def _emit(summaries: list[Collapsed]) -> None:
    for summary in summaries:
        logger, level = _sinks.get(summary.kind, (logging.getLogger("mpbroker"), logging.INFO))
        logger.log(level, "%s", summary.text())
