"""The trio client: the same session core, with tasks instead of threads.

The idiom is ``async with open_connection(...) as conn``. A connection needs background tasks
(the reader, the heart-beat timer, callback runners), and in trio background tasks live in a
nursery that some ``async with`` block owns; an awaitable ``connect()`` would have to hide
one. So the connection exists exactly as long as the block: leaving it sends DISCONNECT
(as the sync client's ``with`` does), and no task outlives it.
"""

from __future__ import annotations

import logging
import math
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, suppress

import trio

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

_RECV_BYTES = 65536

AsyncCallback = Callable[[Message], Awaitable[None]]

# What a broken or closed trio stream raises; all of them mean "this connection is over".
_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


@asynccontextmanager
async def open_connection(
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
) -> AsyncIterator[AsyncConnection]:
    """Connect, wait for CONNECTED, and yield the :class:`AsyncConnection`.

    Parameters and errors are those of :func:`mpbroker.client.connect`: :class:`StompError`
    if the server answers ERROR, ``OSError``/``TimeoutError`` if it cannot be reached or does
    not answer within ``timeout`` seconds, ``ssl.SSLError`` if the TLS handshake (with
    ``ssl_context``) fails. Leaving the block sends DISCONNECT and waits for its RECEIPT.
    Exceptions from the body come out as raised, not in an ExceptionGroup.

    Example::

        async with open_connection(port=61613) as conn:
            sub = await conn.subscribe("/queue/a")
            await conn.send("/queue/a", "hello")
            message = await sub.get(timeout=5)
    """
    session = ClientSession(
        vhost if vhost is not None else host,
        login=login,
        passcode=passcode,
        client_id=client_id,
        heartbeat=heartbeat,
        max_frame_bytes=max_frame_bytes,
    )
    stream: trio.abc.Stream | None = None
    with trio.move_on_after(timeout):
        stream = await _open_stream(host, port, ssl_context)
    if stream is None:
        kind = "TCP" if ssl_context is None else "TLS"
        raise TimeoutError(f"{kind} connection to {host}:{port} not made within {timeout:g} s")
    # Trio wraps anything raised inside a nursery block in an ExceptionGroup; callers should
    # see their own exceptions and ours as raised, so they are carried out of the block.
    failure: Exception | None = None
    try:
        async with trio.open_nursery() as nursery:
            conn = AsyncConnection(stream, session, nursery, f"{host}:{port}")
            try:
                nursery.start_soon(conn._read_loop)
                await conn._handshake(timeout)
                try:
                    yield conn
                except Exception:
                    # Do not let a failed DISCONNECT hide the exception that ended the block.
                    with suppress(StompError):
                        await conn.disconnect()
                    raise
                await conn.disconnect()
            except Exception as exc:
                failure = exc
            finally:
                # The block is over: nothing may keep running on its behalf.
                nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(stream)
    if failure is not None:
        raise failure


async def _open_stream(host: str, port: int, ssl_context: ssl.SSLContext | None) -> trio.abc.Stream:
    """A TCP connection to `host`, with TLS over it when there is a context."""
    tcp = await trio.open_tcp_stream(host, port)
    if ssl_context is None:
        return tcp
    tls = trio.SSLStream(tcp, ssl_context, server_hostname=host)
    try:
        # Now rather than at the first read or write: its failure is the caller's to see.
        await tls.do_handshake()
    except BaseException as exc:
        await trio.aclose_forcefully(tls)
        cause = exc.__cause__
        if isinstance(exc, trio.BrokenResourceError) and isinstance(cause, ssl.SSLError):
            raise cause from None  # as the sync client raises it
        raise
    return tls


class AsyncConnection(SessionView):
    """A connected STOMP session in trio; make one with :func:`open_connection`.

    Same operations and errors as the sync :class:`~mpbroker.client.Connection`, as
    coroutines. Frames from concurrent tasks never interleave.
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        session: ClientSession,
        nursery: trio.Nursery,
        peer: str,
    ) -> None:
        self._stream = stream
        self._session = session
        self._nursery = nursery
        self._peer = peer
        # A stream refuses concurrent send_all calls outright; the lock queues them.
        self._send_lock = trio.Lock()
        self._connected = trio.Event()
        self._receipts: dict[str, trio.Event] = {}
        self._subscriptions: dict[str, AsyncSubscription] = {}
        # The reader and the timer stop when the connection closes; callback runners do not
        # (they finish the messages already queued), so they are not under these scopes.
        self._reader_scope = trio.CancelScope()
        self._timer_scope = trio.CancelScope()

    # --- public state ----------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"<AsyncConnection {self._peer} {self._session.state.value} STOMP {self.version}>"

    # --- operations ------------------------------------------------------------------------

    async def send(
        self,
        destination: str,
        body: bytes | str = b"",
        headers: Mapping[str, str] | None = None,
        *,
        receipt: bool = False,
        timeout: float = 10.0,
    ) -> None:
        """Send a message; see :meth:`mpbroker.client.Connection.send`."""
        out = self._session.send(destination, body, headers, receipt=receipt)
        await self._transmit(out, "send()", timeout)

    async def subscribe(
        self,
        destination: str,
        *,
        ack: str = "auto",
        id: str | None = None,
        prefetch: int | None = None,
        selector: str | None = None,
        headers: Mapping[str, str] | None = None,
        receipt: bool = True,
        callback: AsyncCallback | None = None,
        timeout: float = 10.0,
    ) -> AsyncSubscription:
        """Subscribe; see :meth:`mpbroker.client.Connection.subscribe`.

        ``callback`` is an async function; a task of the connection awaits it for each
        message in turn, so it may await receipts. An exception from it is logged, and the
        next message still goes to it.
        """
        info, out = self._session.subscribe(
            destination,
            ack=ack,
            id=id,
            prefetch=prefetch,
            selector=selector,
            headers=headers,
            receipt=receipt,
        )
        sub = AsyncSubscription(self, info)
        self._subscriptions[info.id] = sub
        if callback is not None:
            self._nursery.start_soon(_run_callbacks, sub, callback)
        try:
            await self._transmit(out, "subscribe()", timeout)
        except ReceiptTimeout:
            # The caller gets no handle, so nothing would ever read this subscription.
            with suppress(StompError):
                await self.unsubscribe(sub, receipt=False)
            raise
        return sub

    async def unsubscribe(
        self, subscription: AsyncSubscription, *, receipt: bool = True, timeout: float = 10.0
    ) -> None:
        """End a subscription; its iterators stop after the messages already queued."""
        if subscription._conn is not self:
            raise ValueError(f"subscription {subscription.id!r} belongs to another connection")
        out = self._session.unsubscribe(subscription.id, receipt=receipt)
        self._subscriptions.pop(subscription.id, None)
        subscription._end()
        await self._transmit(out, "unsubscribe()", timeout)

    async def ack(self, message: Message, *, receipt: bool = False, timeout: float = 10.0) -> None:
        """Acknowledge a message of a ``client`` or ``client-individual`` subscription."""
        await self._transmit(self._session.ack(message, receipt=receipt), "ack()", timeout)

    async def nack(self, message: Message, *, receipt: bool = False, timeout: float = 10.0) -> None:
        """Reject a message of a ``client`` or ``client-individual`` subscription."""
        await self._transmit(self._session.nack(message, receipt=receipt), "nack()", timeout)

    async def disconnect(self, *, receipt: bool = True, timeout: float = 10.0) -> None:
        """Send DISCONNECT, wait for its RECEIPT, close; see the sync ``disconnect``."""
        try:
            if self._session.state is State.CONNECTED:
                out = self._session.disconnect(receipt=receipt)
                await self._transmit(out, "disconnect()", timeout)
        except ConnectionClosed:
            pass
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the socket at once, without DISCONNECT."""
        self._shutdown("the client closed the connection")
        await trio.aclose_forcefully(self._stream)

    # --- internals -------------------------------------------------------------------------

    async def _handshake(self, timeout: float) -> None:
        await self._send_bytes(self._session.connect(), "connect()")
        with trio.move_on_after(timeout):
            await self._connected.wait()
        if self._session.state is State.CONNECTING:
            self._shutdown("no CONNECTED in time")
            raise TimeoutError(f"no CONNECTED from {self._peer} within {timeout:g} s")
        if self._session.closed:
            if self._session.error is not None:
                raise self._session.error.copy()
            raise self._session.closed_error("connect()")
        if self._session.send_interval_s or self._session.expect_interval_s:
            self._nursery.start_soon(self._timer_loop)

    async def _transmit(self, out: Outgoing, operation: str, timeout: float) -> None:
        receipt_id = out.receipt
        if receipt_id is None:
            await self._send_bytes(out.data, operation)
            return
        # Registered before sending: the RECEIPT may arrive before send_all returns.
        settled = self._receipts[receipt_id] = trio.Event()
        try:
            await self._send_bytes(out.data, operation)
            with trio.move_on_after(timeout):
                await settled.wait()
            self._session.finish_receipt(receipt_id, timeout)
        finally:
            self._receipts.pop(receipt_id, None)

    async def _send_bytes(self, data: bytes, operation: str) -> None:
        async with self._send_lock:
            try:
                await self._stream.send_all(data)
                return
            except _STREAM_ERRORS as exc:
                failure = f"sending to {self._peer} failed: {exc!r}"
            except trio.Cancelled:
                # A cancelled send_all may have written part of a frame; whatever we sent
                # next would be read as its continuation.
                self._shutdown("a send was cancelled part-way through a frame")
                raise
        self._shutdown(failure)
        raise self._session.closed_error(operation)

    def _shutdown(self, reason: str) -> None:
        """Close the session (the first reason wins), wake every waiter, stop the reader."""
        self._session.close(reason)
        self._connected.set()
        for event in self._receipts.values():
            event.set()
        for sub in self._subscriptions.values():
            sub._end()
        self._subscriptions.clear()
        self._reader_scope.cancel()
        self._timer_scope.cancel()

    async def _read_loop(self) -> None:
        reason = "the server closed the connection"
        with self._reader_scope:
            try:
                while not self._session.closed:
                    # Typed bytes | bytearray for any stream; bytes of trio's (no copy).
                    data = bytes(await self._stream.receive_some(_RECV_BYTES))
                    if not data:
                        break
                    for event in self._session.receive_data(data):
                        if isinstance(event, Delivery):
                            sub = self._subscriptions.get(event.message.subscription)
                            if sub is not None:
                                sub._put(event.message)
                        elif isinstance(event, Connected):
                            self._connected.set()
                        elif isinstance(event, ReceiptReceived):
                            settled = self._receipts.get(event.receipt_id)
                            if settled is not None:
                                settled.set()
            except _STREAM_ERRORS as exc:
                reason = f"connection to {self._peer} lost: {exc!r}"
            finally:
                self._shutdown(reason)

    async def _timer_loop(self) -> None:
        with self._timer_scope:
            while True:
                data, wait = self._session.poll_heartbeat()
                if self._session.closed:
                    self._shutdown("heart-beat timer stopped")  # wakes waiters; keeps the reason
                    return
                if data:
                    try:
                        await self._send_bytes(data, "send a heart-beat")
                    except ConnectionClosed:
                        return
                if wait is None:
                    return
                await trio.sleep(wait)


async def _run_callbacks(sub: AsyncSubscription, callback: AsyncCallback) -> None:
    async for message in sub:
        try:
            await callback(message)
        except Exception:
            # Same rule as the sync client: one bad message must not stop the subscription.
            log.exception(
                "subscription callback failed on message %r (subscription %r)",
                message.message_id,
                message.subscription,
            )


class AsyncSubscription:
    """An active subscription: ``async for message in sub`` or ``await sub.get(timeout)``.

    Messages already received stay readable after the subscription or the connection ends;
    after that :meth:`get` returns ``None`` and iteration stops.
    """

    def __init__(self, conn: AsyncConnection, info: SubscriptionInfo) -> None:
        self.id = info.id
        self.destination = info.destination
        self.ack_mode = info.ack_mode
        self._conn = conn
        # Unbounded like the sync client's queue: flow control is the server's prefetch
        # window, and a reader that blocked here would also stop receipts and heart-beats.
        self._sender, self._receiver = trio.open_memory_channel[Message](math.inf)

    def __repr__(self) -> str:
        return f"<AsyncSubscription {self.id!r} {self.destination!r} ack={self.ack_mode}>"

    async def get(self, timeout: float | None = None) -> Message | None:
        """The next message; ``None`` after ``timeout`` seconds or once the subscription ended."""
        try:
            with trio.move_on_after(math.inf if timeout is None else timeout):
                return await self._receiver.receive()
        except trio.EndOfChannel:
            return None
        return None

    def __aiter__(self) -> AsyncSubscription:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self._receiver.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def _put(self, message: Message) -> None:
        self._sender.send_nowait(message)

    def _end(self) -> None:
        self._sender.close()
