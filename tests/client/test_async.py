"""The trio client against the fake server (which runs in threads, outside trio)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any

import pytest
import trio

from mpbroker.client import (
    AsyncConnection,
    ConnectionClosed,
    Message,
    ReceiptTimeout,
    StompError,
    open_connection,
)
from mpbroker.stomp import Frame

from .conftest import WAIT_S, FakeServer


async def wait_frame(server: FakeServer, command: str, count: int = 1) -> Frame:
    # The fake server's waits block; in a thread they do not stall the client's tasks.
    return await trio.to_thread.run_sync(partial(server.wait_for_frame, command, count=count))


async def wait_closed(conn: AsyncConnection) -> None:
    with trio.fail_after(WAIT_S):
        while not conn.closed:
            await trio.sleep(0.005)


def conn_to(server: FakeServer, **kwargs: Any) -> AbstractAsyncContextManager[AsyncConnection]:
    return open_connection("127.0.0.1", server.port, timeout=WAIT_S, **kwargs)


async def test_connect_negotiates_and_disconnects_on_exit(server: FakeServer) -> None:
    server.version = "1.1"
    async with conn_to(server, login="alice", passcode="pw", vhost="vh") as conn:
        assert conn.version == "1.1"
        assert conn.server_headers["server"] == "fake/1"
    connect_frame = await wait_frame(server, "CONNECT")
    assert connect_frame.headers["host"] == "vh"
    assert connect_frame.headers["login"] == "alice"
    assert "receipt" in (await wait_frame(server, "DISCONNECT")).headers
    assert conn.closed


async def test_error_instead_of_connected_raises_unwrapped(server: FakeServer) -> None:
    server.connect_error = "bad credentials"
    with pytest.raises(StompError, match="bad credentials"):
        async with conn_to(server):
            pytest.fail("connected despite the ERROR")


async def test_connect_times_out(server: FakeServer) -> None:
    server.answer_connect = False
    with pytest.raises(TimeoutError, match="no CONNECTED"):
        async with open_connection("127.0.0.1", server.port, timeout=0.1):
            pass


async def test_exception_in_block_comes_out_unwrapped(server: FakeServer) -> None:
    with pytest.raises(KeyError):
        async with conn_to(server) as conn:
            raise KeyError("boom")
    assert conn.closed
    assert len(server.frames_of("DISCONNECT")) == 1


async def test_send_with_and_without_receipt(server: FakeServer) -> None:
    async with conn_to(server) as conn:
        await conn.send("/queue/a", b"one")
        await conn.send("/queue/a", "two", receipt=True)
        first, second = server.frames_of("SEND")
    assert first.body == b"one" and "receipt" not in first.headers
    assert second.body == b"two" and "receipt" in second.headers


async def test_receipt_timeout(server: FakeServer) -> None:
    server.auto_receipt = False
    async with conn_to(server) as conn:
        with pytest.raises(ReceiptTimeout):
            await conn.send("/queue/a", b"x", receipt=True, timeout=0.1)
        await conn.send("/queue/a", b"still usable")


async def test_concurrent_senders_never_interleave(server: FakeServer) -> None:
    body = b"y" * 100_000
    async with conn_to(server) as conn:
        async with trio.open_nursery() as nursery:
            for n in range(20):
                nursery.start_soon(partial(conn.send, "/queue/a", body, {"n": str(n)}))
        await wait_frame(server, "SEND", count=20)
    assert {f.headers["n"] for f in server.frames_of("SEND")} == {str(n) for n in range(20)}
    assert all(f.body == body for f in server.frames_of("SEND"))


async def test_subscribe_iterate_and_get(server: FakeServer) -> None:
    async with conn_to(server) as conn:
        sub = await conn.subscribe("/queue/a", prefetch=1)
        assert server.frames_of("SUBSCRIBE")[0].headers["activemq.prefetchSize"] == "1"
        assert await sub.get(timeout=0.01) is None
        for i in range(3):
            server.deliver("/queue/a", f"m{i}".encode())
        bodies = []
        async for message in sub:
            bodies.append(message.body)
            if len(bodies) == 3:
                break
        assert bodies == [b"m0", b"m1", b"m2"]
        await conn.unsubscribe(sub)
        assert server.frames_of("UNSUBSCRIBE")[0].headers["id"] == sub.id
        assert await sub.get() is None


async def test_async_callback_may_await_receipts(server: FakeServer) -> None:
    acked = trio.Event()

    async with conn_to(server) as conn:

        async def on_message(message: Message) -> None:
            await conn.ack(message, receipt=True)
            acked.set()

        await conn.subscribe("/queue/a", ack="client", callback=on_message)
        server.deliver("/queue/a", b"x")
        with trio.fail_after(WAIT_S):
            await acked.wait()
    (ack,) = server.frames_of("ACK")
    assert ack.headers["id"].startswith("ack-")


async def test_ack_and_nack_ids(server: FakeServer) -> None:
    async with conn_to(server) as conn:
        sub = await conn.subscribe("/queue/a", ack="client-individual")
        server.deliver("/queue/a", b"1")
        server.deliver("/queue/a", b"2")
        first, second = await sub.get(WAIT_S), await sub.get(WAIT_S)
        assert first is not None and second is not None
        await conn.ack(first)
        await conn.nack(second, receipt=True)
        ack = await wait_frame(server, "ACK")
        nack = server.frames_of("NACK")[0]
    assert ack.headers["id"] == first.ack_id
    assert nack.headers["id"] == second.ack_id


async def test_error_wakes_every_waiter(server: FakeServer) -> None:
    server.auto_receipt = False
    results: dict[str, object] = {}
    async with conn_to(server) as conn:
        sub = await conn.subscribe("/queue/a", receipt=False)

        async def wait_receipt() -> None:
            try:
                await conn.send("/queue/a", b"x", receipt=True, timeout=WAIT_S)
            except StompError as exc:
                results["receipt"] = exc

        async def wait_get() -> None:
            results["get"] = await sub.get()

        async def wait_iter() -> None:
            results["iter"] = [m async for m in sub]

        with trio.fail_after(WAIT_S):
            async with trio.open_nursery() as nursery:
                for waiter in (wait_receipt, wait_get, wait_iter):
                    nursery.start_soon(waiter)
                await wait_frame(server, "SEND")
                server.send_error("destination full")
        assert conn.closed
        assert conn.error is not None and conn.error.message == "destination full"
        with pytest.raises(ConnectionClosed, match="destination full"):
            await conn.send("/queue/a")
    receipt_error = results["receipt"]
    assert isinstance(receipt_error, StompError)
    assert receipt_error.message == "destination full"
    assert results["get"] is None
    assert results["iter"] == []


async def test_heartbeats_sent_while_idle(server: FakeServer) -> None:
    server.heartbeat = "0,30"
    async with conn_to(server, heartbeat=(30, 0)):
        await trio.to_thread.run_sync(
            partial(server.wait_until, lambda: server.heartbeats_received >= 3, timeout=2.0)
        )


async def test_silent_server_is_detected(server: FakeServer) -> None:
    server.heartbeat = "30,0"
    async with conn_to(server, heartbeat=(0, 30)) as conn:
        sub = await conn.subscribe("/queue/a")
        with trio.fail_after(1.0):
            assert await sub.get() is None
        with pytest.raises(ConnectionClosed, match="no data from the server"):
            await conn.send("/queue/a")


async def test_server_closing_the_socket(server: FakeServer) -> None:
    async with conn_to(server) as conn:
        sub = await conn.subscribe("/queue/a")
        server.client.close()
        with trio.fail_after(WAIT_S):
            assert await sub.get() is None
        await wait_closed(conn)
        with pytest.raises(ConnectionClosed, match="the server closed the connection"):
            await conn.send("/queue/a")


async def test_explicit_disconnect(server: FakeServer) -> None:
    async with conn_to(server) as conn:
        await conn.disconnect()
        assert conn.closed
        with pytest.raises(ConnectionClosed, match="the client disconnected"):
            await conn.send("/queue/a")
    assert len(server.frames_of("DISCONNECT")) == 1


async def test_cancelled_block_closes_cleanly(server: FakeServer) -> None:
    with trio.move_on_after(0.05) as scope:
        async with conn_to(server) as conn:
            sub = await conn.subscribe("/queue/a")
            await sub.get()  # no message will come: only the cancellation ends this
    assert scope.cancelled_caught
    assert conn.closed
