"""Transaction memory end to end (issue 14, section 5): a real broker with one gateway, so
every connection shares its `transactions.max_uncommitted_bytes` (2 MiB by default)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from mpbroker.harness import BrokerProcess, RawClient
from tests.e2e._admin import eventually, worker_stats

RawFactory = Callable[[BrokerProcess], RawClient]

QUEUE = "/queue/tx-memory"


def test_a_big_transaction_is_discarded_for_another_connections_small_one(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1")
    consumer = raw(broker)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": QUEUE, "id": "s", "receipt": "sub"})
    consumer.expect("RECEIPT", "sub")

    # A holds 1.8 MB in its transaction (two frames: a frame is at most 1 MiB).
    a = raw(broker)
    a.connect()
    a.send("BEGIN", {"transaction": "big"})
    for part in (b"a", b"A"):
        a.send("SEND", {"destination": QUEUE, "transaction": "big", "receipt": "a"}, part * 900_000)
        a.expect("RECEIPT", "a")

    # B's 400 KB takes the gateway past 2 MiB: with the default strategy (max_bytes) A's
    # transaction is discarded and B's SEND goes in, where it used to be refused.
    b = raw(broker)
    b.connect()
    b.send("BEGIN", {"transaction": "small"})
    b.send("SEND", {"destination": QUEUE, "transaction": "small", "receipt": "b"}, b"b" * 400_000)
    b.expect("RECEIPT", "b")

    # A commits, not having read anything yet: too late, its connection is closing.
    with contextlib.suppress(OSError):
        a.send("COMMIT", {"transaction": "big", "receipt": "c"})
    [error] = a.recv_until_closed()
    assert error.command == "ERROR"
    assert error.headers["message"] == (
        "ResourceAllocation: transactions max_uncommitted_bytes 2097152 reached: "
        "transaction 'big' discarded by reduce_strategy max_bytes"
    )

    b.send("COMMIT", {"transaction": "small", "receipt": "commit"})
    b.expect("RECEIPT", "commit")
    message = consumer.expect("MESSAGE")
    assert message.body == b"b" * 400_000
    # Nothing of A's transaction is ever delivered.
    consumer.assert_no_frame(1.0)
    # The admin API counts it.
    stats = eventually(
        lambda: (s := worker_stats(broker, "gateway 0")).get("transactions_discarded") and s
    )
    # (Figures that are 0 are left out of the JSON, as every unset figure.)
    assert (stats["transactions_discarded"], stats.get("transactions_timed_out", 0)) == (1, 0)


def test_an_idle_connections_transaction_is_rolled_back_after_the_timeout(
    start_broker: type[BrokerProcess], raw: RawFactory
) -> None:
    broker = start_broker("--gateways", "1", config="[transactions]\ntimeout_ms = 300\n")
    consumer = raw(broker)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": QUEUE, "id": "s", "receipt": "sub"})
    consumer.expect("RECEIPT", "sub")
    client = raw(broker)
    client.connect()  # no heart-beats: nothing else would ever close it
    client.send("BEGIN", {"transaction": "slow"})
    client.send("SEND", {"destination": QUEUE, "transaction": "slow", "receipt": "s"}, b"x")
    client.expect("RECEIPT", "s")

    # The client says nothing more: the gateway's loop rolls the transaction back.
    [error] = client.recv_until_closed(timeout=5)
    message = error.headers["message"]
    assert message.startswith(
        "ResourceAllocation: transactions timeout_ms 300 reached: transaction 'slow' rolled "
        "back after "
    ), message
    consumer.assert_no_frame(0.5)
    stats = eventually(
        lambda: (s := worker_stats(broker, "gateway 0")).get("transactions_timed_out") and s
    )
    assert "transactions_open" not in stats and "transactions_bytes" not in stats  # (0)
