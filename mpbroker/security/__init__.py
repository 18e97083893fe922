"""Who may connect: password hashes (scrypt), the users file, and the check a CONNECT's
login and passcode go through.

* `_kdf`: scrypt hashes in one self-describing text (pure but for the salt).
* `_users`: the users file: parsing and writing it (pure), loading and saving it.
* `_auth`: `Authenticator`, the check itself: the same answer, and about the same time, for
  an unknown user as for a wrong passcode; successful checks remembered.
* `_acl`: `AccessControl`, who may read, write and administer which destinations.
"""

from ._acl import EVERYONE, GROUP_PREFIX, AccessControl
from ._auth import ANONYMOUS, Authenticator
from ._kdf import hash_password, verify_password
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
    "EVERYONE",
    "GROUP_PREFIX",
    "AccessControl",
    "Authenticator",
    "User",
    "UsersFileError",
    "check_name",
    "format_users",
    "hash_password",
    "is_loopback",
    "load_users",
    "parse_users",
    "save_users",
    "verify_password",
]
