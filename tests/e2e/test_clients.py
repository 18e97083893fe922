"""The bundled client (sync and trio) and stomp.py against a real broker, side by side."""

from __future__ import annotations

import threading
import time

import pytest
import stomp
import trio

from mpbroker.client import ConnectionClosed, StompError, connect, open_connection
from mpbroker.harness import BrokerProcess


def test_sync_client_round_trip_with_receipts(broker: BrokerProcess) -> None:
    with connect(broker.host, broker.port) as conn:
        assert conn.version == "1.2"
        sub = conn.subscribe("/queue/sync", ack="client-individual", prefetch=10)
        for n in range(20):
            conn.send("/queue/sync", f"m{n}", headers={"n": str(n)}, receipt=n % 5 == 0)
        got = []
        for _ in range(20):
            message = sub.get(timeout=10)
            assert message is not None
            got.append(message.text)
            conn.ack(message)
        assert got == [f"m{n}" for n in range(20)]


def test_sync_client_nack_and_redelivery(broker: BrokerProcess) -> None:
    with connect(broker.host, broker.port) as conn:
        sub = conn.subscribe("/queue/sync-nack", ack="client-individual")
        conn.send("/queue/sync-nack", b"again", receipt=True)
        first = sub.get(timeout=10)
        assert first is not None and not first.redelivered
        conn.nack(first)
        second = sub.get(timeout=10)
        assert second is not None and second.redelivered and second.body == b"again"
        conn.ack(second, receipt=True)


def test_sync_client_sees_broker_error(broker: BrokerProcess) -> None:
    with connect(broker.host, broker.port) as conn:
        with pytest.raises(StompError, match="unknown destination '/bogus/x'"):
            conn.send("/bogus/x", b"x", receipt=True)
        with pytest.raises(ConnectionClosed):
            conn.send("/queue/a", b"x")


def test_stomp_py_producer_mpbroker_consumer_and_back(broker: BrokerProcess) -> None:
    producer = stomp.Connection12([(broker.host, broker.port)])
    producer.connect(wait=True)
    try:
        with connect(broker.host, broker.port) as conn:
            sub = conn.subscribe("/topic/mixed")
            for n in range(10):
                producer.send("/topic/mixed", f"from stomp.py {n}", headers={"origin": "stomp.py"})
            got = [sub.get(timeout=10) for _ in range(10)]
            assert [m.text for m in got if m] == [f"from stomp.py {n}" for n in range(10)]
            assert all(m is not None and m.headers["origin"] == "stomp.py" for m in got)

            received: list[str] = []
            done = threading.Event()

            class Listener(stomp.ConnectionListener):
                def on_message(self, frame: stomp.utils.Frame) -> None:
                    received.append(frame.body)
                    if len(received) == 10:
                        done.set()

            producer.set_listener("l", Listener())
            producer.subscribe("/queue/back", id="b", ack="auto", headers={"receipt": "sub"})
            time.sleep(0.3)
            for n in range(10):
                conn.send("/queue/back", f"from mpbroker {n}")
            assert done.wait(10)
            assert received == [f"from mpbroker {n}" for n in range(10)]
    finally:
        producer.disconnect()


async def test_trio_client_topic_fan_out(broker: BrokerProcess) -> None:
    async with (
        open_connection(broker.host, broker.port) as sub_conn,
        open_connection(broker.host, broker.port) as pub_conn,
    ):
        subs = [await sub_conn.subscribe("/topic/trio", id=f"s{i}") for i in range(3)]
        for n in range(50):
            await pub_conn.send("/topic/trio", f"{n}")
        await pub_conn.send("/topic/trio", "end", receipt=True)
        for sub in subs:
            got = []
            with trio.fail_after(10):
                async for message in sub:
                    if message.text == "end":
                        break
                    got.append(int(message.text))
            assert got == list(range(50))
