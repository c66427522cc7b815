"""Creating, listing, revoking and checking API tokens (table `api_tokens`).

Only digests are stored and looked up (gpufair.tokens says why SHA-256 is enough). `last_used_at`
is a hint for operators ("is this token still used?"), not an audit log: `touch` writes it only
when the stored value is older than a minute, so a busy client costs one small write a minute, not
one per call, and replicas touching the same token at once do not queue on its row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy.exc
from sqlalchemy import Engine, RowMapping, func, insert, select, text, update

from gpufair.domain.errors import Conflict, NotFound
from gpufair.store.auth_tables import api_tokens as tok
from gpufair.tokens import Role, check_name, digest, new_token

TOUCH_EVERY_S = 60


@dataclass(frozen=True)
class TokenRecord:
    id: int
    name: str
    role: Role
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None


@dataclass(frozen=True)
class IssuedToken:
    token: str  # the only time the whole token exists outside its holder
    record: TokenRecord


_COLUMNS = (
    tok.c.id,
    tok.c.name,
    tok.c.role,
    tok.c.prefix,
    tok.c.created_at,
    tok.c.revoked_at,
    tok.c.last_used_at,
)


def _record(m: RowMapping) -> TokenRecord:
    return TokenRecord(
        id=m["id"],
        name=m["name"],
        role=Role(m["role"]),
        prefix=m["prefix"],
        created_at=m["created_at"],
        revoked_at=m["revoked_at"],
        last_used_at=m["last_used_at"],
    )


def create(engine: Engine, name: str, role: Role) -> IssuedToken:
    """A new token named `name`; Conflict if an unrevoked token already has that name."""
    check_name(name)
    new = new_token()
    try:
        with engine.begin() as conn:
            row = conn.execute(
                insert(tok)
                .values(name=name, role=role.value, prefix=new.prefix, token_hash=new.digest)
                .returning(*_COLUMNS)
            ).one()
    except sqlalchemy.exc.IntegrityError as exc:
        if "ux_api_tokens_active_name" in str(exc.orig):
            raise Conflict(
                f"a token named {name!r} exists; revoke it first or choose another name"
            ) from None
        raise
    return IssuedToken(token=new.token, record=_record(row._mapping))


def list_tokens(engine: Engine, *, include_revoked: bool = False) -> list[TokenRecord]:
    query = select(*_COLUMNS).order_by(tok.c.name, tok.c.created_at)
    if not include_revoked:
        query = query.where(tok.c.revoked_at.is_(None))
    with engine.connect() as conn:
        return [_record(r) for r in conn.execute(query).mappings()]


def revoke(engine: Engine, name: str) -> TokenRecord:
    """Revoke the unrevoked token named `name`; NotFound if there is none."""
    with engine.begin() as conn:
        row = conn.execute(
            update(tok)
            .where(tok.c.name == name, tok.c.revoked_at.is_(None))
            .values(revoked_at=func.now())
            .returning(*_COLUMNS)
        ).one_or_none()
    if row is None:
        raise NotFound("token", name)
    return _record(row._mapping)


def find_active(engine: Engine, token: str) -> TokenRecord | None:
    """The unrevoked token whose digest matches `token`, or None."""
    with engine.connect() as conn:
        row = conn.execute(
            select(*_COLUMNS).where(tok.c.token_hash == digest(token), tok.c.revoked_at.is_(None))
        ).one_or_none()
    return None if row is None else _record(row._mapping)


def touch(engine: Engine, token_id: int) -> None:
    """Set last_used_at to now, unless it was set less than a minute ago."""
    with engine.begin() as conn:
        conn.execute(
            update(tok)
            .where(
                tok.c.id == token_id,
                tok.c.last_used_at.is_(None)
                | (tok.c.last_used_at < func.now() - text(f"interval '{TOUCH_EVERY_S} seconds'")),
            )
            .values(last_used_at=func.now())
        )
