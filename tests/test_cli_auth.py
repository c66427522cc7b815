"""The listen rule (a pure function, then a real process), and the client's auth options."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from serve_support import free_port
from sqlalchemy import Engine
from tls_support import write_pki

from gpufair.addresses import is_local_address, split_address
from gpufair.cli.auth import (
    AuthSetupError,
    add_auth_client_options,
    check_listen,
    client_auth_kwargs,
    listen_problem,
)
from gpufair.client import GpufairClient

LOCAL = ["127.0.0.1:50051", "127.8.9.10:1", "localhost:50051", "[::1]:50051", "unix:/run/g.sock"]
REACHABLE = ["0.0.0.0:50051", "[::]:50051", ":50051", "10.0.0.5:50051", "gpufair.internal:50051"]


@pytest.mark.parametrize("address", LOCAL)
def test_local_addresses_need_neither_tls_nor_tokens(address: str) -> None:
    assert is_local_address(address)
    assert listen_problem(address, tls=False, tokens=False) is None


@pytest.mark.parametrize("address", REACHABLE)
def test_reachable_addresses_need_tls_and_tokens(address: str) -> None:
    assert not is_local_address(address)
    assert listen_problem(address, tls=True, tokens=True) is None
    no_tls = listen_problem(address, tls=False, tokens=True)
    assert no_tls is not None and "without TLS (--tls-cert, --tls-key)" in no_tls
    no_tokens = listen_problem(address, tls=True, tokens=False)
    assert no_tokens is not None and "without tokens (--require-tokens)" in no_tokens
    neither = listen_problem(address, tls=False, tokens=False)
    assert neither is not None and "TLS (--tls-cert, --tls-key) or tokens" in neither


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`gpufair serve` itself, as an operator would start it."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpufair.cli",
                "serve",
                "--metrics-address",
                "",
                "--no-jobs",
                *args,
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_split_address() -> None:
    assert split_address("[::1]:50051") == ("::1", "50051")
    assert split_address("10.0.0.5:50051") == ("10.0.0.5", "50051")
    assert split_address(":50051") == ("", "50051")
    assert split_address("::1") == ("::1", "")
    assert is_local_address("[::ffff:127.0.0.1]:1")


def serve_args(address: str, *, insecure: bool = False) -> argparse.Namespace:
    return argparse.Namespace(
        address=address, tls_cert=None, require_tokens=False, insecure=insecure
    )


def test_insecure_lets_it_through_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(AuthSetupError, match=r"refusing to serve: 0\.0\.0\.0:1 can be reached"):
        check_listen(serve_args("0.0.0.0:1"))
    with caplog.at_level(logging.WARNING):
        check_listen(serve_args("0.0.0.0:1", insecure=True))
    assert "serving insecurely (--insecure)" in caplog.text
    caplog.clear()
    check_listen(serve_args("127.0.0.1:1"))
    assert caplog.text == ""


# ---- a real process --------------------------------------------------------------------------


def wait_serving(address: str, proc_log: Path, credentials: grpc.ChannelCredentials | None) -> None:
    deadline = time.monotonic() + 60
    channel = (
        grpc.insecure_channel(address)
        if credentials is None
        else grpc.secure_channel(address, credentials)
    )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                return
            except grpc.RpcError:
                time.sleep(0.2)
    raise AssertionError(f"not serving:\n{proc_log.read_text()}")


def test_the_process_refuses_a_reachable_address_without_tls_and_tokens(
    database_url: str, db: Engine, tmp_path: Path
) -> None:
    env = dict(os.environ)
    port = free_port()
    log = tmp_path / "refused.log"
    refused = start(["--address", f"0.0.0.0:{port}", "--database-url", database_url], env, log)
    assert refused.wait(timeout=60) == 2
    assert "error: refusing to serve: 0.0.0.0:" in log.read_text()
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", port))

    log = tmp_path / "insecure.log"
    args = ["--address", f"0.0.0.0:{port}", "--database-url", database_url, "--insecure"]
    insecure = start(args, env, log)
    try:
        wait_serving(f"127.0.0.1:{port}", log, None)
        assert "serving insecurely" in log.read_text()
    finally:
        insecure.terminate()
        assert insecure.wait(timeout=60) == 0

    pki = write_pki(tmp_path)
    port = free_port()
    log = tmp_path / "secure.log"
    secure = start(
        [
            *("--address", f"0.0.0.0:{port}", "--database-url", database_url),
            *("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)),
            "--require-tokens",
        ],
        env,
        log,
    )
    try:
        trusted = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
        wait_serving(f"127.0.0.1:{port}", log, trusted)
        with (
            GpufairClient(f"127.0.0.1:{port}", tls_ca=pki.ca, attempts=1) as client,
            pytest.raises(grpc.RpcError) as err,
        ):
            client.get_config()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    finally:
        secure.terminate()
        assert secure.wait(timeout=60) == 0


# ---- client options --------------------------------------------------------------------------


def client_args(monkeypatch: pytest.MonkeyPatch, *argv: str, **env: str) -> argparse.Namespace:
    for name in ("GPUFAIR_TOKEN", "GPUFAIR_TLS_CA", "GPUFAIR_TLS_CERT", "GPUFAIR_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default="127.0.0.1:50051")
    add_auth_client_options(parser)
    return parser.parse_args(argv)


def test_client_options_default_to_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    args = client_args(monkeypatch, GPUFAIR_TOKEN="gpf_x", GPUFAIR_TLS_CA=str(ca))
    assert client_auth_kwargs(args) == {
        "token": "gpf_x",
        "tls": False,
        "tls_ca": str(ca),
        "tls_cert": None,
        "tls_key": None,
    }
    args = client_args(monkeypatch, "--token", "gpf_y", GPUFAIR_TOKEN="")
    assert client_auth_kwargs(args)["token"] == "gpf_y"
    assert client_auth_kwargs(client_args(monkeypatch, GPUFAIR_TOKEN=""))["token"] is None


def test_client_option_mistakes_are_clear(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    remote = ("--address", "gpufair.internal:50051")
    with pytest.raises(AuthSetupError, match=r"in the clear to gpufair\.internal:50051"):
        client_auth_kwargs(client_args(monkeypatch, *remote, "--token", "gpf_x"))
    assert client_auth_kwargs(client_args(monkeypatch, *remote, "--token", "gpf_x", "--tls"))
    with pytest.raises(AuthSetupError, match="go together"):
        client_auth_kwargs(client_args(monkeypatch, "--tls-cert", "c.pem"))
    with pytest.raises(AuthSetupError, match=r"--tls-ca .*nope\.pem: no such file"):
        client_auth_kwargs(client_args(monkeypatch, "--tls-ca", str(tmp_path / "nope.pem")))


def test_a_parser_without_auth_options_means_no_credentials() -> None:
    assert client_auth_kwargs(argparse.Namespace(address="gpufair.internal:50051")) == {
        "token": None,
        "tls": False,
        "tls_ca": None,
        "tls_cert": None,
        "tls_key": None,
    }
