"""Command-line pieces of authentication: serve options, client options and `gpufair token`.

    gpufair serve --address 0.0.0.0:50051 --tls-cert server.pem --tls-key server.key \\
        [--tls-client-ca clients-ca.pem] --require-tokens
    gpufair token create ci-runner --role scheduler     # prints the token, once
    gpufair token list [--all]
    gpufair token revoke ci-runner
    GPUFAIR_TOKEN=gpf_... gpufair get config --address gpufair.internal:50051 --tls-ca ca.pem

The listen rule (`check_listen`): an address other machines can reach is served only with TLS and
tokens both on, unless `--insecure` says the risk is accepted (say, a private network with TLS
ending at a proxy). Loopback addresses and Unix sockets need neither, so the quick start stays one
command. Certificates and keys are read once at start: rotating them means restarting (replicas one
at a time).

Token commands act on the database directly, like `gpufair migrate` (same --database-url and
--data-dir options): whoever may run them can already read and write gpufair's tables.

Registered by cli/serve.py (`add_serve_auth_options`), cli/client_options.py
(`add_auth_client_options`) and cli/main.py (`add_token_commands`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import grpc

from gpufair.addresses import is_local_address
from gpufair.cli.options import SubCommands, add_output_option, emit_rows
from gpufair.domain.errors import Conflict, NotFound
from gpufair.render import table
from gpufair.tokens import Role, check_name, parse_role

if TYPE_CHECKING:
    from sqlalchemy import Engine

log = logging.getLogger(__name__)


TOKEN_ENV = "GPUFAIR_TOKEN"
TLS_CA_ENV = "GPUFAIR_TLS_CA"
TLS_CERT_ENV = "GPUFAIR_TLS_CERT"
TLS_KEY_ENV = "GPUFAIR_TLS_KEY"


class AuthSetupError(Exception):
    """A mistake in the auth options or a token command: one message, exit code 2."""


# ---- serve -----------------------------------------------------------------------------------


def add_serve_auth_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls-cert", default=None, help="server certificate chain (PEM): serve TLS")
    p.add_argument("--tls-key", default=None, help="private key of --tls-cert (PEM)")
    p.add_argument(
        "--tls-client-ca",
        default=None,
        help="CA bundle (PEM) for mutual TLS: clients must present a certificate it signed",
    )
    p.add_argument(
        "--require-tokens",
        action="store_true",
        help="every RPC but health and reflection needs a bearer token with a fitting role",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback address without TLS and tokens (you accept the risk)",
    )


def listen_problem(address: str, *, tls: bool, tokens: bool) -> str | None:
    """Why serving `address` this way is unsafe, or None when it is not."""
    if is_local_address(address) or (tls and tokens):
        return None
    missing = [
        what
        for what, on in (
            ("TLS (--tls-cert, --tls-key)", tls),
            ("tokens (--require-tokens)", tokens),
        )
        if not on
    ]
    return (
        f"{address} can be reached from other machines, and serving it without "
        f"{' or '.join(missing)} lets anyone there change the cluster config and the ledger"
    )


def check_listen(args: argparse.Namespace) -> None:
    """Refuse an unsafe listen address unless --insecure; with it, warn."""
    problem = listen_problem(
        args.address, tls=args.tls_cert is not None, tokens=args.require_tokens
    )
    if problem is None:
        return
    if not args.insecure:
        raise AuthSetupError(
            f"refusing to serve: {problem}. Turn them on, listen on 127.0.0.1, or pass "
            "--insecure to accept the risk"
        )
    log.warning("serving insecurely (--insecure): %s", problem)


def _read_pem(path: str, option: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise AuthSetupError(f"{option} {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise AuthSetupError(f"{option} {path}: not a PEM file")
    return data


def server_credentials(args: argparse.Namespace) -> grpc.ServerCredentials | None:
    """TLS (mutual with --tls-client-ca) from the serve options; None for plaintext."""
    cert, key, client_ca = args.tls_cert, args.tls_key, args.tls_client_ca
    if cert is None and key is None:
        if client_ca is not None:
            raise AuthSetupError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if cert is None or key is None:
        raise AuthSetupError("--tls-cert and --tls-key go together")
    ca_pem = None if client_ca is None else _read_pem(client_ca, "--tls-client-ca")
    return grpc.ssl_server_credentials(
        [(_read_pem(key, "--tls-key"), _read_pem(cert, "--tls-cert"))],
        root_certificates=ca_pem,
        require_client_auth=ca_pem is not None,
    )


# ---- client commands -------------------------------------------------------------------------


class ClientAuth(TypedDict):
    """GpufairClient's credential arguments."""

    token: str | None
    tls: bool
    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def add_auth_client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--token",
        default=_env(TOKEN_ENV),
        help=f"bearer token (default ${TOKEN_ENV}); prefer the variable: arguments show in ps",
    )
    p.add_argument("--tls", action="store_true", help="use TLS, checked by the system's CAs")
    p.add_argument(
        "--tls-ca", default=_env(TLS_CA_ENV), help=f"CA (PEM) of the server (${TLS_CA_ENV})"
    )
    p.add_argument(
        "--tls-cert",
        default=_env(TLS_CERT_ENV),
        help=f"client certificate (PEM) for mutual TLS (${TLS_CERT_ENV})",
    )
    p.add_argument(
        "--tls-key", default=_env(TLS_KEY_ENV), help=f"key of --tls-cert (${TLS_KEY_ENV})"
    )


def client_auth_kwargs(args: argparse.Namespace) -> ClientAuth:
    """The credentials for GpufairClient, checked so that mistakes are one clear message. A
    parser without these options (a test's, say) means no credentials: the server refuses what
    needs them, so nothing is opened by the omission."""
    auth = ClientAuth(
        token=getattr(args, "token", None) or None,
        tls=bool(getattr(args, "tls", False)),
        tls_ca=getattr(args, "tls_ca", None),
        tls_cert=getattr(args, "tls_cert", None),
        tls_key=getattr(args, "tls_key", None),
    )
    if (auth["tls_cert"] is None) != (auth["tls_key"] is None):
        raise AuthSetupError("--tls-cert and --tls-key go together")
    for option, path in (
        ("--tls-ca", auth["tls_ca"]),
        ("--tls-cert", auth["tls_cert"]),
        ("--tls-key", auth["tls_key"]),
    ):
        if path is not None and not Path(path).is_file():
            raise AuthSetupError(f"{option} {path}: no such file")
    secure = auth["tls"] or any(auth[k] is not None for k in ("tls_ca", "tls_cert", "tls_key"))
    if auth["token"] is not None and not secure and not is_local_address(args.address):
        raise AuthSetupError(
            f"refusing to send the token in the clear to {args.address}: "
            "add --tls-ca (or --tls for a server with a publicly trusted certificate)"
        )
    return auth


# ---- gpufair token ---------------------------------------------------------------------------


def _when(at: datetime | None) -> str:
    return "-" if at is None else at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _with_engine(args: argparse.Namespace, action: Callable[[Engine], int]) -> int:
    """Run `action(engine)` on the database the options name, migrated first like `serve`."""
    from gpufair.cli.database_errors import resolve
    from gpufair.store import database, migrate

    db = resolve(args)
    try:
        migrate.upgrade(db.url)
        engine = database.make_engine(db.url, pool_size=1)
        try:
            return action(engine)
        finally:
            engine.dispose()
    finally:
        db.close()


def cmd_token_create(args: argparse.Namespace) -> int:
    from gpufair.store import token_repo

    try:
        name = check_name(args.name)
        role = parse_role(args.role)
    except ValueError as exc:
        raise AuthSetupError(str(exc)) from None

    def create(engine: Engine) -> int:
        try:
            issued = token_repo.create(engine, name, role)
        except Conflict as exc:
            raise AuthSetupError(str(exc)) from None
        # The token alone on stdout, so `TOKEN=$(gpufair token create ...)` captures it; the
        # rest on stderr.
        print(issued.token)
        print(
            f"created token {name!r} with role {role.value} (prefix "
            f"{issued.record.prefix}). It is shown only now: store it (e.g. as ${TOKEN_ENV}).",
            file=sys.stderr,
        )
        return 0

    return _with_engine(args, create)


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(UTC).isoformat()


def cmd_token_list(args: argparse.Namespace) -> int:
    from gpufair.store import token_repo

    def show(engine: Engine) -> int:
        records = token_repo.list_tokens(engine, include_revoked=args.all)
        if args.output != "table":
            emit_rows(
                args.output,
                [
                    {
                        "name": r.name,
                        "role": r.role.value,
                        "prefix": r.prefix,
                        "created_at": _iso(r.created_at),
                        "last_used_at": _iso(r.last_used_at),
                        "revoked_at": _iso(r.revoked_at),
                    }
                    for r in records
                ],
                lambda: None,
            )
            return 0
        if not records:
            print("no tokens" if args.all else "no active tokens")
            return 0
        headers = ["NAME", "ROLE", "PREFIX", "CREATED", "LAST USED"]
        if args.all:
            headers.append("REVOKED")
        rows = [
            [r.name, r.role.value, f"gpf_{r.prefix}_…", _when(r.created_at), _when(r.last_used_at)]
            + ([_when(r.revoked_at)] if args.all else [])
            for r in records
        ]
        print(table(headers, rows))
        return 0

    return _with_engine(args, show)


def cmd_token_revoke(args: argparse.Namespace) -> int:
    from gpufair.api.auth import DEFAULT_CACHE_TTL_S
    from gpufair.store import token_repo

    def revoke(engine: Engine) -> int:
        try:
            record = token_repo.revoke(engine, args.name)
        except NotFound:
            raise AuthSetupError(f"no active token named {args.name!r}") from None
        print(
            f"revoked token {record.name!r} (prefix {record.prefix}); servers stop accepting it "
            f"within {DEFAULT_CACHE_TTL_S:g} s"
        )
        return 0

    return _with_engine(args, revoke)


def add_token_commands(
    sub: SubCommands, add_database_options: Callable[[argparse.ArgumentParser], None]
) -> None:
    token = sub.add_parser("token", help="create, list and revoke API tokens")
    token_sub = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")

    create = token_sub.add_parser("create", help="create a token and print it (once)")
    create.add_argument("name", help="what the token is for, e.g. ci-runner")
    create.add_argument(
        "--role", required=True, choices=[r.value for r in Role], help="what the token may do"
    )
    add_database_options(create)
    create.set_defaults(func=cmd_token_create)

    listing = token_sub.add_parser("list", help="tokens with role and prefix (never the secret)")
    listing.add_argument("--all", action="store_true", help="include revoked tokens")
    add_output_option(listing)
    add_database_options(listing)
    listing.set_defaults(func=cmd_token_list)

    revoke = token_sub.add_parser("revoke", help="revoke the active token of that name")
    revoke.add_argument("name")
    add_database_options(revoke)
    revoke.set_defaults(func=cmd_token_revoke)
