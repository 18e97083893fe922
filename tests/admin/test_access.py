"""Who may read the admin API: the Authorization header read and written, and what a
request gets (on, 401 or 403) for each kind of credentials."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpbroker.admin import access as access_module
from mpbroker.admin.access import (
    ADMIN_GROUP,
    AdminGuard,
    BadCredentials,
    authorization,
    parse_basic,
)
from mpbroker.security import User, hash_password

# Cheap hashes: these tests are about the decision, not scrypt's cost.
FAST = {"n": 2**4, "r": 1}


def basic(raw: bytes) -> str:
    return "Basic " + base64.b64encode(raw).decode()


def users(**passwords_and_groups: tuple[str, tuple[str, ...]]) -> dict[str, User]:
    return {
        name: User(name, hash_password(password, **FAST), groups)
        for name, (password, groups) in passwords_and_groups.items()
    }


# -- the header ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "credentials"),
    [
        (basic(b"alice:s3cret"), ("alice", "s3cret")),
        # The scheme's name in any case (RFC 7235), more than one space before the token.
        ("basic  " + base64.b64encode(b"alice:s3cret").decode(), ("alice", "s3cret")),
        ("BASIC " + base64.b64encode(b"alice:s3cret").decode(), ("alice", "s3cret")),
        # Split at the first colon: a password may hold colons, a user name may not.
        (basic(b"alice:a:b:c"), ("alice", "a:b:c")),
        (basic(b"alice:"), ("alice", "")),
        (basic(b":s3cret"), ("", "s3cret")),
        (basic("jos\u00e9:p\u00e4ss\u00f6rd".encode()), ("jos\u00e9", "p\u00e4ss\u00f6rd")),
    ],
)
def test_basic_credentials_are_read(header: str, credentials: tuple[str, str]) -> None:
    assert parse_basic(header) == credentials


@pytest.mark.parametrize(
    ("header", "why"),
    [
        ("Bearer abc.def", "not Basic credentials"),
        ("Digest username=alice", "not Basic credentials"),
        ("", "not Basic credentials"),
        ("Basic", "no credentials after Basic"),
        ("Basic   ", "no credentials after Basic"),
        ("Basic not*base64", "not base64"),
        ("Basic cm9vdDp4eQ", "not base64"),  # "root:xy" without its padding
        ("Basic YWxp Y2U6", "not base64"),
        ("Basic YWxpY2U6czNjcmV0\u00e9=", "not base64"),  # a non-ASCII character
        (basic(b"alice"), "no colon"),
        (basic(b"\xffalice:s3cret"), "not UTF-8"),
        (basic("alice:s3cret".encode("utf-16")), "not UTF-8"),
    ],
)
def test_malformed_credentials_are_refused_naming_why(header: str, why: str) -> None:
    with pytest.raises(BadCredentials, match=why):
        parse_basic(header)


@given(st.text(alphabet=st.characters(exclude_characters=":")), st.text())
def test_the_header_mpbroker_admin_sends_reads_back(user: str, password: str) -> None:
    if any(0xD800 <= ord(c) <= 0xDFFF for c in user + password):
        # A lone surrogate (a command line's bytes that are not UTF-8) cannot be sent.
        with pytest.raises(ValueError, match="not valid UTF-8"):
            authorization(user, password)
        return
    header = authorization(user, password)
    assert header.isascii()  # HTTP headers are bytes: base64 keeps them ASCII
    assert parse_basic(header) == (user, password)


# -- the decision --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def guard() -> AdminGuard:
    return AdminGuard(
        users(root=("r00t", (ADMIN_GROUP,)), alice=("s3cret", ("producers",)), ops=("o", ("x",)))
    )


def test_without_a_users_file_every_request_goes_on() -> None:
    open_door = AdminGuard(None)
    assert not open_door.enabled
    for header in (None, "garbage", authorization("anyone", "anything")):
        access = open_door.admit(header)
        assert (access.status, access.user, access.error) == (200, None, "")


def test_an_admin_with_its_password_goes_on(guard: AdminGuard) -> None:
    access = guard.admit(authorization("root", "r00t"))
    assert (access.status, access.user, access.error) == (200, "root", "")
    # Remembered: the second time is the same answer.
    assert guard.admit(authorization("root", "r00t")).status == 200


def test_no_credentials_get_401_saying_what_is_wanted(guard: AdminGuard) -> None:
    access = guard.admit(None)
    assert (access.status, access.user) == (401, None)
    assert access.error == (
        "authentication required: HTTP Basic credentials of a user in group 'admin'"
    )


def test_malformed_credentials_get_401_saying_why(guard: AdminGuard) -> None:
    access = guard.admit(basic(b"root"))
    assert access.status == 401
    assert access.error == (
        "malformed Authorization header: the credentials have no colon between user and password"
    )
    assert guard.admit("Bearer token").status == 401


def test_an_unknown_user_and_a_wrong_password_get_the_same_401(guard: AdminGuard) -> None:
    wrong = guard.admit(authorization("root", "guess"))
    unknown = guard.admit(authorization("mallory", "r00t"))
    nameless = guard.admit(authorization("", "r00t"))
    assert wrong.status == unknown.status == nameless.status == 401
    assert wrong.error == unknown.error == nameless.error == "authentication failed"
    assert wrong.kind == unknown.kind == nameless.kind
    # The name tried is kept, for the log.
    assert (wrong.user, unknown.user) == ("root", "mallory")


def test_a_user_outside_group_admin_gets_403(guard: AdminGuard) -> None:
    access = guard.admit(authorization("alice", "s3cret"))
    assert (access.status, access.user) == (403, "alice")
    assert access.error == "user 'alice' is not in group 'admin'"
    # Its wrong password is still a 401: a 403 says the password was right.
    assert guard.admit(authorization("alice", "wrong")).status == 401


def test_new_users_replace_the_old_ones_and_what_was_remembered() -> None:
    guard = AdminGuard(users(root=("old", (ADMIN_GROUP,)), alice=("a", ())))
    assert guard.admit(authorization("root", "old")).status == 200  # remembered now
    guard.use(users(root=("new", (ADMIN_GROUP,)), alice=("a", (ADMIN_GROUP,))))
    assert guard.admit(authorization("root", "old")).status == 401
    assert guard.admit(authorization("root", "new")).status == 200
    assert guard.admit(authorization("alice", "a")).status == 200  # in group admin now
    guard.use(None)
    assert guard.admit(None).status == 200


def test_the_refusals_are_logged_under_kinds_of_their_own(guard: AdminGuard) -> None:
    """Each kind is collapsed on its own: a browser's first request, which never has
    credentials, must not hide a wrong password that follows within the window."""
    kinds = [
        guard.admit(header).kind
        for header in (
            None,
            "Bearer x",
            authorization("root", "guess"),
            authorization("alice", "s3cret"),
        )
    ]
    assert len(set(kinds)) == 4 and all(kinds)


def test_a_check_that_waits_too_long_for_its_turn_gets_503(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread per request: past a few seconds' queue, a flood of bad passwords is
    answered at once instead of piling up threads; a remembered login never waits."""
    guard = AdminGuard(users(root=("r00t", (ADMIN_GROUP,))))
    assert guard.admit(authorization("root", "r00t")).status == 200  # remembered now
    monkeypatch.setattr(access_module, "_CHECK_WAIT_S", 0.01)
    assert guard._checks.acquire()  # another request's check is running
    try:
        busy = guard.admit(authorization("root", "guess"))
        assert (busy.status, busy.error) == (503, "too many logins being checked: try again")
        assert guard.admit(authorization("root", "r00t")).status == 200
    finally:
        guard._checks.release()
