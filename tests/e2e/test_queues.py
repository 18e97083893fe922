"""Queues end to end: real broker, stomp.py clients and raw frames."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import stomp

from mpbroker.harness import BrokerProcess, RawClient

RawFactory = Callable[[BrokerProcess], RawClient]


class Collector(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.messages: list[stomp.utils.Frame] = []
        self.errors: list[stomp.utils.Frame] = []
        self.cond = threading.Condition()

    def on_message(self, frame: stomp.utils.Frame) -> None:
        with self.cond:
            self.messages.append(frame)
            self.cond.notify_all()

    def on_error(self, frame: stomp.utils.Frame) -> None:
        with self.cond:
            self.errors.append(frame)
            self.cond.notify_all()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[stomp.utils.Frame]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.messages) < count:
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"got {len(self.messages)} of {count} messages"
                self.cond.wait(remaining)
            return list(self.messages)


def stomp_connect(broker: BrokerProcess) -> tuple[stomp.Connection12, Collector]:
    conn = stomp.Connection12([(broker.host, broker.port)])
    listener = Collector()
    conn.set_listener("collector", listener)
    conn.connect(wait=True)
    return conn, listener


def test_send_and_receive_with_headers(broker: BrokerProcess, raw: RawFactory) -> None:
    conn, listener = stomp_connect(broker)
    try:
        conn.subscribe("/queue/basic", id="s1", ack="auto", headers={"receipt": "sub"})
        conn.send(
            "/queue/basic", "hello", headers={"x-custom": "a:b\nc", "content-type": "text/plain"}
        )
        [msg] = listener.wait_for(1)
        assert msg.body == "hello"
        assert msg.headers["destination"] == "/queue/basic"
        assert msg.headers["subscription"] == "s1"
        assert msg.headers["message-id"]
        assert msg.headers["x-custom"] == "a:b\nc"
        assert msg.headers["content-type"] == "text/plain"
        assert "ack" not in msg.headers  # auto mode needs no ack
    finally:
        conn.disconnect()


def test_competing_consumers_get_each_message_exactly_once(
    broker: BrokerProcess, raw: RawFactory
) -> None:
    consumers = [stomp_connect(broker) for _ in range(3)]
    producer, _ = stomp_connect(broker)
    try:
        for i, (conn, _) in enumerate(consumers):
            conn.subscribe("/queue/compete", id=f"c{i}", ack="client-individual")
        time.sleep(0.3)
        total = 600
        for n in range(total):
            producer.send("/queue/compete", str(n))
        deadline = time.monotonic() + 20
        while sum(len(listener.messages) for _, listener in consumers) < total:
            assert time.monotonic() < deadline, "not every message arrived"
            for conn, listener in consumers:
                with listener.cond:
                    pending = [m for m in listener.messages if not m.headers.get("acked")]
                for m in pending:
                    m.headers["acked"] = "1"
                    conn.ack(m.headers["ack"])
            time.sleep(0.05)
        time.sleep(0.3)  # anything extra would be a duplicate
        bodies = Counter(m.body for _, listener in consumers for m in listener.messages)
        assert sorted(bodies, key=int) == [str(n) for n in range(total)]
        assert set(bodies.values()) == {1}
        # Round robin: with every consumer ready, the load is shared.
        assert all(len(listener.messages) > 0 for _, listener in consumers)
    finally:
        for conn, _ in [*consumers, (producer, None)]:
            conn.disconnect()


def test_messages_wait_for_a_consumer(broker: BrokerProcess, raw: RawFactory) -> None:
    producer, _ = stomp_connect(broker)
    for n in range(50):
        producer.send("/queue/later", str(n))
    producer.disconnect(receipt="bye")
    conn, listener = stomp_connect(broker)
    try:
        conn.subscribe("/queue/later", id="s", ack="auto")
        messages = listener.wait_for(50)
        assert [m.body for m in messages] == [str(n) for n in range(50)]
    finally:
        conn.disconnect()


def test_prefetch_window_stops_delivery_until_ack(broker: BrokerProcess, raw: RawFactory) -> None:
    client = raw(broker)
    client.connect()
    client.send(
        "SUBSCRIBE",
        {
            "destination": "/queue/window",
            "id": "w",
            "ack": "client-individual",
            "activemq.prefetchSize": "2",
            "receipt": "sub",
        },
    )
    assert client.recv().command == "RECEIPT"
    producer = raw(broker)
    producer.connect()
    for n in range(5):
        producer.send("SEND", {"destination": "/queue/window"}, str(n).encode())
    first = [client.recv(), client.recv()]
    assert [f.body for f in first] == [b"0", b"1"]
    client.assert_no_frame(0.5)  # a full window must get nothing more
    client.send("ACK", {"id": first[0].headers["ack"]})
    assert client.recv().body == b"2"
    client.send("ACK", {"id": first[1].headers["ack"]})
    assert client.recv().body == b"3"
    producer.close()


def test_client_ack_is_cumulative(broker: BrokerProcess, raw: RawFactory) -> None:
    client = raw(broker)
    client.connect()
    client.send(
        "SUBSCRIBE",
        {
            "destination": "/queue/cumulative",
            "id": "c",
            "ack": "client",
            "activemq.prefetchSize": "3",
            "receipt": "sub",
        },
    )
    assert client.recv().command == "RECEIPT"
    for n in range(6):
        client.send("SEND", {"destination": "/queue/cumulative"}, str(n).encode())
    got = [client.recv() for _ in range(3)]
    assert [f.body for f in got] == [b"0", b"1", b"2"]
    # Acking the third acks the first two as well: the window opens by three.
    client.send("ACK", {"id": got[2].headers["ack"], "receipt": "acked"})
    frames = [client.recv() for _ in range(4)]
    assert [f.command for f in frames].count("RECEIPT") == 1
    assert sorted(f.body for f in frames if f.command == "MESSAGE") == [b"3", b"4", b"5"]
    client.close()
    # Nothing acked comes back to the next consumer: 3..5 were unacked and return.
    again = raw(broker)
    again.connect()
    again.send("SUBSCRIBE", {"destination": "/queue/cumulative", "id": "c2", "ack": "auto"})
    redelivered = [again.recv() for _ in range(3)]
    assert [f.body for f in redelivered] == [b"3", b"4", b"5"]
    assert all(f.headers.get("redelivered") == "true" for f in redelivered)


def test_nack_redelivers_with_redelivered_header(broker: BrokerProcess, raw: RawFactory) -> None:
    client = raw(broker)
    client.connect()
    client.send("SUBSCRIBE", {"destination": "/queue/nack", "id": "n", "ack": "client-individual"})
    client.send("SEND", {"destination": "/queue/nack"}, b"retry me")
    first = client.recv()
    assert first.body == b"retry me" and "redelivered" not in first.headers
    client.send("NACK", {"id": first.headers["ack"]})
    second = client.recv()
    assert second.body == b"retry me"
    assert second.headers["redelivered"] == "true"
    assert second.headers["JMSXDeliveryCount"] == "2"
    assert second.headers["message-id"] == first.headers["message-id"]
    client.send("ACK", {"id": second.headers["ack"], "receipt": "done"})
    assert client.recv().command == "RECEIPT"


def test_nack_with_requeue_false_dead_letters_at_once(
    broker: BrokerProcess, raw: RawFactory
) -> None:
    client = raw(broker)
    client.connect()
    client.send(
        "SUBSCRIBE", {"destination": "/queue/reject", "id": "n", "ack": "client-individual"}
    )
    client.send("SEND", {"destination": "/queue/reject"}, b"poison")
    first = client.recv()
    client.send("NACK", {"id": first.headers["ack"], "requeue": "false", "receipt": "r"})
    assert client.recv().headers["receipt-id"] == "r"
    client.assert_no_frame(0.3)  # not given again
    client.send("SUBSCRIBE", {"destination": "/queue/DLQ.reject", "id": "d"})
    letter = client.recv()
    assert letter.body == b"poison"
    assert letter.headers["dead-letter-reason"] == "rejected: NACK with requeue:false"
    assert letter.headers["original-destination"] == "/queue/reject"


def test_stomp_py_s_python_booleans_read_as_true_and_false(broker: BrokerProcess) -> None:
    """stomp.py writes the Python booleans a user passes as `True` and `False`: a NACK with
    `requeue=False` dead-letters the message (it used to close the connection with an
    ERROR), and `persistent: True` is taken (docs/headers.md, booleans)."""
    conn, listener = stomp_connect(broker)
    try:
        conn.subscribe("/queue/pybool", id="s", ack="client-individual")
        conn.send("/queue/pybool", "poison", headers={"persistent": True, "receipt": "sent"})
        [message] = listener.wait_for(1)
        conn.nack(message.headers["ack"], requeue=False)
        conn.subscribe("/queue/DLQ.pybool", id="d", ack="auto")
        _, letter = listener.wait_for(2)
        assert letter.body == "poison"
        assert letter.headers["dead-letter-reason"] == "rejected: NACK with requeue:false"
        assert listener.errors == []
        assert conn.is_connected()
    finally:
        conn.disconnect()


def test_unacked_messages_of_a_disconnected_consumer_go_to_another(
    broker: BrokerProcess, raw: RawFactory
) -> None:
    greedy = raw(broker)
    greedy.connect()
    greedy.send(
        "SUBSCRIBE",
        {"destination": "/queue/handover", "id": "g", "ack": "client", "receipt": "sub"},
    )
    assert greedy.recv().command == "RECEIPT"
    for n in range(3):
        greedy.send("SEND", {"destination": "/queue/handover"}, str(n).encode())
    assert [greedy.recv().body for _ in range(3)] == [b"0", b"1", b"2"]
    greedy.close()  # abruptly, nothing acked
    other, listener = stomp_connect(broker)
    try:
        other.subscribe("/queue/handover", id="o", ack="auto")
        messages = listener.wait_for(3)
        assert [m.body for m in messages] == ["0", "1", "2"]
        assert all(m.headers["redelivered"] == "true" for m in messages)
    finally:
        other.disconnect()


def test_unsubscribe_returns_unacked_messages(broker: BrokerProcess, raw: RawFactory) -> None:
    client = raw(broker)
    client.connect()
    client.send("SUBSCRIBE", {"destination": "/queue/unsub", "id": "u", "ack": "client-individual"})
    client.send("SEND", {"destination": "/queue/unsub"}, b"x")
    assert client.recv().body == b"x"
    client.send("UNSUBSCRIBE", {"id": "u", "receipt": "gone"})
    assert client.recv().command == "RECEIPT"
    client.send("SUBSCRIBE", {"destination": "/queue/unsub", "id": "u2", "ack": "auto"})
    again = client.recv()
    assert again.body == b"x" and again.headers["redelivered"] == "true"
    assert again.headers["subscription"] == "u2"


def test_receipts_and_disconnect_receipt(broker: BrokerProcess, raw: RawFactory) -> None:
    client = raw(broker)
    client.connect()
    client.send("SEND", {"destination": "/queue/receipts", "receipt": "r-1"}, b"a")
    assert client.recv().headers == {"receipt-id": "r-1"}
    client.send("DISCONNECT", {"receipt": "bye"})
    frames = client.recv_until_closed()
    assert [f.command for f in frames] == ["RECEIPT"]
    assert frames[0].headers["receipt-id"] == "bye"


# The hard limit alone: flow control (which would stop the producer first) switched off.
HARD_LIMIT_ONLY = (
    "[queues]\nmax_messages = 5\n"
    "[vol_queue_store]\nmsg_high = -1\nmsg_low = -1\n"
    "[pers_queue_store]\nmsg_high = -1\nmsg_low = -1\n"
)


def test_queue_bound_refuses_with_error_naming_the_limit(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1", config=HARD_LIMIT_ONLY)
    producer = raw(broker)
    producer.connect()
    for n in range(5):
        producer.send("SEND", {"destination": "/queue/full", "receipt": f"r{n}"}, b"m")
        assert producer.recv().command == "RECEIPT"
    producer.send("SEND", {"destination": "/queue/full", "receipt": "r5"}, b"too many")
    frames = producer.recv_until_closed()
    assert [f.command for f in frames] == ["ERROR"]
    assert frames[0].headers["message"] == "ResourceAllocation: /queue/full max_messages 5 reached"
    assert frames[0].headers["receipt-id"] == "r5"
    # Nothing was lost: the five accepted messages are all there, the refused one is not.
    consumer = raw(broker)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/full", "id": "s"})
    assert [consumer.recv().body for _ in range(5)] == [b"m"] * 5
    consumer.assert_no_frame(0.5)


def test_transaction_commit_and_abort(broker: BrokerProcess, raw: RawFactory) -> None:
    client = raw(broker)
    client.connect()
    client.send("SUBSCRIBE", {"destination": "/queue/tx", "id": "t", "receipt": "sub"})
    assert client.recv().command == "RECEIPT"
    client.send("BEGIN", {"transaction": "tx1"})
    client.send("SEND", {"destination": "/queue/tx", "transaction": "tx1"}, b"kept")
    client.send("BEGIN", {"transaction": "tx2"})
    client.send("SEND", {"destination": "/queue/tx", "transaction": "tx2"}, b"dropped")
    client.send("ABORT", {"transaction": "tx2"})
    client.assert_no_frame(0.3)  # an uncommitted message must not be delivered
    client.send("COMMIT", {"transaction": "tx1", "receipt": "c"})
    frames = [client.recv(), client.recv()]
    assert sorted(f.command for f in frames) == ["MESSAGE", "RECEIPT"]
    assert [f.body for f in frames if f.command == "MESSAGE"] == [b"kept"]
