"""The blocking client: a socket, a reader thread and, with heart-beats, a timer thread.

All protocol logic is in :mod:`mpbroker.client._session`; this module only moves bytes and
wakes waiting threads. Two locks, never both held at once:

* ``_lock`` guards the session and the subscription table; it is held only for short,
  non-blocking work, so the reader thread can always get it;
* ``_send_lock`` serialises ``sendall`` so frames from several threads never interleave.
  It is separate because ``sendall`` may block on a slow server, and holding ``_lock`` then
  would stop the reader from draining the socket: both sides would wait on full buffers.
"""

from __future__ import annotations

import logging
import select
import socket
import ssl
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import suppress
from types import TracebackType

from mpbroker.client._errors import ConnectionClosed, ReceiptTimeout, StompError
from mpbroker.client._message import Message
from mpbroker.client._session import (
    DEFAULT_MAX_FRAME_BYTES,
    ClientSession,
    Connected,
    Delivery,
    Outgoing,
    ReceiptReceived,
    SessionView,
    State,
    SubscriptionInfo,
)

log = logging.getLogger("mpbroker.client")

# One recv() per wake-up; 64 KiB holds many typical frames and costs nothing when idle.
_RECV_BYTES = 65536

Callback = Callable[[Message], None]


def connect(
    host: str = "127.0.0.1",
    port: int = 61613,
    *,
    login: str | None = None,
    passcode: str | None = None,
    client_id: str | None = None,
    heartbeat: tuple[int, int] = (0, 0),
    timeout: float = 10.0,
    vhost: str | None = None,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ssl_context: ssl.SSLContext | None = None,
) -> Connection:
    """Open a STOMP connection and wait for CONNECTED.

    ``heartbeat`` is the CONNECT ``heart-beat`` header in milliseconds: (how often we can
    send, how often we want the server to send). ``vhost`` goes into the ``host`` header and
    defaults to ``host``. ``max_frame_bytes`` bounds the frames accepted from the server.
    ``ssl_context``: STOMP over TLS, with this client-side context (its CAs check the
    server's certificate against ``host``; load a client certificate into it if the server
    asks for one). Raises :class:`StompError` if the server answers with ERROR, ``OSError``
    if the TCP connection fails (``ssl.SSLError``, an ``OSError``, if the TLS handshake does)
    and ``TimeoutError`` (an ``OSError``) if a step takes longer than ``timeout`` seconds.

    The connection is a context manager; leaving the block sends DISCONNECT and waits for
    its RECEIPT (when the block raised, a failing DISCONNECT is not reported).

    Example::

        with connect(port=61613) as conn:
            conn.send("/queue/a", "hello", receipt=True)
    """
    session = ClientSession(
        vhost if vhost is not None else host,
        login=login,
        passcode=passcode,
        client_id=client_id,
        heartbeat=heartbeat,
        max_frame_bytes=max_frame_bytes,
    )
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        # Frames are written whole with one sendall; Nagle would only delay small ones.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport: socket.socket | _TlsSocket = sock
        if ssl_context is None:
            sock.settimeout(None)
        else:
            # The handshake runs here, within the connect timeout still set on the socket.
            sock = ssl_context.wrap_socket(sock, server_hostname=host)
            transport = _TlsSocket(sock)
        conn = Connection(transport, session, f"{host}:{port}")
    except BaseException:
        sock.close()
        raise
    conn._handshake(timeout)
    return conn


class _TlsSocket:
    """An `ssl.SSLSocket` that the reader thread and the sending threads may use at once.

    OpenSSL forbids two threads in one connection's SSL object at the same time (a read in
    one, a write in the other included), and Python 3.11's ssl module does not stop them:
    the socket is non-blocking, every SSL call runs under a lock and returns at once, and
    the waiting for the socket happens outside the lock, so that the reader never holds up
    a sender, nor a sender the reader. The methods are those `Connection` uses.
    """

    def __init__(self, sock: ssl.SSLSocket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._lock = threading.Lock()

    def recv(self, size: int) -> bytes:
        while True:
            with self._lock:
                try:
                    return self._sock.recv(size)
                except ssl.SSLWantReadError:
                    events = select.POLLIN
                except ssl.SSLWantWriteError:
                    events = select.POLLOUT
            self._wait(events)

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            with self._lock:
                try:
                    view = view[self._sock.send(view) :]
                    continue
                except ssl.SSLWantWriteError:
                    events = select.POLLOUT
                except ssl.SSLWantReadError:
                    events = select.POLLIN
            self._wait(events)

    def _wait(self, events: int) -> None:
        """Until the socket is ready for `events`, or shut down (the next call says so)."""
        poll = select.poll()
        poll.register(self._sock, events)
        poll.poll()

    def shutdown(self, how: int) -> None:
        # Under the lock: SSLSocket.shutdown drops the SSL object a call may be using.
        with self._lock:
            self._sock.shutdown(how)

    def close(self) -> None:
        with self._lock:
            self._sock.close()


class Connection(SessionView):
    """A connected STOMP session; make one with :func:`connect`.

    A context manager: leaving the ``with`` block disconnects. Every method may be called from
    any thread. Operations on a closed connection raise :class:`ConnectionClosed`.
    """

    def __init__(self, sock: socket.socket | _TlsSocket, session: ClientSession, peer: str) -> None:
        self._sock = sock
        self._session = session
        self._peer = peer
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        # Signalled whenever the session state or a receipt changes.
        self._settled = threading.Condition(self._lock)
        self._subscriptions: dict[str, Subscription] = {}
        self._stop = threading.Event()
        self._reader = threading.Thread(
            target=self._read_loop, name=f"stomp-reader {peer}", daemon=True
        )
        self._timer: threading.Thread | None = None

    # --- public state ----------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"<Connection {self._peer} {self._session.state.value} STOMP {self.version}>"

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.disconnect()
            return
        # Do not let a failed DISCONNECT hide the exception that ended the block.
        with suppress(StompError):
            self.disconnect()

    # --- operations ------------------------------------------------------------------------

    def send(
        self,
        destination: str,
        body: bytes | str = b"",
        headers: Mapping[str, str] | None = None,
        *,
        receipt: bool = False,
        timeout: float = 10.0,
    ) -> None:
        """Send a message. With ``receipt=True`` wait until the server confirms it.

        A ``str`` body is sent as UTF-8 with ``content-type: text/plain;charset=utf-8``
        unless ``headers`` sets one. Raises :class:`ReceiptTimeout` if the RECEIPT does not
        come within ``timeout`` seconds, :class:`StompError` if the server sends ERROR.
        """
        self._guard_receipt("send()", receipt)
        with self._lock:
            out = self._session.send(destination, body, headers, receipt=receipt)
        self._transmit(out, "send()", timeout)

    def subscribe(
        self,
        destination: str,
        *,
        ack: str = "auto",
        id: str | None = None,
        prefetch: int | None = None,
        selector: str | None = None,
        headers: Mapping[str, str] | None = None,
        receipt: bool = True,
        callback: Callback | None = None,
        timeout: float = 10.0,
    ) -> Subscription:
        """Subscribe; by default wait until the server confirmed the subscription.

        ``ack`` is ``auto``, ``client`` or ``client-individual``; ``prefetch`` becomes the
        ``activemq.prefetchSize`` header; ``selector`` the ``selector`` header (a JMS
        message selector: only the messages it selects are delivered). With ``callback``,
        each message is passed to it on the reader thread instead of being queued for
        :meth:`Subscription.get`; the callback may send and ack, but not wait for receipts
        (that would block the thread that reads them).
        """
        self._guard_receipt("subscribe()", receipt)
        with self._lock:
            info, out = self._session.subscribe(
                destination,
                ack=ack,
                id=id,
                prefetch=prefetch,
                selector=selector,
                headers=headers,
                receipt=receipt,
            )
            sub = Subscription(self, info, callback)
            self._subscriptions[info.id] = sub
        try:
            self._transmit(out, "subscribe()", timeout)
        except ReceiptTimeout:
            # The caller gets no handle, so nothing would ever read this subscription's queue.
            with suppress(StompError):
                self.unsubscribe(sub, receipt=False)
            raise
        return sub

    def unsubscribe(
        self, subscription: Subscription, *, receipt: bool = True, timeout: float = 10.0
    ) -> None:
        """End a subscription; its iterators stop after the messages already queued."""
        if subscription._conn is not self:
            raise ValueError(f"subscription {subscription.id!r} belongs to another connection")
        self._guard_receipt("unsubscribe()", receipt)
        with self._lock:
            out = self._session.unsubscribe(subscription.id, receipt=receipt)
            self._subscriptions.pop(subscription.id, None)
            subscription._end()
        self._transmit(out, "unsubscribe()", timeout)

    def ack(self, message: Message, *, receipt: bool = False, timeout: float = 10.0) -> None:
        """Acknowledge a message of a ``client`` or ``client-individual`` subscription."""
        self._guard_receipt("ack()", receipt)
        with self._lock:
            out = self._session.ack(message, receipt=receipt)
        self._transmit(out, "ack()", timeout)

    def nack(self, message: Message, *, receipt: bool = False, timeout: float = 10.0) -> None:
        """Reject a message of a ``client`` or ``client-individual`` subscription."""
        self._guard_receipt("nack()", receipt)
        with self._lock:
            out = self._session.nack(message, receipt=receipt)
        self._transmit(out, "nack()", timeout)

    def disconnect(self, *, receipt: bool = True, timeout: float = 10.0) -> None:
        """Send DISCONNECT, wait for its RECEIPT, close the socket.

        On an already closed connection this only releases the socket and threads, so it is
        safe in ``finally`` blocks. The server closing the socket instead of answering counts
        as done; an ERROR raises :class:`StompError`.
        """
        self._guard_receipt("disconnect()", receipt)
        with self._lock:
            out = None
            if self._session.state is State.CONNECTED:
                out = self._session.disconnect(receipt=receipt)
        try:
            if out is not None:
                self._transmit(out, "disconnect()", timeout)
        except ConnectionClosed:
            pass
        finally:
            self.close()

    def close(self) -> None:
        """Close the socket at once, without DISCONNECT; waits for the client's threads."""
        self._shutdown("the client closed the connection")
        current = threading.current_thread()
        for thread in (self._reader, self._timer):
            # A callback may close the connection from the reader thread itself.
            if thread is not None and thread is not current and thread.is_alive():
                thread.join()
        with self._send_lock:
            self._sock.close()

    # --- internals -------------------------------------------------------------------------

    def _guard_receipt(self, operation: str, receipt: bool) -> None:
        if receipt and threading.current_thread() is self._reader:
            raise RuntimeError(
                f"{operation} with receipt=True inside a subscription callback would deadlock: "
                "callbacks run on the thread that reads the RECEIPT"
            )

    def _handshake(self, timeout: float) -> None:
        self._reader.start()
        try:
            with self._lock:
                # The reader may have found the connection ended already (a TLS alert
                # refusing us comes at once): then the reason is all there is to say.
                data = None if self._session.closed else self._session.connect()
            if data is not None:
                self._send_bytes(data, "connect()")
            with self._lock:
                answered = self._settled.wait_for(
                    lambda: self._session.state is not State.CONNECTING, timeout
                )
                if not answered:
                    raise TimeoutError(f"no CONNECTED from {self._peer} within {timeout:g} s")
                if self._session.closed:
                    if self._session.error is not None:
                        raise self._session.error.copy()
                    raise self._session.closed_error("connect()")
        except BaseException:
            self.close()
            raise
        if self._session.send_interval_s or self._session.expect_interval_s:
            self._timer = threading.Thread(
                target=self._timer_loop, name=f"stomp-heartbeat {self._peer}", daemon=True
            )
            self._timer.start()

    def _transmit(self, out: Outgoing, operation: str, timeout: float) -> None:
        self._send_bytes(out.data, operation)
        if out.receipt is None:
            return
        receipt_id = out.receipt
        with self._lock:
            self._settled.wait_for(lambda: self._session.receipt_settled(receipt_id), timeout)
            self._session.finish_receipt(receipt_id, timeout)

    def _send_bytes(self, data: bytes, operation: str) -> None:
        with self._send_lock:
            try:
                self._sock.sendall(data)
                return
            except OSError as exc:
                failure = exc
        self._shutdown(f"sending to {self._peer} failed: {failure}")
        with self._lock:
            raise self._session.closed_error(operation)

    def _shutdown(self, reason: str) -> None:
        """Close the session (the first reason wins) and wake every waiter."""
        with self._lock:
            self._session.close(reason)
            self._settled.notify_all()
            for sub in self._subscriptions.values():
                sub._end()
            self._subscriptions.clear()
        self._stop.set()
        # shutdown(), unlike close(), makes a recv() blocked in the reader thread return.
        with suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def _read_loop(self) -> None:
        reason = "the server closed the connection"
        try:
            while True:
                data = self._sock.recv(_RECV_BYTES)
                if not data:
                    break
                callbacks: list[tuple[Callback, Message]] = []
                with self._lock:
                    for event in self._session.receive_data(data):
                        if isinstance(event, Delivery):
                            sub = self._subscriptions.get(event.message.subscription)
                            if sub is None:
                                continue
                            if sub._callback is not None:
                                callbacks.append((sub._callback, event.message))
                            else:
                                sub._put(event.message)
                        elif isinstance(event, Connected | ReceiptReceived):
                            self._settled.notify_all()
                    closed = self._session.closed
                # Outside the lock: callbacks may call back into the connection.
                for callback, message in callbacks:
                    _run_callback(callback, message)
                if closed:
                    break
        except OSError as exc:
            reason = f"connection to {self._peer} lost: {exc}"
        finally:
            self._shutdown(reason)
            with self._send_lock:
                self._sock.close()

    def _timer_loop(self) -> None:
        while True:
            with self._lock:
                data, wait = self._session.poll_heartbeat()
                closed = self._session.closed
            if closed:
                self._shutdown("heart-beat timer stopped")  # wakes waiters; keeps the reason
                return
            if data:
                try:
                    self._send_bytes(data, "send a heart-beat")
                except ConnectionClosed:
                    return
            if wait is None or self._stop.wait(wait):
                return


def _run_callback(callback: Callback, message: Message) -> None:
    try:
        callback(message)
    except Exception:
        # A failing callback must not kill the reader thread, or every later message,
        # receipt and ERROR on this connection would go unread.
        log.exception(
            "subscription callback failed on message %r (subscription %r)",
            message.message_id,
            message.subscription,
        )


class Subscription:
    """An active subscription; iterate over it or :meth:`get` messages.

    Messages already received stay readable after the subscription or the connection ends;
    after that :meth:`get` returns ``None`` and iteration stops.
    """

    def __init__(self, conn: Connection, info: SubscriptionInfo, callback: Callback | None) -> None:
        self.id = info.id
        self.destination = info.destination
        self.ack_mode = info.ack_mode
        self._conn = conn
        self._callback = callback
        self._queue: deque[Message] = deque()
        # Shares the connection's lock: the reader queues under it already.
        self._ready = threading.Condition(conn._lock)
        self._ended = False

    def __repr__(self) -> str:
        return f"<Subscription {self.id!r} {self.destination!r} ack={self.ack_mode}>"

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message; ``None`` after ``timeout`` seconds or once the subscription ended."""
        with self._ready:
            self._ready.wait_for(lambda: self._queue or self._ended, timeout)
            return self._queue.popleft() if self._queue else None

    def __iter__(self) -> Iterator[Message]:
        """Messages as they come; blocks, and ends when the subscription or connection does."""
        while (message := self.get()) is not None:
            yield message

    def _put(self, message: Message) -> None:  # with the connection's lock held
        self._queue.append(message)
        self._ready.notify()

    def _end(self) -> None:  # with the connection's lock held
        self._ended = True
        self._ready.notify_all()
