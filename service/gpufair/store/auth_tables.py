"""The table of API tokens (see gpufair.tokens for their format and why SHA-256 suffices).

A revoked token keeps its row, so `gpufair token list --all` can still say who had access and when
it ended; only one unrevoked token may carry a name, so `gpufair token revoke NAME` is unambiguous
and a name can be reused once its token is revoked.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    LargeBinary,
    Table,
    Text,
    func,
    text,
)

from gpufair.store.tables import metadata

TZ = DateTime(timezone=True)

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("name", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("prefix", Text, nullable=False),  # in clear: tells tokens apart in listings
    Column("token_hash", LargeBinary, nullable=False),  # SHA-256 of the whole token
    Column("created_at", TZ, nullable=False, server_default=func.now()),
    Column("revoked_at", TZ, nullable=True),
    # Written at most once a minute per token (see gpufair.api.auth), not on every call.
    Column("last_used_at", TZ, nullable=True),
    CheckConstraint("role IN ('admin', 'scheduler', 'reporter')", name="role_known"),
    CheckConstraint("octet_length(token_hash) = 32", name="hash_is_sha256"),
    Index("ux_api_tokens_token_hash", "token_hash", unique=True),
    Index(
        "ux_api_tokens_active_name",
        "name",
        unique=True,
        postgresql_where=text("revoked_at IS NULL"),
    ),
)
