"""A typed Python client for gpufair, with deadlines and retries of UNAVAILABLE.

    with GpufairClient("127.0.0.1:50051") as client:
        reply = client.apply_config(config, dry_run=True)

    with GpufairClient("gpufair.example.internal:50051", token=token, tls_ca="ca.pem") as client:
        ...

Credentials: `token` is sent as `authorization: Bearer <token>` on every call. It travels only
over TLS (`tls=True`, or any of `tls_ca`, `tls_cert`, `tls_key`; `tls_cert` and `tls_key` are the
client's own certificate for mutual TLS) or over a loopback or Unix-socket connection, which gRPC's
local credentials check: a token is never sent in the clear across a network.

Retries are safe: mutating calls carry a request id, generated once per logical call and reused for
every attempt, so the server applies them at most once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc

from gpufair.addresses import is_local_address, is_unix_socket
from gpufair.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    ledger_pb2,
    ledger_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)

T = TypeVar("T")

DEFAULT_ADDRESS = "127.0.0.1:50051"
RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


def _read(path: str | Path | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


def open_channel(
    address: str,
    *,
    token: str | None = None,
    tls: bool = False,
    tls_ca: str | Path | None = None,
    tls_cert: str | Path | None = None,
    tls_key: str | Path | None = None,
) -> grpc.Channel:
    """A channel to `address` with the given credentials (see the module's docstring)."""
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("a client certificate needs its key: give both tls_cert and tls_key")
    secure = tls or any(p is not None for p in (tls_ca, tls_cert, tls_key))
    if not secure and token is None:
        return grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
    if secure:
        # Without a CA file, the system's trusted roots check the server.
        channel_credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(tls_ca),
            private_key=_read(tls_key),
            certificate_chain=_read(tls_cert),
        )
    elif is_local_address(address):
        # Local credentials let a token ride a plaintext connection, and gRPC checks that the
        # connection really is local.
        channel_credentials = grpc.local_channel_credentials(
            grpc.LocalConnectionType.UDS
            if is_unix_socket(address)
            else grpc.LocalConnectionType.LOCAL_TCP
        )
    else:
        raise ValueError(
            f"refusing to send a token in the clear to {address}: use TLS (tls_ca=... or tls=True)"
        )
    if token is not None:
        channel_credentials = grpc.composite_channel_credentials(
            channel_credentials, grpc.access_token_call_credentials(token)
        )
    return grpc.secure_channel(address, channel_credentials, options=_CHANNEL_OPTIONS)


class GpufairClient:
    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        timeout_s: float = 30.0,
        attempts: int = 4,
        backoff_s: float = 0.2,
        channel: grpc.Channel | None = None,
        token: str | None = None,
        tls: bool = False,
        tls_ca: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self._channel = channel or open_channel(
            address, token=token, tls=tls, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
        )
        self.cluster = cluster_pb2_grpc.ClusterAdminStub(self._channel)
        self.scheduler = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self.ledger = ledger_pb2_grpc.LedgerStub(self._channel)

    def __enter__(self) -> GpufairClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def call(self, method: Callable[..., T], request: Any, *, timeout_s: float | None = None) -> T:
        """Call `method` with a deadline, retrying UNAVAILABLE with exponential backoff."""
        delay = self.backoff_s
        for attempt in range(self.attempts):
            try:
                return method(request, timeout=timeout_s or self.timeout_s)
            except grpc.RpcError as exc:
                code = exc.code() if isinstance(exc, grpc.Call) else None
                if code not in RETRYABLE or attempt == self.attempts - 1:
                    raise
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    @staticmethod
    def new_request_id() -> str:
        return str(uuid.uuid4())

    def apply_config(
        self,
        config: cluster_pb2.ClusterConfig,
        *,
        dry_run: bool = False,
        request_id: str = "",
        kinds: Sequence[str] = (),
        expected_version: int | None = None,
        confirm_delete_all: bool = False,
    ) -> cluster_pb2.ApplyConfigResponse:
        """Make the stored config equal `config` within `kinds` (all kinds when empty); with
        `expected_version`, only if nobody changed the config since that version."""
        request = cluster_pb2.ApplyConfigRequest(
            config=config,
            dry_run=dry_run,
            request_id=request_id or self.new_request_id(),
            kinds=kinds,
            confirm_delete_all=confirm_delete_all,
        )
        if expected_version is not None:
            request.expected_version = expected_version
        return self.call(self.cluster.ApplyConfig, request)

    def get_config(self) -> cluster_pb2.GetConfigResponse:
        return self.call(self.cluster.GetConfig, cluster_pb2.GetConfigRequest())

    def delete_objects(
        self,
        kind: str,
        names: list[str],
        *,
        dry_run: bool = False,
        request_id: str = "",
        expected_version: int | None = None,
    ) -> cluster_pb2.DeleteObjectsResponse:
        request = cluster_pb2.DeleteObjectsRequest(
            kind=kind, names=names, dry_run=dry_run, request_id=request_id or self.new_request_id()
        )
        if expected_version is not None:
            request.expected_version = expected_version
        return self.call(self.cluster.DeleteObjects, request)

    def upsert_nodes(
        self,
        nodes: Sequence[cluster_pb2.Node],
        *,
        prune_pools: Sequence[str] = (),
        dry_run: bool = False,
        expected_version: int | None = None,
        request_id: str = "",
    ) -> cluster_pb2.UpsertNodesResponse:
        """Create or update `nodes` (a node without `ready` keeps its stored flag); the nodes of
        `prune_pools` left out of `nodes` are deleted, unless work uses them."""
        request = cluster_pb2.UpsertNodesRequest(
            nodes=nodes,
            prune_pools=prune_pools,
            dry_run=dry_run,
            request_id=request_id or self.new_request_id(),
        )
        if expected_version is not None:
            request.expected_version = expected_version
        return self.call(self.cluster.UpsertNodes, request)

    def set_nodes_ready(
        self,
        names: Sequence[str],
        ready: bool,
        *,
        dry_run: bool = False,
        expected_version: int | None = None,
        request_id: str = "",
    ) -> cluster_pb2.SetNodesReadyResponse:
        """Drain (`ready=False`) or undrain nodes: a node that is not ready takes no new work."""
        request = cluster_pb2.SetNodesReadyRequest(
            names=names,
            ready=ready,
            dry_run=dry_run,
            request_id=request_id or self.new_request_id(),
        )
        if expected_version is not None:
            request.expected_version = expected_version
        return self.call(self.cluster.SetNodesReady, request)

    def get_fair_share(self, pool: str) -> ledger_pb2.GetFairShareResponse:
        return self.call(self.ledger.GetFairShare, ledger_pb2.GetFairShareRequest(pool=pool))

    def get_usage(
        self,
        *,
        pool: str = "",
        queue: str = "",
        period: ledger_pb2.UsagePeriod.ValueType = ledger_pb2.USAGE_PERIOD_DAY,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> ledger_pb2.GetUsageResponse:
        """Usage per period (whole periods overlapping [since, until)) and budget status; an
        empty pool or queue means all. Timezone-naive datetimes are taken as UTC."""
        request = ledger_pb2.GetUsageRequest(pool=pool, queue=queue, period=period)
        if since is not None:
            request.since.FromDatetime(since)
        if until is not None:
            request.until.FromDatetime(until)
        return self.call(self.ledger.GetUsage, request)

    # ---- Scheduler -------------------------------------------------------------------------

    def submit_workloads(
        self, workloads: Sequence[scheduler_pb2.Workload], *, request_id: str = ""
    ) -> scheduler_pb2.SubmitWorkloadsResponse:
        """Submit a batch; each result says accepted or why not. Resubmitting is harmless."""
        request = scheduler_pb2.SubmitWorkloadsRequest(
            workloads=workloads, request_id=request_id or self.new_request_id()
        )
        return self.call(self.scheduler.SubmitWorkloads, request)

    def cancel_workload(
        self, uid: str, *, request_id: str = ""
    ) -> scheduler_pb2.CancelWorkloadResponse:
        request = scheduler_pb2.CancelWorkloadRequest(
            uid=uid, request_id=request_id or self.new_request_id()
        )
        return self.call(self.scheduler.CancelWorkload, request)

    def schedule(
        self, pool: str, *, dry_run: bool = False, request_id: str = ""
    ) -> scheduler_pb2.ScheduleResponse:
        """One cycle for `pool`. Retried attempts reuse the request id, so a cycle whose reply
        was lost is returned, not decided again."""
        request = scheduler_pb2.ScheduleRequest(
            pool=pool, dry_run=dry_run, request_id=request_id or self.new_request_id()
        )
        return self.call(self.scheduler.Schedule, request)

    def explain(self, uid: str) -> scheduler_pb2.ExplainWorkloadResponse:
        return self.call(
            self.scheduler.ExplainWorkload, scheduler_pb2.ExplainWorkloadRequest(uid=uid)
        )

    def list_workloads(
        self,
        *,
        pool: str = "",
        queue: str = "",
        states: Sequence[str] = (),
        page_size: int = 0,
    ) -> list[scheduler_pb2.WorkloadStatus]:
        """Every workload matching the filters (default states: pending, bound, running), all
        pages followed, in the server's order: pool, queue, place in the queue, uid."""
        found: list[scheduler_pb2.WorkloadStatus] = []
        token = ""
        while True:
            reply = self.call(
                self.scheduler.ListWorkloads,
                scheduler_pb2.ListWorkloadsRequest(
                    pool=pool, queue=queue, states=states, page_size=page_size, page_token=token
                ),
            )
            found += reply.workloads
            token = reply.next_page_token
            if not token:
                return found

    # ---- Ledger ----------------------------------------------------------------------------

    def report_events(
        self, events: Sequence[ledger_pb2.LedgerEvent]
    ) -> ledger_pb2.ReportEventsResponse:
        """Report a batch; safe to retry as is (events are idempotent by event_id)."""
        return self.call(self.ledger.ReportEvents, ledger_pb2.ReportEventsRequest(events=events))

    def stream_events(
        self, batches: Sequence[Sequence[ledger_pb2.LedgerEvent]]
    ) -> ledger_pb2.ReportEventsResponse:
        """Send batches over one StreamEvents call (each committed as it arrives); results in
        the order of all events sent. Safe to retry as is (events are idempotent)."""
        requests = [ledger_pb2.ReportEventsRequest(events=batch) for batch in batches]

        def send(
            messages: list[ledger_pb2.ReportEventsRequest], timeout: float
        ) -> ledger_pb2.ReportEventsResponse:
            return self.ledger.StreamEvents(
                iter(messages), timeout=timeout
            )  # a fresh stream per attempt

        return self.call(send, requests)


def field_violations(error: grpc.RpcError) -> list[tuple[str, str]]:
    """The (field, description) pairs of an INVALID_ARGUMENT error, if it carries any."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    if not isinstance(error, grpc.Call):
        return []
    status = rpc_status.from_call(error)
    if status is None:
        return []
    pairs: list[tuple[str, str]] = []
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            pairs += [(v.field, v.description) for v in bad.field_violations]
    return pairs
