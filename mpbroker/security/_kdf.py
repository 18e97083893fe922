"""Password hashes with scrypt (memory-hard; in the standard library through OpenSSL).

A hash is one text, `scrypt$N$r$p$SALT$KEY` with SALT and KEY in unpadded base64, so the
cost can be raised later without invalidating the hashes already written: each says how it
was made. N = 2**14, r = 8 (16 MiB, about 50 ms here) is what RFC 7914 and OWASP suggest
for interactive logins.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

__all__ = ["HASH_MEMORY_BYTES", "hash_password", "verify_password"]

_N, _R, _P = 2**14, 8, 1
HASH_MEMORY_BYTES = 128 * _R * (_N + _P)
"""What checking one password holds while it runs (scrypt's 128 x r x (N + p) bytes)."""
_SALT_BYTES = 16
_KEY_BYTES = 32
# Room for N = 2**20 with r = 8 (1 GiB would be refused by OpenSSL's default of 32 MiB).
_MAXMEM = 256 * 2**20


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def hash_password(password: str, *, n: int = _N, r: int = _R, p: int = _P) -> str:
    """A new hash of `password`, with a random salt."""
    salt = os.urandom(_SALT_BYTES)
    key = hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=_KEY_BYTES
    )
    return f"scrypt${n}${r}${p}${_b64(salt)}${_b64(key)}"


def parse_hash(encoded: str) -> tuple[int, int, int, bytes, bytes]:
    """(N, r, p, salt, key) of a hash; ValueError saying what is wrong with it."""
    parts = encoded.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise ValueError("not a scrypt$N$r$p$salt$key hash")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, key = _unb64(parts[4]), _unb64(parts[5])
    except ValueError:
        raise ValueError("a scrypt hash with a bad number or base64 field") from None
    if n < 2 or n & (n - 1) or not 1 <= r <= 64 or not 1 <= p <= 16 or not salt or not key:
        raise ValueError(f"scrypt parameters out of range (N={n}, r={r}, p={p})")
    if 128 * r * n > _MAXMEM:
        raise ValueError(f"scrypt N={n}, r={r} needs more than {_MAXMEM >> 20} MiB")
    return n, r, p, salt, key


def verify_password(password: str, encoded: str) -> bool:
    """Whether `password` is the one `encoded` was made from (in constant time once
    derived). ValueError for a malformed hash."""
    n, r, p, salt, key = parse_hash(encoded)
    derived = hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=len(key)
    )
    return hmac.compare_digest(derived, key)
