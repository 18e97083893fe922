"""Who may connect: password hashes (scrypt), the users file, and the check a CONNECT's
login and passcode go through.

* `_kdf`: scrypt hashes in one self-describing text (pure but for the salt).
* `_users`: the users file: parsing and writing it (pure), loading and saving it.
* `_auth`: `Authenticator`, the check itself: the same answer, and about the same time, for
  an unknown user as for a wrong passcode; successful checks remembered.
* `_acl`: `AccessControl`, who may read, write and administer which destinations.
* `_tls`: STOMP over TLS: the listener's `ssl.SSLContext` from the stomp.tls_* files, and
  the handshake of each connection.
"""

from ._acl import EVERYONE, GROUP_PREFIX, AccessControl, unknown_names
from ._auth import ANONYMOUS, CHECKS_AT_ONCE, Authenticator
from ._kdf import HASH_MEMORY_BYTES, hash_password, verify_password
from ._tls import TlsHandshakes, server_context, subject_common_name
from ._users import (
    User,
    UsersFileError,
    check_name,
    format_users,
    is_loopback,
    load_users,
    parse_users,
    save_users,
)

__all__ = [
    "ANONYMOUS",
    "CHECKS_AT_ONCE",
    "EVERYONE",
    "GROUP_PREFIX",
    "HASH_MEMORY_BYTES",
    "AccessControl",
    "Authenticator",
    "TlsHandshakes",
    "User",
    "UsersFileError",
    "check_name",
    "format_users",
    "hash_password",
    "is_loopback",
    "load_users",
    "parse_users",
    "save_users",
    "server_context",
    "subject_common_name",
    "unknown_names",
    "verify_password",
]
