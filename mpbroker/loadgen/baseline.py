"""The baseline: the simplest honest STOMP forwarder, one process, one thread.

It answers what one Python process on the same machine can do with the same codec, so a
benchmark can say what the broker's multi-process design buys. No rings, no stores, no
limits: a ``selectors`` loop that parses what each socket delivers (one big read at a time),
forwards every SEND as a MESSAGE -- to one subscriber, round robin, for a queue; to every
subscriber for a topic -- and writes each connection's output with one system call.

Windows: a subscription holds at most ``activemq.prefetchSize`` (default 1000) deliveries. In
client modes a delivery leaves the window when acknowledged (cumulatively for ``client``);
in auto mode when the connection's output buffer has been written to the socket in full,
so a slow reader is not flooded. Beyond the window, queues and topic subscribers keep
messages in unbounded in-memory backlogs (the bench bounds how far producers run ahead).
Transactions are refused. MESSAGE frames have the broker's shape (the same headers, and
message and ack ids without characters that STOMP 1.2 escapes), so clients do the same work
for both.

    python -m mpbroker.loadgen.baseline --port 0   # logs "baseline ready on 127.0.0.1:PORT"
"""

from __future__ import annotations

import argparse
import itertools
import selectors
import signal
import socket
import sys
from collections import OrderedDict, deque
from types import FrameType

from mpbroker.stomp import CLIENT_COMMANDS, Frame, FrameParser, ProtocolError, encode_frame

__all__ = ["BaselineServer", "main"]

_RECV_BYTES = 256 * 1024
_DEFAULT_PREFETCH = 1000
# Headers of a SEND that are about the SEND itself, not the message.
_SEND_ONLY_HEADERS = frozenset({"destination", "receipt", "content-length", "transaction"})

# A message: (message-id, destination, headers to copy into MESSAGE frames, body).
_Message = tuple[str, str, dict[str, str], bytes]


class _Refused(Exception):
    """A frame the baseline will not handle; answered with ERROR, then the connection closes."""


class _Sub:
    __slots__ = (
        "ack",
        "conn",
        "destination",
        "handle",
        "inflight",
        "pending",
        "prefetch",
        "sub_id",
        "unacked",
    )

    def __init__(
        self, conn: _Conn, handle: int, sub_id: str, destination: str, ack: str, prefetch: int
    ) -> None:
        self.conn = conn
        self.handle = handle
        self.sub_id = sub_id
        self.destination = destination
        self.ack = ack
        self.prefetch = prefetch
        # Auto mode: deliveries written to the output buffer but not yet to the socket.
        self.inflight = 0
        # Client modes: deliveries not acknowledged yet, oldest first. An OrderedDict, because
        # a cumulative ACK pops from the front, which is O(1) here and not in a plain dict
        # (whose iteration skips the slots of every entry popped before).
        self.unacked: OrderedDict[str, _Message] = OrderedDict()
        # Topic subscribers: messages waiting for room in the window, in order.
        self.pending: deque[_Message] = deque()

    def has_room(self) -> bool:
        used = self.inflight if self.ack == "auto" else len(self.unacked)
        return used < self.prefetch


class _Destination:
    __slots__ = ("next", "queue", "subs")

    def __init__(self) -> None:
        self.subs: list[_Sub] = []
        self.queue: deque[_Message] = deque()  # queues only
        self.next = 0  # round robin position (queues only)


class _Conn:
    __slots__ = ("closing", "handles", "out", "parser", "sock", "subs", "writing")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.parser = FrameParser(commands=CLIENT_COMMANDS)
        self.out = bytearray()
        self.subs: dict[str, _Sub] = {}
        # The same subscriptions by handle (as text), the first part of an ack id.
        self.handles: dict[str, _Sub] = {}
        self.closing = False
        # Registered for EVENT_WRITE because the socket did not take everything.
        self.writing = False


class BaselineServer:
    """A single-threaded STOMP forwarder on ``host:port`` (port 0: any free port)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.listener = socket.create_server((host, port), backlog=128)
        self.listener.setblocking(False)
        self.host, self.port = self.listener.getsockname()[:2]
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.destinations: dict[str, _Destination] = {}
        self.dirty: set[_Conn] = set()
        self.conns: set[_Conn] = set()
        self._message_ids = itertools.count(1)
        self._handles = itertools.count(1)

    def serve_forever(self) -> None:
        select = self.selector.select
        while True:
            for key, mask in select():
                conn = key.data
                if conn is None:
                    self._accept()
                    continue
                if mask & selectors.EVENT_READ:
                    self._read(conn)
                if mask & selectors.EVENT_WRITE:
                    self.dirty.add(conn)
            # Output is written once per loop, after every readable socket was handled:
            # one system call carries everything a connection got in this round.
            while self.dirty:
                dirty, self.dirty = self.dirty, set()
                for conn in dirty:
                    self._flush(conn)

    def close(self) -> None:
        for conn in list(self.conns):
            self._close(conn)
        self.selector.close()
        self.listener.close()

    # -- sockets ---------------------------------------------------------------------------

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(sock)
        self.conns.add(conn)
        self.selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(_RECV_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        try:
            for frame in conn.parser.feed(data):
                # After DISCONNECT or an ERROR, whatever else the client sent is ignored.
                if conn.closing:
                    break
                self._handle(conn, frame)
        except (ProtocolError, _Refused) as exc:
            self._error(conn, str(exc))

    def _flush(self, conn: _Conn) -> None:
        if conn not in self.conns:
            return
        out = conn.out
        if out:
            try:
                sent = conn.sock.send(out)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._close(conn)
                return
            del out[:sent]
        if out:
            if not conn.writing:
                conn.writing = True
                self.selector.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
            return
        if conn.writing:
            conn.writing = False
            self.selector.modify(conn.sock, selectors.EVENT_READ, conn)
        if conn.closing:
            self._close(conn)
            return
        # Everything reached the socket: auto-mode windows are free again.
        for sub in conn.subs.values():
            if sub.inflight:
                sub.inflight = 0
                self._refill(sub)

    def _close(self, conn: _Conn) -> None:
        if conn not in self.conns:
            return
        self.conns.discard(conn)
        self.dirty.discard(conn)
        self.selector.unregister(conn.sock)
        conn.sock.close()
        for sub in list(conn.subs.values()):
            self._remove(sub)

    def _error(self, conn: _Conn, message: str) -> None:
        conn.out += encode_frame(Frame("ERROR", {"message": message}))
        conn.closing = True
        self.dirty.add(conn)

    # -- frames ----------------------------------------------------------------------------

    def _handle(self, conn: _Conn, frame: Frame) -> None:
        command = frame.command
        headers = frame.headers
        if command == "SEND":
            self._send(headers, frame.body)
        elif command == "ACK" or command == "NACK":
            self._settle(conn, headers.get("id", ""), nack=command == "NACK")
        elif command == "SUBSCRIBE":
            self._subscribe(conn, headers)
        elif command == "UNSUBSCRIBE":
            sub = conn.subs.get(headers.get("id", ""))
            if sub is None:
                raise _Refused(f"no subscription {headers.get('id')!r}")
            self._remove(sub)
        elif command in ("CONNECT", "STOMP"):
            connected = {"version": "1.2", "heart-beat": "0,0", "server": "bench-baseline"}
            conn.out += encode_frame(Frame("CONNECTED", connected))
            self.dirty.add(conn)
        elif command == "DISCONNECT":
            conn.closing = True
        else:
            raise _Refused(f"{command} is not supported by the baseline server")
        receipt = headers.get("receipt")
        if receipt:
            conn.out += encode_frame(Frame("RECEIPT", {"receipt-id": receipt}))
            self.dirty.add(conn)

    def _send(self, headers: dict[str, str], body: bytes) -> None:
        destination = headers.get("destination", "")
        if not destination:
            raise _Refused("SEND needs a destination header")
        copied = {k: v for k, v in headers.items() if k not in _SEND_ONLY_HEADERS}
        message = (f"ID-baseline-{next(self._message_ids)}", destination, copied, body)
        dest = self.destinations.get(destination)
        if dest is None:
            dest = self.destinations[destination] = _Destination()
        if destination.startswith("/topic/"):
            for sub in dest.subs:
                if sub.pending or not sub.has_room():
                    sub.pending.append(message)
                else:
                    self._deliver(sub, message)
        else:
            dest.queue.append(message)
            self._dispatch(dest)

    def _subscribe(self, conn: _Conn, headers: dict[str, str]) -> None:
        destination = headers.get("destination", "")
        sub_id = headers.get("id", "")
        ack = headers.get("ack", "auto")
        if not destination or not sub_id:
            raise _Refused("SUBSCRIBE needs destination and id headers")
        if ack not in ("auto", "client", "client-individual"):
            raise _Refused(f"unknown ack mode {ack!r}")
        if sub_id in conn.subs:
            raise _Refused(f"subscription id {sub_id!r} is already in use")
        try:
            prefetch = int(headers.get("activemq.prefetchSize", _DEFAULT_PREFETCH))
        except ValueError:
            raise _Refused("activemq.prefetchSize must be an integer") from None
        sub = _Sub(conn, next(self._handles), sub_id, destination, ack, max(1, prefetch))
        conn.subs[sub_id] = sub
        conn.handles[str(sub.handle)] = sub
        dest = self.destinations.get(destination)
        if dest is None:
            dest = self.destinations[destination] = _Destination()
        dest.subs.append(sub)
        self._refill(sub)

    def _settle(self, conn: _Conn, ack_id: str, *, nack: bool) -> None:
        handle, _, message_id = ack_id.partition("/")
        sub = conn.handles.get(handle)
        if sub is None or message_id not in sub.unacked:
            return  # stale or repeated: nothing to settle
        settled: list[_Message] = []
        if sub.ack == "client":
            while sub.unacked:
                mid, message = sub.unacked.popitem(last=False)
                settled.append(message)
                if mid == message_id:
                    break
        else:
            settled.append(sub.unacked.pop(message_id))
        if nack:
            self._requeue(sub, settled)
        self._refill(sub)

    # -- distribution ----------------------------------------------------------------------

    def _deliver(self, sub: _Sub, message: _Message) -> None:
        message_id, destination, copied, body = message
        headers = {"subscription": sub.sub_id, "message-id": message_id, "destination": destination}
        if sub.ack == "auto":
            sub.inflight += 1
        else:
            headers["ack"] = f"{sub.handle}/{message_id}"
            sub.unacked[message_id] = message
        for key, value in copied.items():
            headers.setdefault(key, value)
        conn = sub.conn
        conn.out += encode_frame(Frame("MESSAGE", headers, body))
        self.dirty.add(conn)

    def _dispatch(self, dest: _Destination) -> None:
        """Queue: hand waiting messages to subscribers with room, round robin."""
        subs = dest.subs
        count = len(subs)
        waiting = dest.queue
        if not count or not waiting:
            return
        index = dest.next
        misses = 0
        while waiting and misses < count:
            sub = subs[index % count]
            index += 1
            if not sub.has_room():
                misses += 1
                continue
            misses = 0
            self._deliver(sub, waiting.popleft())
        dest.next = index % count

    def _refill(self, sub: _Sub) -> None:
        """A window has room again: a topic subscriber drains its backlog, a queue dispatches."""
        if sub.destination.startswith("/topic/"):
            while sub.pending and sub.has_room():
                self._deliver(sub, sub.pending.popleft())
        else:
            dest = self.destinations.get(sub.destination)
            if dest is not None:
                self._dispatch(dest)

    def _requeue(self, sub: _Sub, messages: list[_Message]) -> None:
        if sub.destination.startswith("/topic/"):
            sub.pending.extendleft(reversed(messages))
        else:
            dest = self.destinations.get(sub.destination)
            if dest is not None:
                dest.queue.extendleft(reversed(messages))
                self._dispatch(dest)

    def _remove(self, sub: _Sub) -> None:
        conn = sub.conn
        conn.subs.pop(sub.sub_id, None)
        conn.handles.pop(str(sub.handle), None)
        dest = self.destinations.get(sub.destination)
        if dest is None:
            return
        if sub in dest.subs:
            dest.subs.remove(sub)
        unsettled = list(sub.unacked.values())
        sub.unacked.clear()
        if unsettled and not sub.destination.startswith("/topic/"):
            dest.queue.extendleft(reversed(unsettled))
            self._dispatch(dest)
        if not dest.subs and not dest.queue:
            del self.destinations[sub.destination]


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mpbroker.loadgen.baseline", description=__doc__
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = BaselineServer(args.host, args.port)
    # SIGTERM ends the loop by raising SystemExit in the main thread; `finally` closes up.
    signal.signal(signal.SIGTERM, _stop)
    print(f"baseline ready on {server.host}:{server.port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
