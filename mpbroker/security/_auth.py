"""The check a CONNECT's login and passcode go through.

An unknown user and a wrong passcode get the same answer, and (a hash is checked either
way) about the same time, so neither says which names exist. A scrypt check costs tens of
milliseconds: the gateway runs it in a thread, and successful checks are remembered (by a
keyed digest of the passcode, never the passcode) so that reconnecting clients cost nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
from collections import OrderedDict

from ._kdf import hash_password, verify_password
from ._users import ANONYMOUS, User

__all__ = ["ANONYMOUS", "CHECKS_AT_ONCE", "Authenticator"]


CHECKS_AT_ONCE = 1
"""Password checks one process (a gateway, the admin API) runs at once: each holds
`HASH_MEMORY_BYTES` while it runs, which the memory budget counts; more wait their turn.
One: a check is CPU-bound, and there is a gateway per CPU."""

_REMEMBERED = 1024


class Authenticator:
    """Checks logins against `users` (None: no users file, so any login is taken as it is,
    as before there were users). `allow_anonymous`: whether a CONNECT without a login is
    let in (as `ANONYMOUS`)."""

    def __init__(self, users: dict[str, User] | None, allow_anonymous: bool) -> None:
        self.users = users
        self.allow_anonymous = allow_anonymous
        self._key = os.urandom(32)
        self._remembered: OrderedDict[tuple[str, bytes], str] = OrderedDict()
        self._lock = threading.Lock()  # checks run in threads
        # Checked for an unknown user, so that it costs what a known one does; made at the
        # first need (a hash costs tens of ms, and a gateway without users needs none).
        self._decoy = ""

    def costly(self, login: str | None, passcode: str | None) -> bool:
        """Whether checking this login means deriving a hash (tens of ms: a caller with an
        event loop runs `check` in a thread then), or is answered at once (no users, no
        login, or a success remembered: a reconnecting client waits for no hash)."""
        if not login or self.users is None:
            return False
        with self._lock:
            return (login, self._digest(passcode)) not in self._remembered

    def _digest(self, passcode: str | None) -> bytes:
        return hmac.new(self._key, (passcode or "").encode(), hashlib.sha256).digest()

    def check(self, login: str | None, passcode: str | None) -> str | None:
        """The user a CONNECT with this login and passcode is, or None (refused)."""
        if not login:
            return ANONYMOUS if self.allow_anonymous else None
        if self.users is None:
            return login
        digest = self._digest(passcode)
        with self._lock:
            if (login, digest) in self._remembered:
                self._remembered.move_to_end((login, digest))
                return login
        user = self.users.get(login)
        ok = verify_password(passcode or "", user.password_hash if user else self._decoy_hash())
        if user is None or not ok:
            return None
        with self._lock:
            self._remembered[(login, digest)] = login
            while len(self._remembered) > _REMEMBERED:
                self._remembered.popitem(last=False)
        return login

    def _decoy_hash(self) -> str:
        with self._lock:
            if not self._decoy:
                self._decoy = hash_password(os.urandom(8).hex())
            return self._decoy

    def groups(self, user: str) -> tuple[str, ...]:
        """The groups of `user` (none for anonymous or without a users file)."""
        found = self.users.get(user) if self.users is not None else None
        return found.groups if found is not None else ()
