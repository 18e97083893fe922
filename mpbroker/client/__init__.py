"""A small STOMP 1.2 client (also speaks 1.0 and 1.1), blocking or trio.

Blocking, with a reader thread per connection::

    from mpbroker.client import connect

    with connect("127.0.0.1", 61613, heartbeat=(10_000, 10_000)) as conn:
        sub = conn.subscribe("/queue/orders", ack="client-individual")
        conn.send("/queue/orders", "hello", receipt=True)
        message = sub.get(timeout=5)
        conn.ack(message)

trio, with the connection's tasks in the ``async with`` block::

    from mpbroker.client import open_connection

    async with open_connection("127.0.0.1", 61613) as conn:
        sub = await conn.subscribe("/queue/orders")
        await conn.send("/queue/orders", "hello")
        async for message in sub:
            ...

Both are thin I/O shells around one sans-IO session and the project's own codec
(:mod:`mpbroker.stomp`). Both speak STOMP over TLS when given a client-side context::

    context = ssl.create_default_context(cafile="ca.pem")  # the CA of the broker's certificate
    with connect("127.0.0.1", 61614, ssl_context=context) as conn:
        ...
"""

from mpbroker.client._async import AsyncConnection, AsyncSubscription, open_connection
from mpbroker.client._errors import ConnectionClosed, ReceiptTimeout, StompError
from mpbroker.client._message import Message
from mpbroker.client._sync import Connection, Subscription, connect

__all__ = [
    "AsyncConnection",
    "AsyncSubscription",
    "Connection",
    "ConnectionClosed",
    "Message",
    "ReceiptTimeout",
    "StompError",
    "Subscription",
    "connect",
    "open_connection",
]
