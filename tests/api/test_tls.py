"""TLS and mutual TLS from the serve options, with certificates made for the test: a client that
trusts the CA gets through; a plaintext client, one trusting another CA, and (with mutual TLS) one
without a certificate the server's client CA signed, do not."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from sqlalchemy import Engine
from tls_support import Pki, write_pki

from gpufair.api.auth import auth_interceptor
from gpufair.api.server import build_server
from gpufair.cli.auth import AuthSetupError, server_credentials
from gpufair.client import GpufairClient
from gpufair.store import token_repo
from gpufair.tokens import Role


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return write_pki(tmp_path_factory.mktemp("pki"))


def serve_options(
    cert: Path | None, key: Path | None, client_ca: Path | None = None
) -> argparse.Namespace:
    return argparse.Namespace(
        tls_cert=None if cert is None else str(cert),
        tls_key=None if key is None else str(key),
        tls_client_ca=None if client_ca is None else str(client_ca),
    )


def serve(engine: Engine, options: argparse.Namespace, tokens: bool = False) -> Iterator[str]:
    auth = auth_interceptor(engine, tokens)
    running = build_server(
        engine,
        "127.0.0.1:0",
        max_workers=2,
        credentials=server_credentials(options),
        interceptors_extra=[auth] if auth else [],
    )
    try:
        yield f"127.0.0.1:{running.port}"
    finally:
        running.stop(0.5)


@pytest.fixture(scope="module")
def tls_address(engine: Engine, pki: Pki) -> Iterator[str]:
    yield from serve(engine, serve_options(pki.server_cert, pki.server_key), tokens=True)


@pytest.fixture(scope="module")
def mtls_address(engine: Engine, pki: Pki) -> Iterator[str]:
    yield from serve(engine, serve_options(pki.server_cert, pki.server_key, pki.ca))


def failure(client: GpufairClient) -> grpc.StatusCode:
    with client, pytest.raises(grpc.RpcError) as err:
        client.get_config()
    assert isinstance(err.value, grpc.Call)
    return err.value.code()


def test_tls_with_a_token_works_for_a_client_trusting_the_ca(
    tls_address: str, pki: Pki, db: Engine
) -> None:
    token = token_repo.create(db, "over-tls", Role.REPORTER).token
    with GpufairClient(tls_address, token=token, tls_ca=pki.ca, attempts=1) as client:
        assert client.get_config().config_version == 0
    # The same channel without a token is refused by the token check, not by TLS.
    assert (
        failure(GpufairClient(tls_address, tls_ca=pki.ca, attempts=1))
        == grpc.StatusCode.UNAUTHENTICATED
    )


def test_tls_refuses_plaintext_and_untrusted_servers(tls_address: str, pki: Pki) -> None:
    assert failure(GpufairClient(tls_address, attempts=1, timeout_s=5)) == (
        grpc.StatusCode.UNAVAILABLE
    )
    # The client does not trust the server's CA: the handshake fails, no call is made.
    assert failure(GpufairClient(tls_address, tls_ca=pki.other_ca, attempts=1, timeout_s=5)) == (
        grpc.StatusCode.UNAVAILABLE
    )


def test_mutual_tls_needs_a_client_certificate_from_the_client_ca(
    mtls_address: str, pki: Pki, db: Engine
) -> None:
    with GpufairClient(
        mtls_address,
        tls_ca=pki.ca,
        tls_cert=pki.client_cert,
        tls_key=pki.client_key,
        attempts=1,
    ) as client:
        assert client.get_config().config_version == 0
    no_cert = GpufairClient(mtls_address, tls_ca=pki.ca, attempts=1, timeout_s=5)
    assert failure(no_cert) == grpc.StatusCode.UNAVAILABLE
    stranger = GpufairClient(
        mtls_address,
        tls_ca=pki.ca,
        tls_cert=pki.stranger_cert,
        tls_key=pki.stranger_key,
        attempts=1,
        timeout_s=5,
    )
    assert failure(stranger) == grpc.StatusCode.UNAVAILABLE
    assert failure(GpufairClient(mtls_address, attempts=1, timeout_s=5)) == (
        grpc.StatusCode.UNAVAILABLE
    )


def test_tls_options_are_checked_before_serving(pki: Pki, tmp_path: Path) -> None:
    assert server_credentials(serve_options(None, None)) is None
    with pytest.raises(AuthSetupError, match="go together"):
        server_credentials(serve_options(pki.server_cert, None))
    with pytest.raises(AuthSetupError, match="needs --tls-cert"):
        server_credentials(serve_options(None, None, pki.ca))
    with pytest.raises(AuthSetupError, match=r"--tls-key .*missing\.key"):
        server_credentials(serve_options(pki.server_cert, tmp_path / "missing.key"))
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(AuthSetupError, match="not a PEM file"):
        server_credentials(serve_options(garbage, pki.server_key))
