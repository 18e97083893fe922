"""An outbound ring and the records it could not take yet."""

from __future__ import annotations

from collections import deque

from mpbroker import records
from mpbroker.shm import RingWriter

__all__ = ["Outlet"]


class Outlet:
    """Records for one reader, in order: staged into its ring as room allows.

    A full ring (a slow or restarting reader) never blocks the writer's loop: what does
    not fit waits here and goes with the next flush.
    """

    __slots__ = ("backlog", "writer")

    def __init__(self, writer: RingWriter) -> None:
        self.writer = writer
        self.backlog: deque[tuple[int, bytes]] = deque()

    def add(self, record: records.Record) -> None:
        self.backlog.append((record.kind, records.encode_payload(record)))

    def flush(self) -> None:
        backlog = self.backlog
        if not backlog:
            return
        writer = self.writer
        while backlog:
            kind, payload = backlog[0]
            if not writer.stage(kind, payload):
                break
            backlog.popleft()
        writer.publish()

    def clear(self) -> None:
        self.backlog.clear()

    def __bool__(self) -> bool:
        """True while records wait for room in the ring."""
        return bool(self.backlog)
