"""API tokens: their format, their hash and the roles they carry.

A token reads `gpf_<prefix>_<secret>`: `gpf_` says what it is (secret scanners and people can
recognise one in a log or a paste), `<prefix>` is 8 random lowercase letters and digits stored in
clear so that `gpufair token list` can show which token is which, and `<secret>` is 32 random bytes
(`secrets.token_urlsafe`). The whole token is shown once, when it is created; the database keeps
only its SHA-256 digest.

Why a plain SHA-256 and not a slow password hash (bcrypt, scrypt, Argon2): a slow KDF protects
low-entropy secrets that people choose, by making each offline guess expensive. These tokens carry
256 random bits, so a stolen digest cannot be reversed by guessing at any hash speed, while a fast
hash keeps checking a token (done on every cache miss of every replica) cheap. The digest is also
what the token is looked up by, so no plaintext token is ever stored or compared.
"""

from __future__ import annotations

import enum
import hashlib
import re
import secrets
import string
from dataclasses import dataclass

TOKEN_MARK = "gpf_"
PREFIX_LENGTH = 8
SECRET_BYTES = 32
_PREFIX_ALPHABET = string.ascii_lowercase + string.digits
# Names are what operators type (`token revoke NAME`) and read in lists: no spaces or quotes.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


class Role(enum.StrEnum):
    """What a token may do. The per-RPC table is `gpufair.api.auth.RPC_ROLES`."""

    ADMIN = "admin"  # everything, including the cluster config
    SCHEDULER = "scheduler"  # workloads, schedule cycles, ledger events, and the reads
    REPORTER = "reporter"  # read only: config, fair shares, usage, explanations


@dataclass(frozen=True)
class NewToken:
    token: str  # shown to the operator once, never stored
    prefix: str
    digest: bytes


def check_name(name: str) -> str:
    """The name, if usable; else ValueError saying what a name may be."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"bad token name {name!r}: 1 to 63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def parse_role(value: str) -> Role:
    try:
        return Role(value)
    except ValueError:
        raise ValueError(
            f"unknown role {value!r}; choose one of {', '.join(r.value for r in Role)}"
        ) from None


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def new_token() -> NewToken:
    prefix = "".join(secrets.choice(_PREFIX_ALPHABET) for _ in range(PREFIX_LENGTH))
    token = f"{TOKEN_MARK}{prefix}_{secrets.token_urlsafe(SECRET_BYTES)}"
    return NewToken(token=token, prefix=prefix, digest=digest(token))


def looks_like_token(value: str) -> bool:
    """Cheap shape check before any lookup: garbage never reaches the database or the cache."""
    return (
        value.startswith(TOKEN_MARK)
        and len(value) > len(TOKEN_MARK) + PREFIX_LENGTH + 1
        and value[len(TOKEN_MARK) + PREFIX_LENGTH] == "_"
        and len(value) <= 200
    )
