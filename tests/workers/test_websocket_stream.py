"""The gateway's WebSocket stream with a client on the other end of an in-memory pipe:
what the reader owes a client while the writer is stuck sending to it."""

from __future__ import annotations

import logging

import trio.testing
from wsproto.connection import Connection, ConnectionType
from wsproto.events import Ping, Pong, TextMessage

from mpbroker.workers._websocket import WebSocketStream

Pipe = trio.StapledStream[trio.testing.MemorySendStream, trio.testing.MemoryReceiveStream]


def opened() -> tuple[WebSocketStream, Pipe, Connection]:
    client_end, server_end = trio.testing.memory_stream_pair()
    stream = WebSocketStream(
        server_end, Connection(ConnectionType.SERVER), 1024, "127.0.0.1:1", logging.getLogger("t")
    )
    return stream, client_end, Connection(ConnectionType.CLIENT)


async def test_pings_while_the_writer_is_stuck_owe_only_the_latest_pong() -> None:
    stream, client_end, client = opened()
    pings = b"".join(client.send(Ping(payload=b"%d" % n)) for n in range(1000))
    await client_end.send_all(pings + client.send(TextMessage(data="\n")))
    # The writer holds the lock (a client that reads nothing would keep it there): the
    # reader reads on, and what it owes does not grow with every ping.
    async with stream._send_lock:
        assert await stream.receive_some(65536) == b"\n"
        assert stream._owed == []
    # Once the writer is done, the latest ping is answered.
    await stream.send_frames([b"MESSAGE\n\n\x00"])
    client.receive_data(await client_end.receive_some(65536))
    events = list(client.events())
    assert [e.payload for e in events if isinstance(e, Pong)] == [b"999"]
    assert [e.data for e in events if isinstance(e, TextMessage)] == ["MESSAGE\n\n\x00"]


async def test_a_ping_while_nobody_sends_is_answered_at_once() -> None:
    stream, client_end, client = opened()
    await client_end.send_all(client.send(Ping(payload=b"p")) + client.send(TextMessage(data="\n")))
    assert await stream.receive_some(65536) == b"\n"
    client.receive_data(await client_end.receive_some(65536))
    assert [e.payload for e in client.events() if isinstance(e, Pong)] == [b"p"]
