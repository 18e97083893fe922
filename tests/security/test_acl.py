"""The access-control matcher: patterns, groups, everyone, joined entries, dead-letter
queues, and the config entries it is built from."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpbroker.config import (
    ACL_PERMISSIONS,
    AclEntry,
    ConfigError,
    config_from_mapping,
    reload_flow_settings,
)
from mpbroker.errors import AccessDenied
from mpbroker.security import AccessControl, User, unknown_names

ORDERS = AclEntry(
    "/queue/orders.*",
    write=("alice", "group:producers"),
    read=("bob", "group:consumers"),
    admin=("group:admin",),
)


def test_no_entries_allow_everything_to_everyone() -> None:
    access = AccessControl()
    assert access.open
    for permission in ACL_PERMISSIONS:
        assert access.allows("anyone", (), permission, "/topic/x")


@pytest.mark.parametrize(
    ("user", "groups", "permission", "destination", "allowed"),
    [
        ("alice", (), "write", "/queue/orders.eu", True),
        ("alice", (), "read", "/queue/orders.eu", False),
        ("carol", ("producers",), "write", "/queue/orders.us", True),
        ("carol", ("producers",), "write", "/queue/orders", False),  # the pattern's dot
        ("bob", (), "read", "/queue/orders.eu", True),
        ("bob", (), "write", "/queue/orders.eu", False),
        ("dave", ("consumers", "other"), "read", "/queue/orders.eu", True),
        ("erin", ("admin",), "admin", "/queue/orders.eu", True),
        ("erin", ("admin",), "read", "/queue/orders.eu", False),  # admin is not read
        ("alice", (), "write", "/queue/payments", False),  # no entry: denied
        ("alice", (), "write", "/topic/orders.eu", False),  # queues and topics differ
        # Not a user name (the users file allows no colon): never taken for the group.
        ("group:producers", (), "write", "/queue/orders.eu", False),
    ],
)
def test_an_entry_grants_its_users_and_groups_on_what_its_pattern_matches(
    user: str, groups: tuple[str, ...], permission: str, destination: str, allowed: bool
) -> None:
    assert AccessControl([ORDERS]).allows(user, groups, permission, destination) is allowed


def test_entries_that_match_are_joined_in_any_order() -> None:
    """ActiveMQ joins the entries that match: a later, narrower entry adds, never takes."""
    wide = AclEntry("/queue/*", read=("bob",))
    narrow = AclEntry("/queue/orders.eu", write=("bob",))
    for entries in ([wide, narrow], [narrow, wide]):
        access = AccessControl(entries)
        assert access.allows("bob", (), "read", "/queue/orders.eu")
        assert access.allows("bob", (), "write", "/queue/orders.eu")
        assert not access.allows("bob", (), "write", "/queue/orders.us")


def test_star_is_everyone_anonymous_included() -> None:
    access = AccessControl([AclEntry("/topic/news.*", read=("*",), write=("group:editors",))])
    assert access.allows("anonymous", (), "read", "/topic/news.sport")
    assert not access.allows("anonymous", (), "write", "/topic/news.sport")
    assert access.allows("ed", ("editors",), "write", "/topic/news.sport")


def test_a_dead_letter_queue_is_read_by_who_administers_its_queue() -> None:
    access = AccessControl([ORDERS, AclEntry("/queue/DLQ.audit", read=("auditor",))])
    assert access.allows("erin", ("admin",), "read", "/queue/DLQ.orders.eu")
    assert not access.allows("erin", ("admin",), "write", "/queue/DLQ.orders.eu")
    assert not access.allows("bob", (), "read", "/queue/DLQ.orders.eu")  # reads the queue only
    assert access.allows("auditor", (), "read", "/queue/DLQ.audit")  # granted by its own entry
    assert not access.allows("erin", ("admin",), "read", "/queue/DLQ.")
    other_prefix = AccessControl([ORDERS], dead_letter_prefix="dead.")
    assert other_prefix.allows("erin", ("admin",), "read", "/queue/dead.orders.eu")
    assert not other_prefix.allows("erin", ("admin",), "read", "/queue/DLQ.orders.eu")


def test_check_raises_access_denied_naming_user_permission_and_destination() -> None:
    with pytest.raises(AccessDenied) as caught:
        AccessControl([ORDERS]).check("alice", (), "write", "/queue/payments")
    assert caught.value.message == "access denied: user alice may not write /queue/payments"
    with pytest.raises(ValueError, match="unknown permission 'configure'"):
        AccessControl([ORDERS]).allows("alice", (), "configure", "/queue/orders.eu")


@given(
    user=st.sampled_from(["alice", "bob", "carol"]),
    groups=st.lists(st.sampled_from(["producers", "consumers", "admin"]), max_size=3),
    permission=st.sampled_from(ACL_PERMISSIONS),
    destination=st.sampled_from(["/queue/orders.eu", "/queue/other", "/topic/orders.eu"]),
    extra=st.lists(
        st.builds(
            AclEntry,
            st.sampled_from(["/queue/*", "/topic/*", "/queue/orders.*", "/queue/none"]),
            st.lists(st.sampled_from(["alice", "group:admin", "*"]), max_size=2).map(tuple),
            st.lists(st.sampled_from(["bob", "group:producers"]), max_size=2).map(tuple),
            st.lists(st.sampled_from(["carol", "group:consumers"]), max_size=2).map(tuple),
        ),
        max_size=4,
    ),
)
def test_adding_entries_never_takes_a_permission_away(
    user: str, groups: list[str], permission: str, destination: str, extra: list[AclEntry]
) -> None:
    before = AccessControl([ORDERS]).allows(user, groups, permission, destination)
    after = AccessControl([ORDERS, *extra]).allows(user, groups, permission, destination)
    assert after or not before
    assert after == AccessControl([*reversed(extra), ORDERS]).allows(
        user, groups, permission, destination
    )


USERS = {"users_file": "/etc/mpbroker/users"}


def test_config_entries_become_acl_entries_in_file_order() -> None:
    config = config_from_mapping(
        {
            "security": {
                **USERS,
                "acl": [
                    {"destination": "/queue/orders.*", "write": ["alice", "group:producers"]},
                    {"destination": "/topic/#", "read": ["*"], "admin": ["group:admin"]},
                ],
            }
        }
    )
    assert config.acl == (
        AclEntry("/queue/orders.*", write=("alice", "group:producers")),
        AclEntry("/topic/#", read=("*",), admin=("group:admin",)),
    )


@pytest.mark.parametrize(
    ("acl", "key", "why"),
    [
        ({"acl": {"destination": "/queue/a"}}, "security.acl", "must be entries"),
        ([{"write": ["a"]}], "security.acl[1].destination", "starts with /queue/ or /topic/"),
        ([{"destination": "queue/a"}], "security.acl[1].destination", "starts with"),
        ([{"destination": "/queue/a", "write": "alice"}], "security.acl[1].write", "a list"),
        ([{"destination": "/queue/a", "read": ["a:b"]}], "security.acl[1].read", "group:NAME"),
        ([{"destination": "/queue/a", "read": ["group:"]}], "security.acl[1].read", "group:"),
        ([{"destination": "/queue/a", "configure": []}], "security.acl[1].configure", "unknown"),
    ],
)
def test_a_bad_entry_is_refused_naming_it(acl: object, key: str, why: str) -> None:
    table = acl if isinstance(acl, dict) else {"acl": acl}
    with pytest.raises(ConfigError, match=why) as caught:
        config_from_mapping({"security": {**USERS, **table}})
    assert caught.value.key == key


def test_entries_without_a_users_file_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"needs security\.users_file") as caught:
        config_from_mapping({"security": {"acl": [{"destination": "/queue/a", "read": ["*"]}]}})
    assert caught.value.key == "security.acl"


def test_a_reload_cannot_bring_entries_to_a_broker_without_a_users_file() -> None:
    """The users file setting is not reloaded, the entries are: together they would come
    into force without checked logins."""
    running = config_from_mapping({})
    with_entries = config_from_mapping(
        {"security": {**USERS, "acl": [{"destination": "/queue/a", "read": ["*"]}]}}
    )
    with pytest.raises(ConfigError, match=r"needs security\.users_file"):
        reload_flow_settings(running, with_entries)


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"security": {"allow_anonymous": "false"}}, "security.allow_anonymous"),
        ({"stomp": {"tls_cert_file": "/etc/cert.pem"}}, "stomp.tls_cert_file"),
        ({"stomp": {"tls_require_client_cert": True}}, "stomp.tls_require_client_cert"),
    ],
)
def test_settings_that_would_do_nothing_are_refused(settings: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(settings)
    assert caught.value.key == key


def test_names_no_user_has_are_listed_for_a_warning() -> None:
    users = {
        "alice": User("alice", "scrypt$x", ("producers",)),
        "bob": User("bob", "scrypt$x", ()),
    }
    entries = [
        AclEntry("/queue/a", write=("alice", "group:producers", "alcie"), read=("*",)),
        AclEntry("/queue/b", read=("group:consumers", "bob", "anonymous")),
    ]
    assert unknown_names(entries, users) == ["alcie", "group:consumers"]
