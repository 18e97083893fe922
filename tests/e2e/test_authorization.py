"""Who may read and write what, end to end: [[security.acl]] entries for users and groups
with stomp.py, our client and raw frames; durable subscriptions owned by their user; a
dead-letter queue read by its queue's administrators; the entries reloaded on SIGHUP."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import stomp

from mpbroker.client import StompError, connect
from mpbroker.harness import BrokerProcess, RawClient
from tests.e2e._admin import user_add

pytestmark = pytest.mark.slow

PASSWORD = "pw-%s"

ACL = """
[[security.acl]]
destination = "/queue/orders.*"
write = ["alice", "group:producers"]
read = ["bob", "group:consumers"]
admin = ["group:admin"]

[[security.acl]]
destination = "/topic/news"
read = ["*"]
write = ["alice"]
admin = ["group:admin"]
"""


def config_text(users: Path, acl: str) -> str:
    return f'[security]\nusers_file = "{users}"\nallow_anonymous = "true"\n{acl}'


@pytest.fixture(scope="module")
def authorized(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("authorized")
    users = root / "users"
    for name, groups in [
        ("alice", ()),
        ("carol", ("producers",)),
        ("bob", ()),
        ("erin", ("admin", "consumers")),
        ("mallory", ("admin",)),
    ]:
        user_add(users, name, PASSWORD % name, *groups)
    with BrokerProcess(config=config_text(users, ACL), data_dir=root / "data") as broker:
        yield broker


def client(broker: BrokerProcess, user: str, **headers: str) -> RawClient:
    raw = RawClient(broker.host, broker.port)
    raw.connect(login=user, passcode=PASSWORD % user, **headers)
    return raw


def refused(raw: RawClient, command: str, headers: dict[str, str]) -> str:
    """The ERROR that answers the frame (the connection is closed after it)."""
    try:
        raw.send(command, {**headers, "receipt": "r"})
        [error] = raw.recv_until_closed()
    finally:
        raw.close()
    assert (error.command, error.headers["receipt-id"]) == ("ERROR", "r")
    return error.headers["message"]


def test_writers_write_and_readers_read_what_their_entries_grant(
    authorized: BrokerProcess,
) -> None:
    bob = client(authorized, "bob")
    bob.send("SUBSCRIBE", {"destination": "/queue/orders.eu", "id": "s", "receipt": "s"})
    assert bob.recv().command == "RECEIPT"
    # alice by name with stomp.py, carol through group:producers with our client.
    conn = stomp.Connection12([(authorized.host, authorized.port)])
    conn.connect("alice", PASSWORD % "alice", wait=True)
    conn.send("/queue/orders.eu", "from alice")
    conn.disconnect()
    with connect(
        authorized.host, authorized.port, login="carol", passcode=PASSWORD % "carol"
    ) as carol:
        carol.send("/queue/orders.eu", "from carol", receipt=True)
    assert sorted(bob.recv().body for _ in range(2)) == [b"from alice", b"from carol"]
    bob.close()


def test_a_refused_send_or_subscribe_gets_access_denied_and_is_logged(
    authorized: BrokerProcess,
) -> None:
    cases = [
        ("alice", "SEND", "/queue/payments", "write"),  # no entry: denied
        ("alice", "SUBSCRIBE", "/queue/orders.eu", "read"),
        ("bob", "SEND", "/queue/orders.eu", "write"),
        ("anonymous", "SEND", "/topic/news", "write"),
    ]
    for user, command, destination, permission in cases:
        raw = RawClient(authorized.host, authorized.port)
        if user == "anonymous":
            raw.connect()
        else:
            raw.connect(login=user, passcode=PASSWORD % user)
        message = refused(raw, command, {"destination": destination, "id": "x"})
        assert message == f"access denied: user {user} may not {permission} {destination}"
    authorized.wait_for_log(
        r"WARNING gateway-\d+\[\d+\] access denied: user alice may not write /queue/payments, "
        r"from 127\.0\.0\.1:\d+"
    )
    # Everyone may read the news, anonymous connections included, with stomp.py too.
    conn = stomp.Connection12([(authorized.host, authorized.port)])
    conn.connect(wait=True)
    conn.subscribe("/topic/news", "n")
    conn.disconnect()
    # Our client reports the refusal as the broker worded it.
    with (
        pytest.raises(StompError, match=r"user bob may not write /queue/orders\.eu"),
        connect(authorized.host, authorized.port, login="bob", passcode=PASSWORD % "bob") as bob,
    ):
        bob.send("/queue/orders.eu", "no", receipt=True)


def test_a_durable_subscription_is_its_users_and_needs_admin(authorized: BrokerProcess) -> None:
    durable = {"destination": "/topic/news", "id": "d", "activemq.subscriptionName": "feed"}
    bob = client(authorized, "bob", **{"client-id": "reader"})
    assert refused(bob, "SUBSCRIBE", durable) == (
        "access denied: user bob may not admin /topic/news"
    )
    erin = client(authorized, "erin", **{"client-id": "reader"})
    erin.send("SUBSCRIBE", {**durable, "receipt": "s"})
    assert erin.recv().command == "RECEIPT"
    erin.close()
    # Another administrator reusing the client-id and the name is refused: it would read
    # (or, on another topic, delete) erin's backlog.
    mallory = client(authorized, "mallory", **{"client-id": "reader"})
    assert refused(mallory, "SUBSCRIBE", durable) == (
        "access denied: user mallory may not use durable subscription 'reader/feed'"
    )
    authorized.wait_for_log(r"durable subscription 'reader/feed' \(it belongs to erin\)")
    alice = client(authorized, "alice")
    alice.send("SEND", {"destination": "/topic/news", "persistent": "true", "receipt": "p"})
    assert alice.recv().command == "RECEIPT"
    alice.close()
    erin = client(authorized, "erin", **{"client-id": "reader"})
    erin.send("SUBSCRIBE", durable)
    assert erin.recv(timeout=10).command == "MESSAGE"
    erin.close()


def test_a_dead_letter_queue_is_read_by_its_queues_administrators(
    authorized: BrokerProcess,
) -> None:
    erin = client(authorized, "erin")
    erin.send("SUBSCRIBE", {"destination": "/queue/DLQ.orders.eu", "id": "d", "receipt": "s"})
    assert erin.recv().command == "RECEIPT"
    erin.close()
    bob = client(authorized, "bob")
    assert refused(bob, "SUBSCRIBE", {"destination": "/queue/DLQ.orders.eu", "id": "d"}) == (
        "access denied: user bob may not read /queue/DLQ.orders.eu"
    )


def test_sighup_reads_the_entries_again(tmp_path: Path) -> None:
    users = tmp_path / "users"
    user_add(users, "alice", PASSWORD % "alice")
    config = tmp_path / "broker.toml"
    config.write_text(config_text(users, ACL))
    broker = BrokerProcess(data_dir=tmp_path / "data")
    broker.command += ["--config", str(config), "--gateways", "1"]
    with broker.start():
        alice = client(broker, "alice")
        assert "may not write /queue/payments" in refused(
            alice, "SEND", {"destination": "/queue/payments"}
        )
        payments = '\n[[security.acl]]\ndestination = "/queue/payments"\nwrite = ["alice"]\n'
        config.write_text(config_text(users, ACL + payments))
        mark = len(broker.lines)
        os.kill(broker.pid, signal.SIGHUP)
        broker.wait_for_log(r"INFO gateway-0\[\d+\] flow settings reloaded", start=mark)
        alice = client(broker, "alice")
        alice.send("SEND", {"destination": "/queue/payments", "receipt": "ok"})
        assert alice.recv().command == "RECEIPT"
        alice.close()


def test_an_owner_stays_subscribed_when_the_pubsub_worker_restarts(
    authorized: BrokerProcess,
) -> None:
    """The gateway registers the subscription again with the restarted worker, which checks
    the owner anew: with the user it is the owner's."""
    durable = {"destination": "/topic/news", "id": "d", "activemq.subscriptionName": "kept"}
    erin = client(authorized, "erin", **{"client-id": "restart"})
    try:
        erin.send("SUBSCRIBE", {**durable, "receipt": "s"})
        assert erin.recv().command == "RECEIPT"
        victim = authorized.workers()["pubsub 0"]
        victim.kill()
        authorized.wait_for_worker("pubsub 0", not_pid=victim.pid)
        alice = client(authorized, "alice")
        alice.send("SEND", {"destination": "/topic/news", "persistent": "true", "receipt": "p"})
        assert alice.recv(timeout=15).command == "RECEIPT"
        alice.close()
        message = erin.recv(timeout=15)
        assert message.command == "MESSAGE", message
    finally:
        erin.close()
