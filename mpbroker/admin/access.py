"""Who may read the admin API: HTTP Basic credentials (RFC 7617) of a user in group `admin`,
checked against the users file.

Pure but for the hash a check costs: `parse_basic` reads an Authorization header,
`authorization` writes one (for `mpbroker admin`), and `AdminGuard.admit` decides what a
request gets: on (200), 401 (no credentials, malformed ones, or a wrong user or password:
the same answer for the last two) or 403 (a user outside group `admin`). Without a users
file every request goes on, as before there were users.
"""

from __future__ import annotations

import base64
import binascii
import threading
from dataclasses import dataclass
from typing import Final

from mpbroker.security import CHECKS_AT_ONCE, Authenticator, User

__all__ = [
    "ADMIN_GROUP",
    "CHALLENGE",
    "Access",
    "AdminGuard",
    "BadCredentials",
    "authorization",
    "parse_basic",
]

ADMIN_GROUP: Final = "admin"
"""The group whose users may read the admin API."""

CHALLENGE: Final = 'Basic realm="mpbroker", charset="UTF-8"'
"""The WWW-Authenticate header of a 401 (RFC 7617: the credentials are UTF-8)."""


class BadCredentials(ValueError):
    """An Authorization header that is not Basic credentials; the message says why."""


def parse_basic(header: str) -> tuple[str, str]:
    """The user and password of an `Authorization: Basic ...` header (the scheme's name in
    any case, standard base64 of UTF-8 `user:password`, split at the first colon: a user
    name has none, a password may); BadCredentials otherwise."""
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        raise BadCredentials("not Basic credentials")
    if not token.strip():
        raise BadCredentials("no credentials after Basic")
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):  # ValueError: a non-ASCII character
        raise BadCredentials("the credentials are not base64") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadCredentials("the credentials are not UTF-8") from None
    user, colon, password = text.partition(":")
    if not colon:
        raise BadCredentials("the credentials have no colon between user and password")
    return user, password


def authorization(user: str, password: str) -> str:
    """The Authorization header that gives `user` and `password` (the inverse of
    `parse_basic`). ValueError when they are not text UTF-8 can carry: a lone surrogate,
    which is what bytes of a command line that are not UTF-8 become."""
    try:
        raw = f"{user}:{password}".encode()
    except UnicodeEncodeError:
        raise ValueError("the user name or the password is not valid UTF-8") from None
    return "Basic " + base64.b64encode(raw).decode("ascii")


@dataclass(frozen=True, slots=True)
class Access:
    """What a request gets: `status` 200 (it goes on), 401, 403 or 503 (too many checks
    waiting); `user` the user name
    its credentials gave (None without any; proved only with status 200 or 403); `error`
    the refusal, for the reply ("" when it goes on); `kind` the refusal's constant name,
    for the log (`log_collapsed`)."""

    status: int
    user: str | None = None
    error: str = ""
    kind: str = ""


# How long a request waits for its turn to have its password checked.
_CHECK_WAIT_S = 5.0

_GRANTED = Access(200)
_NO_CREDENTIALS = Access(
    401,
    error=f"authentication required: HTTP Basic credentials of a user in group {ADMIN_GROUP!r}",
    kind="admin request without credentials",
)


class AdminGuard:
    """Decides who may read the admin API, against the users of the users file (None:
    there is none, and every request goes on). `use` swaps in the users read again on
    SIGHUP; `admit` runs in the request's own thread (a check costs a scrypt hash, tens
    of ms, and a successful one is remembered, so a dashboard polling every second pays it
    once)."""

    def __init__(self, users: dict[str, User] | None = None) -> None:
        self._authenticator: Authenticator | None = None
        # A check holds 16 MiB while scrypt runs, and the admin server has a thread per
        # request: as in a gateway, CHECKS_AT_ONCE at most, so that a flood of bad passwords
        # cannot balloon the supervisor (the memory budget counts them). A remembered
        # success is cheap, but waits its turn too (a few ms at most).
        self._checks = threading.BoundedSemaphore(CHECKS_AT_ONCE)
        self.use(users)

    @property
    def enabled(self) -> bool:
        """Whether requests need credentials (there is a users file)."""
        return self._authenticator is not None

    def use(self, users: dict[str, User] | None) -> None:
        """Check against `users` from now on (None: no users file). A new Authenticator,
        so the successes remembered go: a password changed or a user removed no longer
        gets in. One assignment: a request being checked ends with the users it began
        with."""
        # allow_anonymous is the STOMP door's: the admin API never lets in no one.
        self._authenticator = Authenticator(users, False) if users is not None else None

    def admit(self, header: str | None) -> Access:
        """What a request with this Authorization header (None: none) gets."""
        authenticator = self._authenticator
        if authenticator is None:
            return _GRANTED
        if header is None:
            return _NO_CREDENTIALS
        try:
            user, password = parse_basic(header)
        except BadCredentials as exc:
            return Access(
                401,
                error=f"malformed Authorization header: {exc}",
                kind="admin request with malformed credentials",
            )
        checked = None
        if user and not authenticator.costly(user, password):  # remembered: no hash to wait for
            checked = authenticator.check(user, password)
        elif user:  # no name: never the anonymous user of the STOMP door
            # A thread per request: past a few seconds' queue of checks, a flood of bad
            # passwords is answered at once instead of piling up threads.
            if not self._checks.acquire(timeout=_CHECK_WAIT_S):
                return Access(
                    503,
                    user=user,
                    error="too many logins being checked: try again",
                    kind="admin busy checking logins",
                )
            try:
                checked = authenticator.check(user, password)
            finally:
                self._checks.release()
        if checked is None:
            # An unknown user and a wrong password: one answer, so that it tells neither.
            return Access(
                401, user=user, error="authentication failed", kind="admin authentication failed"
            )
        if ADMIN_GROUP not in authenticator.groups(checked):
            return Access(
                403,
                user=checked,
                error=f"user {checked!r} is not in group {ADMIN_GROUP!r}",
                kind="admin access refused",
            )
        return Access(200, user=checked)
