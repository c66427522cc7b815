"""Bearer tokens and roles over a real server: who may call what, what a missing, bad or revoked
token gets, that health and reflection stay open, and that the role table covers every RPC."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from ledger_support import cluster
from sqlalchemy import Engine, text

from gpufair.api.auth import (
    RPC_ROLES,
    AuthInterceptor,
    TokenCache,
    auth_interceptor,
    bearer_token,
)
from gpufair.api.server import build_server
from gpufair.client import GpufairClient, open_channel
from gpufair.store import token_repo
from gpufair.store.database import make_engine
from gpufair.store.deadline import statement_timeout_ms
from gpufair.store.token_repo import TokenRecord
from gpufair.tokens import Role, digest, new_token
from gpufair.v1 import cluster_pb2, cluster_pb2_grpc, ledger_pb2, scheduler_pb2

TTL_S = 5.0
SERVICES: tuple[ServiceDescriptor, ...] = (
    cluster_pb2.DESCRIPTOR.services_by_name["ClusterAdmin"],
    scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"],
    ledger_pb2.DESCRIPTOR.services_by_name["Ledger"],
)
METHODS: list[tuple[str, MethodDescriptor]] = [
    (f"/{service.full_name}/{method.name}", method)
    for service in SERVICES
    for method in service.methods
]


class Ticker:
    """The cache's clock, moved by hand: expiry without sleeping."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture(scope="module")
def ticker() -> Ticker:
    return Ticker()


@pytest.fixture(scope="module")
def address(engine: Engine, ticker: Ticker) -> Iterator[str]:
    auth = auth_interceptor(engine, True, cache_ttl_s=TTL_S, clock=ticker)
    assert auth is not None
    running = build_server(engine, "127.0.0.1:0", max_workers=4, interceptors_extra=[auth])
    yield f"127.0.0.1:{running.port}"
    running.stop(0.5)


@pytest.fixture
def tokens(db: Engine) -> dict[Role, str]:
    return {role: token_repo.create(db, f"test-{role.value}", role).token for role in Role}


@pytest.fixture
def channel(address: str) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(address) as ch:
        yield ch


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def call(
    channel: grpc.Channel, path: str, method: MethodDescriptor, metadata: list[tuple[str, str]]
) -> grpc.StatusCode:
    """Call `path` with an empty request; its status code."""
    request_type = message_factory.GetMessageClass(method.input_type)
    reply_type = message_factory.GetMessageClass(method.output_type)
    kinds: dict[bool, Any] = {False: channel.unary_unary, True: channel.stream_unary}
    stub = kinds[method.client_streaming](
        path,
        request_serializer=request_type.SerializeToString,
        response_deserializer=reply_type.FromString,
    )
    request = iter([request_type()]) if method.client_streaming else request_type()
    try:
        stub(request, metadata=metadata, timeout=20)
    except grpc.RpcError as exc:
        assert isinstance(exc, grpc.Call)
        return exc.code()
    return grpc.StatusCode.OK


def get_config(channel: grpc.Channel, metadata: list[tuple[str, str]]) -> grpc.RpcError | None:
    """None if GetConfig succeeds, else its error."""
    try:
        cluster_pb2_grpc.ClusterAdminStub(channel).GetConfig(
            cluster_pb2.GetConfigRequest(), metadata=metadata, timeout=20
        )
    except grpc.RpcError as exc:
        return exc
    return None


def code_and_details(error: grpc.RpcError | None) -> tuple[grpc.StatusCode, str]:
    assert isinstance(error, grpc.Call), "the call was expected to fail"
    return error.code(), error.details() or ""


# ---- the table -------------------------------------------------------------------------------


def test_role_table_covers_every_rpc_and_nothing_else() -> None:
    assert set(RPC_ROLES) == {path for path, _ in METHODS}


def test_admin_is_allowed_everything_and_reporter_only_reads() -> None:
    assert all(Role.ADMIN in roles for roles in RPC_ROLES.values())
    reporter = {
        path.rsplit("/", 1)[1] for path, roles in RPC_ROLES.items() if Role.REPORTER in roles
    }
    assert reporter == {
        "GetConfig",
        "GetFairShare",
        "GetFairShareHistory",
        "GetUsage",
        "ExplainWorkload",
        "ListWorkloads",
    }
    scheduler = {
        path.rsplit("/", 1)[1] for path, roles in RPC_ROLES.items() if Role.SCHEDULER in roles
    }
    assert scheduler == reporter | {
        "SubmitWorkloads",
        "CancelWorkload",
        "Schedule",
        "ReportEvents",
        "StreamEvents",
        "UpsertNodes",
        "SetNodesReady",
    }


@pytest.mark.parametrize("role", list(Role))
def test_every_rpc_enforces_the_table(
    channel: grpc.Channel, tokens: dict[Role, str], role: Role
) -> None:
    # An empty request may well be refused by the servicer (INVALID_ARGUMENT, NOT_FOUND): what
    # matters is whether the call got past authorisation.
    for path, method in METHODS:
        code = call(channel, path, method, bearer(tokens[role]))
        if role in RPC_ROLES[path]:
            assert code not in (
                grpc.StatusCode.UNAUTHENTICATED,
                grpc.StatusCode.PERMISSION_DENIED,
            ), (path, code)
        else:
            assert code == grpc.StatusCode.PERMISSION_DENIED, (path, code)


# ---- credentials -----------------------------------------------------------------------------


def test_no_token_is_unauthenticated(channel: grpc.Channel, tokens: dict[Role, str]) -> None:
    for path, method in METHODS:
        assert call(channel, path, method, []) == grpc.StatusCode.UNAUTHENTICATED, path
    code, details = code_and_details(get_config(channel, []))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert "missing credentials" in details


@pytest.mark.parametrize(
    "header",
    [
        "Bearer",
        "Basic dXNlcjpwYXNz",
        "Bearer not-a-gpufair-token",
        # Well formed, never issued; a fixed id, so that parallel workers collect the same tests.
        pytest.param(f"Bearer {new_token().token}", id="never-issued"),
    ],
)
def test_bad_credentials_are_unauthenticated(
    channel: grpc.Channel, tokens: dict[Role, str], header: str
) -> None:
    code, _ = code_and_details(get_config(channel, [("authorization", header)]))
    assert code == grpc.StatusCode.UNAUTHENTICATED


def test_the_scheme_is_case_insensitive(channel: grpc.Channel, tokens: dict[Role, str]) -> None:
    assert get_config(channel, [("authorization", f"bearer {tokens[Role.REPORTER]}")]) is None


def test_a_token_revoked_before_use_is_refused_at_once(
    channel: grpc.Channel, db: Engine, tokens: dict[Role, str]
) -> None:
    token_repo.revoke(db, f"test-{Role.ADMIN.value}")
    code, details = code_and_details(get_config(channel, bearer(tokens[Role.ADMIN])))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert tokens[Role.ADMIN] not in details


def test_revoke_takes_effect_once_the_cache_expires(
    channel: grpc.Channel, db: Engine, tokens: dict[Role, str], ticker: Ticker
) -> None:
    token = tokens[Role.SCHEDULER]
    assert get_config(channel, bearer(token)) is None
    token_repo.revoke(db, f"test-{Role.SCHEDULER.value}")
    assert get_config(channel, bearer(token)) is None  # still cached on this replica
    ticker.now_s += TTL_S
    code, _ = code_and_details(get_config(channel, bearer(token)))
    assert code == grpc.StatusCode.UNAUTHENTICATED


def test_permission_denied_names_the_role_and_what_is_needed(
    channel: grpc.Channel, tokens: dict[Role, str]
) -> None:
    request = cluster_pb2.ApplyConfigRequest(config=cluster(), request_id="r-1")
    with pytest.raises(grpc.RpcError) as err:
        cluster_pb2_grpc.ClusterAdminStub(channel).ApplyConfig(
            request, metadata=bearer(tokens[Role.REPORTER]), timeout=20
        )
    code, details = code_and_details(err.value)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert details == "token 'test-reporter' has role reporter; ApplyConfig needs admin"


def test_scheduler_runs_a_cycle_that_admin_configured(
    address: str, tokens: dict[Role, str]
) -> None:
    with GpufairClient(address, token=tokens[Role.ADMIN], attempts=1) as admin:
        assert admin.apply_config(cluster()).config_version == 1
    with GpufairClient(address, token=tokens[Role.SCHEDULER], attempts=1) as scheduler:
        reply = scheduler.schedule("main")
        assert list(reply.binds) == []
        with pytest.raises(grpc.RpcError) as err:
            scheduler.apply_config(cluster())
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]


def test_last_use_is_written_at_most_once_a_minute(
    channel: grpc.Channel, db: Engine, tokens: dict[Role, str], ticker: Ticker
) -> None:
    def last_used() -> Any:
        with db.connect() as conn:
            return conn.execute(
                text("SELECT last_used_at FROM api_tokens WHERE name = 'test-reporter'")
            ).scalar_one()

    assert last_used() is None
    assert get_config(channel, bearer(tokens[Role.REPORTER])) is None
    first = last_used()
    assert first is not None
    ticker.now_s += TTL_S  # the next call looks the token up again, but writes nothing
    assert get_config(channel, bearer(tokens[Role.REPORTER])) is None
    assert last_used() == first
    with db.begin() as conn:
        conn.execute(
            text(
                "UPDATE api_tokens SET last_used_at = now() - interval '2 minutes' "
                "WHERE name = 'test-reporter'"
            )
        )
    ticker.now_s += TTL_S
    assert get_config(channel, bearer(tokens[Role.REPORTER])) is None
    assert last_used() >= first


# ---- open services, the client, outages ------------------------------------------------------


def test_health_and_reflection_need_no_token(channel: grpc.Channel) -> None:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    listed = next(stub.ServerReflectionInfo(iter([request]), timeout=5))
    assert "gpufair.v1.Ledger" in {s.name for s in listed.list_services_response.service}


def test_the_client_sends_its_token_over_loopback(address: str, tokens: dict[Role, str]) -> None:
    with GpufairClient(address, token=tokens[Role.REPORTER], attempts=1) as client:
        assert client.get_config().config_version == 0
    with GpufairClient(address, attempts=1) as client, pytest.raises(grpc.RpcError) as err:
        client.get_config()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]


def test_the_client_never_sends_a_token_in_the_clear_across_a_network() -> None:
    with pytest.raises(ValueError, match="in the clear"):
        open_channel("10.1.2.3:50051", token=new_token().token)
    with pytest.raises(ValueError, match="both tls_cert and tls_key"):
        open_channel("10.1.2.3:50051", tls_cert="client.pem")


def test_a_database_outage_during_the_lookup_is_unavailable() -> None:
    engine = make_engine("postgresql://postgres@127.0.0.1:1/nowhere", pool_size=1)
    auth = auth_interceptor(engine, True)
    assert auth is not None
    running = build_server(engine, "127.0.0.1:0", max_workers=2, interceptors_extra=[auth])
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as ch:
            code, _ = code_and_details(get_config(ch, bearer(new_token().token)))
        assert code == grpc.StatusCode.UNAVAILABLE
    finally:
        running.stop(0.5)
        engine.dispose()


def test_auth_is_off_unless_required(engine: Engine) -> None:
    assert auth_interceptor(engine, False) is None


# ---- the interceptor alone -------------------------------------------------------------------


class Aborted(Exception):
    """What the fake context raises where gRPC would end the call."""


class FakeContext:
    def __init__(self, metadata: list[tuple[str, str]], remaining_s: float | None = None) -> None:
        self.metadata = metadata
        self.remaining_s = remaining_s
        self.code: grpc.StatusCode | None = None

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.metadata

    def time_remaining(self) -> float | None:
        return self.remaining_s

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        raise Aborted(details)


class Details:
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata: list[tuple[str, str]] = []


def test_unmapped_and_reply_streaming_rpcs_are_closed_even_to_admin() -> None:
    # Should an RPC with streamed replies ever be added without a row in the table, it must be
    # refused, not slip past the check.
    token = new_token()
    admin = TokenRecord(1, "root", Role.ADMIN, token.prefix, datetime.now(UTC), None, None)
    interceptor = AuthInterceptor(
        TokenCache(lambda t: admin if digest(t) == token.digest else None)
    )

    def replies(request: Any, context: Any) -> Iterator[str]:
        yield "secret"

    handler = grpc.unary_stream_rpc_method_handler(replies)

    def intercept(method: str) -> Any:
        return interceptor.intercept_service(lambda d: handler, Details(method))  # type: ignore[arg-type]

    guarded = intercept("/gpufair.v1.Ledger/Watch")
    context = FakeContext(bearer(token.token))
    with pytest.raises(Aborted, match="Watch is open to no role"):
        guarded.unary_stream(None, context)
    assert context.code == grpc.StatusCode.PERMISSION_DENIED

    mapped = intercept("/gpufair.v1.Ledger/GetUsage")
    assert list(mapped.unary_stream(None, FakeContext(bearer(token.token)))) == ["secret"]
    context = FakeContext([])
    with pytest.raises(Aborted):
        mapped.unary_stream(None, context)
    assert context.code == grpc.StatusCode.UNAUTHENTICATED


def test_bearer_token_parsing() -> None:
    assert bearer_token([("authorization", "Bearer abc")]) == "abc"
    assert bearer_token([("authorization", "  BEARER   abc ")]) == "abc"
    assert bearer_token([("authorization", "Bearer a"), ("authorization", "Bearer b")]) is None
    assert bearer_token([("authorization-bin", b"x")]) is None
    assert bearer_token(None) is None


def test_a_token_lookup_runs_under_the_callers_deadline() -> None:
    """GetFairShare and GetConfig set no deadline for a reply from memory: the token lookup a
    cache miss makes takes the call's own, and a cached token looks nothing up."""
    token = new_token()
    admin = TokenRecord(1, "root", Role.ADMIN, token.prefix, datetime.now(UTC), None, None)
    timeouts: list[int | None] = []

    def lookup(t: str) -> TokenRecord | None:
        timeouts.append(statement_timeout_ms(30_000))
        return admin if digest(t) == token.digest else None

    interceptor = AuthInterceptor(TokenCache(lookup))
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: "shares")
    guarded = interceptor.intercept_service(
        lambda d: handler,
        Details("/gpufair.v1.Ledger/GetFairShare"),  # type: ignore[arg-type]
    )
    assert guarded.unary_unary(None, FakeContext(bearer(token.token), remaining_s=2.0)) == "shares"
    assert guarded.unary_unary(None, FakeContext(bearer(token.token), remaining_s=2.0)) == "shares"
    assert len(timeouts) == 1  # the second call's token was cached
    assert timeouts[0] is not None and 1_700 <= timeouts[0] <= 1_800  # 2 s less the 10 % margin
