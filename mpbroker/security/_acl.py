"""Who may read, write and administer which destinations: the [[security.acl]] entries.

In the manner of ActiveMQ's authorization entries (and RabbitMQ's read, write and configure
permissions): each entry names a destination pattern and, per permission, users, groups
(`group:NAME`) and `*` (everyone who got in). Pure.

- No entries: everyone may do everything (ActiveMQ without an authorization plugin).
- Entries: a permission is granted when ANY entry that matches the destination grants it to
  the user, one of its groups or `*`. Entries never take away what another grants (as in
  ActiveMQ, which joins the entries that match), so their order does not matter; what no
  entry grants is denied.
- A queue's dead-letter queue (`/queue/DLQ.<queue>`) may be read by whoever may administer
  the queue, besides those an entry lets read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mpbroker.config import ACL_PERMISSIONS, AclEntry
from mpbroker.errors import AccessDenied

from ._users import ANONYMOUS, User

__all__ = ["EVERYONE", "GROUP_PREFIX", "AccessControl", "unknown_names"]

EVERYONE = "*"
GROUP_PREFIX = "group:"


def unknown_names(entries: Iterable[AclEntry], users: Mapping[str, User]) -> list[str]:
    """The users and `group:NAME`s the entries name that no user of `users` is or is in
    (a typo grants nothing, silently): sorted, for a warning."""
    groups = {g for user in users.values() for g in user.groups}
    named = {name for e in entries for p in ACL_PERMISSIONS for name in getattr(e, p)}
    return sorted(
        name
        for name in named
        if name != EVERYONE
        and name != ANONYMOUS
        and (
            name.removeprefix(GROUP_PREFIX) not in groups
            if name.startswith(GROUP_PREFIX)
            else name not in users
        )
    )


class AccessControl:
    """The [[security.acl]] entries, asked whether a user may `read`, `write` or `admin` a
    destination. `dead_letter_prefix` is the queues' (`queues.dead_letter_prefix`)."""

    def __init__(self, entries: Iterable[AclEntry] = (), dead_letter_prefix: str = "DLQ.") -> None:
        self.entries = tuple(entries)
        self.dead_letter_prefix = dead_letter_prefix
        # True when there are no entries: everything is allowed to everyone. (An attribute,
        # not a property: every SEND asks.)
        self.open: bool = not self.entries

    def allows(self, user: str, groups: Iterable[str], permission: str, destination: str) -> bool:
        """Whether `user` (in `groups`) may `permission` the `destination`."""
        if permission not in ACL_PERMISSIONS:
            raise ValueError(f"unknown permission {permission!r}")
        if not self.entries:
            return True
        principals = {EVERYONE, *(GROUP_PREFIX + g for g in groups)}
        if user != EVERYONE and not user.startswith(GROUP_PREFIX):  # (users file names can't)
            principals.add(user)
        if self._granted(principals, permission, destination):
            return True
        origin = self._dead_letter_origin(destination)
        return (
            permission == "read"
            and origin is not None
            and self._granted(principals, "admin", origin)
        )

    def check(self, user: str, groups: Iterable[str], permission: str, destination: str) -> None:
        """`AccessDenied` unless `allows`."""
        if not self.allows(user, groups, permission, destination):
            raise AccessDenied(user, permission, destination)

    def _granted(self, principals: set[str], permission: str, destination: str) -> bool:
        return any(
            entry.matches(destination) and not principals.isdisjoint(getattr(entry, permission))
            for entry in self.entries
        )

    def _dead_letter_origin(self, destination: str) -> str | None:
        """The queue whose dead-letter queue `destination` is, or None."""
        prefix = "/queue/" + self.dead_letter_prefix
        if not self.dead_letter_prefix or not destination.startswith(prefix):
            return None
        name = destination[len(prefix) :]
        return "/queue/" + name if name else None
