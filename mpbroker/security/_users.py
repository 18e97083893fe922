"""The users file: one user a line, `NAME:HASH:GROUP,GROUP` (`#` starts a comment line),
like /etc/passwd. Parsing and writing are pure; `load_users` and `save_users` do the I/O
(the file is written owner-only and atomically: `mpbroker user add` may run while the broker
reads it on SIGHUP)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ._kdf import parse_hash

__all__ = [
    "User",
    "UsersFileError",
    "check_name",
    "format_users",
    "is_loopback",
    "load_users",
    "parse_users",
    "save_users",
]

_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,128}")
ANONYMOUS = "anonymous"
"""The user of a connection that gave no login, where that is allowed (no users file
may name it)."""


@dataclass(frozen=True, slots=True)
class User:
    """A user: name, password hash (`mpbroker.security.hash_password`) and groups."""

    name: str
    password_hash: str
    groups: tuple[str, ...] = ()


class UsersFileError(ValueError):
    """The users file cannot be used; the message names the file, the line and why."""

    def __init__(self, path: str, why: str, line: int = 0) -> None:
        self.path = path
        self.line = line
        where = f"{path}, line {line}" if line else path
        super().__init__(f"users file {where}: {why}")


def check_name(name: str, what: str = "user name") -> str:
    """`name` if it may name a user or group; ValueError otherwise."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"{what} {name!r}: use 1 to 128 letters, digits and . _ @ - (no spaces or colons)"
        )
    if name == ANONYMOUS and what == "user name":
        # The user of a connection without a login: a real one would share its permissions.
        raise ValueError(f"{what} {name!r} is reserved for connections without a login")
    return name


def parse_users(text: str, path: str = "<users file>") -> dict[str, User]:
    """The users of a users file's text, by name; UsersFileError for the first bad line."""
    users: dict[str, User] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(":")
        if len(fields) != 3:
            raise UsersFileError(path, "expected NAME:HASH:GROUPS", number)
        name, password_hash, groups = fields
        try:
            check_name(name)
            parse_hash(password_hash)
            group_names = tuple(check_name(g, "group") for g in groups.split(",") if g)
        except ValueError as exc:
            raise UsersFileError(path, str(exc), number) from None
        if name in users:
            raise UsersFileError(path, f"user {name!r} is listed twice", number)
        users[name] = User(name, password_hash, group_names)
    return users


def format_users(users: dict[str, User]) -> str:
    """The text of a users file holding `users` (in name order)."""
    lines = ["# mpbroker users: NAME:HASH:GROUPS (mpbroker user add/remove/list)"]
    for name in sorted(users):
        user = users[name]
        lines.append(f"{user.name}:{user.password_hash}:{','.join(user.groups)}")
    return "\n".join(lines) + "\n"


def load_users(path: Path) -> dict[str, User]:
    """The users in the file at `path`; UsersFileError when it cannot be read or parsed."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsersFileError(str(path), f"cannot be read ({why})") from None
    return parse_users(text, str(path))


def save_users(path: Path, users: dict[str, User]) -> None:
    """Write `users` to `path`, atomically: a new file owner-only (it holds password
    hashes); an existing one keeps its owner, group and owner/group permissions (so that
    `sudo mpbroker user add` leaves a root:mpbroker 0640 file readable by the broker), never
    with permissions for others."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        before: os.stat_result | None = path.stat()
    except FileNotFoundError:
        before = None
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(format_users(users))
            out.flush()
            if before is not None:
                os.fchmod(out.fileno(), before.st_mode & 0o660)
                with contextlib.suppress(PermissionError):  # not ours to give away
                    os.fchown(out.fileno(), before.st_uid, before.st_gid)
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def is_loopback(host: str) -> bool:
    """Whether a listen address reaches only this machine (`localhost`, 127.0.0.0/8,
    ::1). A wildcard (0.0.0.0, ::) or any other address or name does not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
