"""A typed Python client for gpufair, with deadlines and retries of UNAVAILABLE: a method per RPC
(streaming included), and event builders (`started`, `stopped`, `heartbeat`, ...).

    with GpufairClient("127.0.0.1:50051") as client:
        reply = client.apply_config(config, dry_run=True)

    with GpufairClient("gpufair.example.internal:50051", token=token, tls_ca="ca.pem") as client:
        ...

Credentials: `token` is sent as `authorization: Bearer <token>` on every call. It travels only
over TLS (`tls=True`, or any of `tls_ca`, `tls_cert`, `tls_key`; `tls_cert` and `tls_key` are the
client's own certificate for mutual TLS) or over a loopback or Unix-socket connection, which gRPC's
local credentials check: a token is never sent in the clear across a network.

Retries are gRPC's own (a retry policy in the channel's service config, `service_config`): a call
that ends UNAVAILABLE is tried again up to `attempts` times in all, after exponential backoff with
full jitter (gRPC waits a random time up to the current backoff), and never past the call's
deadline, which bounds all attempts together. Retries are safe: mutating calls carry a request id,
generated once per logical call and sent unchanged with every attempt, so the server applies them
at most once. A channel passed in (`channel=`) keeps its own settings: build it with
`channel_options(...)` to have the same retries.

`gpufair.client_aio.AsyncGpufairClient` is the same client for asyncio.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, cast

import grpc
from google.protobuf.message import Message

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
SERVICES = ("gpufair.v1.ClusterAdmin", "gpufair.v1.Scheduler", "gpufair.v1.Ledger")
# gRPC accepts at most 5 attempts in a retry policy; longer waits would outlive most deadlines.
MAX_ATTEMPTS = 5
MAX_BACKOFF_S = 5.0


def service_config(attempts: int = 4, backoff_s: float = 0.2) -> str:
    """The channel's service config: retry UNAVAILABLE on every gpufair RPC, `attempts` in all
    (1 = no retries; at most 5), first backoff `backoff_s`, doubling, at most 5 s, jittered."""
    attempts = max(1, min(MAX_ATTEMPTS, attempts))
    method: dict[str, object] = {"name": [{"service": s} for s in SERVICES]}
    if attempts > 1:
        method["retryPolicy"] = {
            "maxAttempts": attempts,
            "initialBackoff": f"{max(backoff_s, 0.001):.3f}s",
            "maxBackoff": f"{max(MAX_BACKOFF_S, backoff_s):.3f}s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": [c.name for c in RETRYABLE],
        }
    return json.dumps({"methodConfig": [method]})


def channel_options(attempts: int = 4, backoff_s: float = 0.2) -> list[tuple[str, object]]:
    """Options for a gpufair channel: 64 MiB messages each way and the retry policy."""
    return [
        ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", service_config(attempts, backoff_s)),
    ]


_CHANNEL_OPTIONS = channel_options()


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
    options: Sequence[tuple[str, object]] = _CHANNEL_OPTIONS,
) -> grpc.Channel:
    """A channel to `address` with the given credentials (see the module's docstring)."""
    credentials = channel_credentials(
        address, token=token, tls=tls, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
    )
    if credentials is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, credentials, options=options)


def channel_credentials(
    address: str,
    *,
    token: str | None = None,
    tls: bool = False,
    tls_ca: str | Path | None = None,
    tls_cert: str | Path | None = None,
    tls_key: str | Path | None = None,
) -> grpc.ChannelCredentials | None:
    """The credentials a channel to `address` needs, or None for a plaintext one."""
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("a client certificate needs its key: give both tls_cert and tls_key")
    secure = tls or any(p is not None for p in (tls_ca, tls_cert, tls_key))
    if not secure and token is None:
        return None
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
    return channel_credentials


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
            address,
            token=token,
            tls=tls,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
            options=channel_options(self.attempts, backoff_s),
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
        """Call `method` with a deadline; the channel's retry policy retries UNAVAILABLE within
        it (see the module's docstring)."""
        return method(request, timeout=timeout_s or self.timeout_s)

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
        request = config_write_request(
            cluster_pb2.ApplyConfigRequest,
            request_id=request_id,
            expected_version=expected_version,
            config=config,
            dry_run=dry_run,
            kinds=kinds,
            confirm_delete_all=confirm_delete_all,
        )
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
        request = config_write_request(
            cluster_pb2.DeleteObjectsRequest,
            request_id=request_id,
            expected_version=expected_version,
            kind=kind,
            names=names,
            dry_run=dry_run,
        )
        return self.call(self.cluster.DeleteObjects, request)

    def upsert_nodes(
        self,
        nodes: Sequence[cluster_pb2.Node],
        *,
        prune_pools: Sequence[str] = (),
        confirm_delete_all: bool = False,
        dry_run: bool = False,
        expected_version: int | None = None,
        request_id: str = "",
    ) -> cluster_pb2.UpsertNodesResponse:
        """Create or update `nodes` (a node without `ready` keeps its stored flag); the nodes of
        `prune_pools` left out of `nodes` are deleted, unless work uses them. A prune that would
        leave a pool with none of its stored nodes is refused unless `confirm_delete_all`."""
        request = config_write_request(
            cluster_pb2.UpsertNodesRequest,
            request_id=request_id,
            expected_version=expected_version,
            nodes=nodes,
            prune_pools=prune_pools,
            confirm_delete_all=confirm_delete_all,
            dry_run=dry_run,
        )
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
        request = config_write_request(
            cluster_pb2.SetNodesReadyRequest,
            request_id=request_id,
            expected_version=expected_version,
            names=names,
            ready=ready,
            dry_run=dry_run,
        )
        return self.call(self.cluster.SetNodesReady, request)

    def get_fair_share(self, pool: str) -> ledger_pb2.GetFairShareResponse:
        return self.call(self.ledger.GetFairShare, ledger_pb2.GetFairShareRequest(pool=pool))

    def get_fair_share_history(
        self,
        pool: str,
        *,
        queue: str = "",
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> ledger_pb2.GetFairShareHistoryResponse:
        """Each recompute's share of `queue` (every queue when empty) in [since, until]: until
        defaults to now, since to a day before until."""
        return self.call(
            self.ledger.GetFairShareHistory, fair_share_history_request(pool, queue, since, until)
        )

    def get_usage(
        self,
        *,
        pool: str = "",
        queue: str = "",
        period: ledger_pb2.UsagePeriod.ValueType = ledger_pb2.USAGE_PERIOD_DAY,
        since: datetime | None = None,
        until: datetime | None = None,
        include_open_hour: bool = False,
    ) -> ledger_pb2.GetUsageResponse:
        """Usage per period (whole periods overlapping [since, until)) and budget status; an
        empty pool or queue means all. Timezone-naive datetimes are taken as UTC. With
        `include_open_hour`, rows of the open UTC hour so far follow, marked `partial`."""
        return self.call(
            self.ledger.GetUsage,
            usage_request(pool, queue, period, since, until, include_open_hour),
        )

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
        self,
        batches: Iterable[Sequence[ledger_pb2.LedgerEvent]],
        *,
        timeout_s: float | None = None,
    ) -> ledger_pb2.ReportEventsResponse:
        """Send `batches` over one `StreamEvents` call; each is committed as it arrives, and the
        one reply, at the end, has a result per event. The deadline covers the whole stream.
        The reply may not pass 64 MiB (about 1.5 million events with UUID ids): a batch that
        could take it past is refused, INVALID_ARGUMENT, with the batches before it stored;
        a longer feed goes as several streams."""
        requests = (ledger_pb2.ReportEventsRequest(events=batch) for batch in batches)
        return self.ledger.StreamEvents(requests, timeout=timeout_s or self.timeout_s)


M = TypeVar("M", bound=Message)


def config_write_request(
    message: type[M], /, *, request_id: str, expected_version: int | None, **fields: Any
) -> M:
    """A config mutation's request (a `message`) with `fields`: a fresh request id unless one is given
    (every retry of the call reuses it), and `expected_version` when given (optimistic
    concurrency: the server refuses the write if the config moved on since)."""
    # A message class takes its own fields as keywords; the stubs' `Message.__init__` knows none.
    make = cast(Callable[..., M], message)
    request = make(request_id=request_id or str(uuid.uuid4()), **fields)
    if expected_version is not None:
        request.expected_version = expected_version  # type: ignore[attr-defined]
    return request


def usage_request(
    pool: str,
    queue: str,
    period: ledger_pb2.UsagePeriod.ValueType,
    since: datetime | None,
    until: datetime | None,
    include_open_hour: bool,
) -> ledger_pb2.GetUsageRequest:
    request = ledger_pb2.GetUsageRequest(
        pool=pool, queue=queue, period=period, include_open_hour=include_open_hour
    )
    if since is not None:
        request.since.FromDatetime(since)
    if until is not None:
        request.until.FromDatetime(until)
    return request


def fair_share_history_request(
    pool: str, queue: str, since: datetime | None, until: datetime | None
) -> ledger_pb2.GetFairShareHistoryRequest:
    request = ledger_pb2.GetFairShareHistoryRequest(pool=pool, queue=queue)
    if since is not None:
        request.since.FromDatetime(since)
    if until is not None:
        request.until.FromDatetime(until)
    return request


# ---- event builders ---------------------------------------------------------------------------


def _event(
    kind: ledger_pb2.EventKind.ValueType,
    uid: str,
    at: datetime | float | None,
    event_id: str | None,
) -> ledger_pb2.LedgerEvent:
    """An event of `kind` for workload `uid` at `at` (a datetime, epoch seconds, or now), with a
    fresh event id unless given: a retry of the same fact must reuse the id it was sent with."""
    msg = ledger_pb2.LedgerEvent(
        event_id=event_id or str(uuid.uuid4()), workload_uid=uid, kind=kind
    )
    if at is None:
        at = time.time()
    if isinstance(at, datetime):
        msg.occurred_at.FromDatetime(at)
    else:
        msg.occurred_at.FromNanoseconds(round(at * 1e9))
    return msg


def started(
    uid: str,
    pods: Iterable[scheduler_pb2.PodBinding | ledger_pb2.EventPod],
    *,
    at: datetime | float | None = None,
    event_id: str | None = None,
) -> ledger_pb2.LedgerEvent:
    """`uid` runs on `pods`: the bind's `PodBinding`s as they are, or `EventPod`s."""
    msg = _event(ledger_pb2.EVENT_KIND_STARTED, uid, at, event_id)
    for pod in pods:
        added = msg.pods.add(
            node=pod.node, gpu_indices=pod.gpu_indices, gpu_fraction=pod.gpu_fraction
        )
        if pod.HasField("partition_start"):
            added.partition_start = pod.partition_start
    return msg


def stopped(
    uid: str, *, at: datetime | float | None = None, event_id: str | None = None
) -> ledger_pb2.LedgerEvent:
    """`uid` finished normally."""
    return _event(ledger_pb2.EVENT_KIND_STOPPED, uid, at, event_id)


def heartbeat(
    uid: str, *, at: datetime | float | None = None, event_id: str | None = None
) -> ledger_pb2.LedgerEvent:
    """`uid` still runs (a run silent longer than the server's stale limit is closed)."""
    return _event(ledger_pb2.EVENT_KIND_HEARTBEAT, uid, at, event_id)


def preempted(
    uid: str, *, at: datetime | float | None = None, event_id: str | None = None
) -> ledger_pb2.LedgerEvent:
    """`uid` was stopped by an eviction; its GPUs are free from `at`."""
    return _event(ledger_pb2.EVENT_KIND_PREEMPTED, uid, at, event_id)


def failed(
    uid: str, *, at: datetime | float | None = None, event_id: str | None = None
) -> ledger_pb2.LedgerEvent:
    """`uid` stopped by a failure."""
    return _event(ledger_pb2.EVENT_KIND_FAILED, uid, at, event_id)


def node_capacity(
    node: str, gpu_count: int, *, at: datetime | float | None = None, event_id: str | None = None
) -> ledger_pb2.LedgerEvent:
    """`node` has `gpu_count` usable GPUs from `at` (a failed card, a repaired one)."""
    msg = _event(ledger_pb2.EVENT_KIND_NODE_CAPACITY, "", at, event_id)
    msg.node, msg.gpu_count = node, gpu_count
    return msg


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
