"""Password hashes for the standalone dashboard's ``--auth-file``: one ``user:hash`` line per
user, the hash stdlib scrypt's (``scrypt$N$r$p$salt$key``, salt and key in hex), made by
``pgqueue dashboard --hash-password USER``."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path
from typing import Final

from pgqueue.errors import ConfigurationError

# scrypt's cost: 16 MiB of memory and some 50 ms per check, so a stolen file is slow to guess.
N: Final = 2**14
R: Final = 8
P: Final = 1
MAX_MEMORY: Final = 64 * 1024 * 1024
# Checked when the user is unknown, so that the answer takes as long as for a known one.
_DECOY: Final = "scrypt$16384$8$1$" + "00" * 16 + "$" + "00" * 32


def hash_password(password: str) -> str:
    """A new hash of ``password`` (random salt)."""
    salt = secrets.token_bytes(16)
    key = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=N, r=R, p=P, maxmem=MAX_MEMORY)
    return f"scrypt${N}${R}${P}${salt.hex()}${key.hex()}"


def matches(password: str, encoded: str) -> bool:
    """Whether ``password`` is the one ``encoded`` (a ``hash_password`` value) was made from;
    False for a malformed hash."""
    try:
        scheme, n, r, p, salt, key = encoded.split("$")
        if scheme != "scrypt":
            return False
        expected = bytes.fromhex(key)
        got = hashlib.scrypt(
            password.encode("utf-8", "surrogatepass"),
            salt=bytes.fromhex(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            maxmem=MAX_MEMORY,
            dklen=len(expected),
        )
    except ValueError:
        return False
    return hmac.compare_digest(got, expected)


class Users:
    """The users of an auth file: ``user:hash`` lines; blank lines and ``#`` comments skipped."""

    def __init__(self, hashes: dict[str, str]) -> None:
        self.hashes = hashes

    @classmethod
    def read(cls, path: str | Path) -> Users:
        hashes: dict[str, str] = {}
        text = Path(path).read_text(encoding="utf-8")
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            user, sep, encoded = line.partition(":")
            if not sep or not user or not encoded.startswith("scrypt$"):
                raise ConfigurationError(
                    f"{path}:{number}: expected user:scrypt$... (make one with "
                    "`pgqueue dashboard --hash-password USER`)"
                )
            hashes[user] = encoded
        if not hashes:
            raise ConfigurationError(f"{path} names no user")
        return cls(hashes)

    def check(self, user: str, password: str) -> bool:
        encoded = self.hashes.get(user)
        ok = matches(password, encoded or _DECOY)
        return ok and encoded is not None
