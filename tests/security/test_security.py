"""Password hashes, the users file and the authenticator: pure logic, fast."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpbroker.security import (
    ANONYMOUS,
    Authenticator,
    User,
    UsersFileError,
    format_users,
    hash_password,
    is_loopback,
    load_users,
    parse_users,
    save_users,
    verify_password,
)

# Cheap hashes for the tests that need many (the format is the same).
FAST = {"n": 2**4, "r": 1, "p": 1}


def test_a_hash_verifies_its_password_and_no_other() -> None:
    encoded = hash_password("correct horse")
    assert encoded.startswith("scrypt$16384$8$1$")
    assert verify_password("correct horse", encoded)
    assert not verify_password("correct horsf", encoded)
    assert hash_password("correct horse") != encoded  # a new salt every time


@settings(max_examples=25, deadline=None)
@given(st.text(max_size=40))
def test_any_text_is_a_password(password: str) -> None:
    encoded = hash_password(password, **FAST)
    assert verify_password(password, encoded)
    assert not verify_password(password + "x", encoded)


@pytest.mark.parametrize(
    "bad",
    [
        "plain",
        "md5$1$2$3$4$5",
        "scrypt$16384$8$1$salt",
        "scrypt$1000$8$1$c2FsdA$a2V5",  # N not a power of two
        "scrypt$16384$8$1$not base64!$a2V5",
        "scrypt$1048576$64$1$c2FsdA$a2V5",  # 8 GiB of memory
    ],
)
def test_a_malformed_hash_is_refused_naming_why(bad: str) -> None:
    with pytest.raises(ValueError, match="scrypt"):
        verify_password("x", bad)


def test_the_users_file_round_trips_and_ignores_comments() -> None:
    users = {
        "alice": User("alice", hash_password("a", **FAST), ("producers", "admin")),
        "bob": User("bob", hash_password("b", **FAST)),
    }
    text = format_users(users)
    assert text.startswith("# mpbroker users")
    assert parse_users(text + "\n# a comment\n\n") == users


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("alice", "line 2: expected NAME:HASH:GROUPS"),
        ("al ice:{hash}:", "line 2: user name 'al ice'"),
        ("alice:plain:", "line 2: not a scrypt"),
        ("alice:{hash}:pro ducers", "line 2: group 'pro ducers'"),
        ("bob:{hash}:", "line 2: user 'bob' is listed twice"),
        # The user of connections without a login: a real one would share its groups.
        ("anonymous:{hash}:admin", "line 2: user name 'anonymous' is reserved"),
    ],
)
def test_a_bad_line_is_named_with_its_number(line: str, why: str) -> None:
    good = f"bob:{hash_password('b', **FAST)}:"
    text = good + "\n" + line.format(hash=hash_password("a", **FAST)) + "\n"
    with pytest.raises(UsersFileError) as caught:
        parse_users(text, "/etc/mpbroker/users")
    assert str(caught.value).startswith(f"users file /etc/mpbroker/users, {why}")


def test_the_file_is_written_owner_only_and_read_back(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        users = {"alice": User("alice", hash_password("a", **FAST), ("g",))}
        save_users(tmp_path / "users", users)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "users").stat().st_mode) == 0o600
    assert load_users(tmp_path / "users") == users
    assert [p.name for p in tmp_path.iterdir()] == ["users"]  # no temporary file left
    with pytest.raises(UsersFileError, match="cannot be read \\(No such file or directory\\)"):
        load_users(tmp_path / "missing")


def test_an_unknown_user_and_a_wrong_passcode_get_the_same_answer() -> None:
    users = {"alice": User("alice", hash_password("secret", **FAST), ("admin",))}
    auth = Authenticator(users, allow_anonymous=False)
    assert auth.check("alice", "secret") == "alice"
    assert auth.check("alice", "secret") == "alice"  # remembered
    assert auth.check("alice", "wrong") is None
    assert auth.check("mallory", "secret") is None
    assert auth.check("alice", None) is None
    assert auth.check(None, None) is None  # anonymous not allowed
    assert auth.groups("alice") == ("admin",) and auth.groups("mallory") == ()


def test_anonymous_and_no_users_file() -> None:
    assert Authenticator(None, allow_anonymous=True).check(None, None) == ANONYMOUS
    # Without a users file a login is taken as it says (the broker cannot check it).
    assert Authenticator(None, allow_anonymous=True).check("guest", "x") == "guest"
    assert Authenticator({}, allow_anonymous=True).check("guest", "x") is None


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.1.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("broker.example", False),
    ],
)
def test_which_listen_addresses_stay_on_this_machine(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_rewriting_keeps_the_files_group_and_permissions_but_never_for_others(
    tmp_path: Path,
) -> None:
    users = {"alice": User("alice", hash_password("a", **FAST))}
    path = tmp_path / "users"
    save_users(path, users)
    os.chmod(path, 0o644)  # too open: others lose their read
    if os.getuid() == 0:
        os.chown(path, 0, 65534)
    save_users(path, {**users, "bob": User("bob", hash_password("b", **FAST))})
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o640
    if os.getuid() == 0:
        assert st.st_gid == 65534


def test_only_a_login_checked_against_a_users_file_costs_a_hash() -> None:
    users = {"alice": User("alice", hash_password("s3cret", **FAST))}
    with_users = Authenticator(users, allow_anonymous=False)
    assert with_users.costly("alice", "s3cret")
    assert not with_users.costly(None, None) and not with_users.costly("", "x")
    assert not Authenticator(None, allow_anonymous=True).costly("alice", "x")
    # Once checked, a reconnecting client waits for no hash; another passcode still does.
    assert with_users.check("alice", "s3cret") == "alice"
    assert not with_users.costly("alice", "s3cret")
    assert with_users.costly("alice", "guess")
