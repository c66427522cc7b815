"""The gpufair client for asyncio: `GpufairClient`'s methods, awaited.

    async with AsyncGpufairClient("127.0.0.1:50051") as client:
        reply = await client.schedule("default")
        await client.report_events([started(uid, bind.pods) for bind in reply.binds for uid in ...])

Same credentials, deadlines and retries (gRPC's retry policy in the channel's service config,
jittered, bounded by each call's deadline), same request ids reused by every attempt of a call.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
import grpc.aio

from gpufair.client import (
    DEFAULT_ADDRESS,
    GpufairClient,
    channel_credentials,
    channel_options,
    config_write_request,
    fair_share_history_request,
    usage_request,
)
from gpufair.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    ledger_pb2,
    ledger_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)


class AsyncGpufairClient:
    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        timeout_s: float = 30.0,
        attempts: int = 4,
        backoff_s: float = 0.2,
        channel: grpc.aio.Channel | None = None,
        token: str | None = None,
        tls: bool = False,
        tls_ca: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        if channel is None:
            options = channel_options(attempts, backoff_s)
            credentials = channel_credentials(
                address, token=token, tls=tls, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
            )
            channel = (
                grpc.aio.insecure_channel(address, options=options)
                if credentials is None
                else grpc.aio.secure_channel(address, credentials, options=options)
            )
        self._channel = channel
        self.cluster = cluster_pb2_grpc.ClusterAdminStub(channel)  # type: ignore[no-untyped-call]
        self.scheduler = scheduler_pb2_grpc.SchedulerStub(channel)  # type: ignore[no-untyped-call]
        self.ledger = ledger_pb2_grpc.LedgerStub(channel)  # type: ignore[no-untyped-call]

    async def __aenter__(self) -> AsyncGpufairClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close(None)

    async def call(self, method: Any, request: Any, *, timeout_s: float | None = None) -> Any:
        """Await `method` with a deadline (retries: the channel's policy)."""
        return await method(request, timeout=timeout_s or self.timeout_s)

    new_request_id = staticmethod(GpufairClient.new_request_id)

    # ---- ClusterAdmin ----------------------------------------------------------------------

    async def apply_config(
        self,
        config: cluster_pb2.ClusterConfig,
        *,
        dry_run: bool = False,
        request_id: str = "",
        kinds: Sequence[str] = (),
        expected_version: int | None = None,
        confirm_delete_all: bool = False,
    ) -> cluster_pb2.ApplyConfigResponse:
        request = config_write_request(
            cluster_pb2.ApplyConfigRequest,
            request_id=request_id,
            expected_version=expected_version,
            config=config,
            dry_run=dry_run,
            kinds=kinds,
            confirm_delete_all=confirm_delete_all,
        )
        reply: cluster_pb2.ApplyConfigResponse = await self.call(self.cluster.ApplyConfig, request)
        return reply

    async def get_config(self) -> cluster_pb2.GetConfigResponse:
        reply: cluster_pb2.GetConfigResponse = await self.call(
            self.cluster.GetConfig, cluster_pb2.GetConfigRequest()
        )
        return reply

    async def delete_objects(
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
        reply: cluster_pb2.DeleteObjectsResponse = await self.call(
            self.cluster.DeleteObjects, request
        )
        return reply

    async def upsert_nodes(
        self,
        nodes: Sequence[cluster_pb2.Node],
        *,
        prune_pools: Sequence[str] = (),
        confirm_delete_all: bool = False,
        dry_run: bool = False,
        expected_version: int | None = None,
        request_id: str = "",
    ) -> cluster_pb2.UpsertNodesResponse:
        request = config_write_request(
            cluster_pb2.UpsertNodesRequest,
            request_id=request_id,
            expected_version=expected_version,
            nodes=nodes,
            prune_pools=prune_pools,
            confirm_delete_all=confirm_delete_all,
            dry_run=dry_run,
        )
        reply: cluster_pb2.UpsertNodesResponse = await self.call(self.cluster.UpsertNodes, request)
        return reply

    async def set_nodes_ready(
        self,
        names: Sequence[str],
        ready: bool,
        *,
        dry_run: bool = False,
        expected_version: int | None = None,
        request_id: str = "",
    ) -> cluster_pb2.SetNodesReadyResponse:
        request = config_write_request(
            cluster_pb2.SetNodesReadyRequest,
            request_id=request_id,
            expected_version=expected_version,
            names=names,
            ready=ready,
            dry_run=dry_run,
        )
        reply: cluster_pb2.SetNodesReadyResponse = await self.call(
            self.cluster.SetNodesReady, request
        )
        return reply

    # ---- Scheduler -------------------------------------------------------------------------

    async def submit_workloads(
        self, workloads: Sequence[scheduler_pb2.Workload], *, request_id: str = ""
    ) -> scheduler_pb2.SubmitWorkloadsResponse:
        request = scheduler_pb2.SubmitWorkloadsRequest(
            workloads=workloads, request_id=request_id or self.new_request_id()
        )
        reply: scheduler_pb2.SubmitWorkloadsResponse = await self.call(
            self.scheduler.SubmitWorkloads, request
        )
        return reply

    async def cancel_workload(
        self, uid: str, *, request_id: str = ""
    ) -> scheduler_pb2.CancelWorkloadResponse:
        request = scheduler_pb2.CancelWorkloadRequest(
            uid=uid, request_id=request_id or self.new_request_id()
        )
        reply: scheduler_pb2.CancelWorkloadResponse = await self.call(
            self.scheduler.CancelWorkload, request
        )
        return reply

    async def schedule(
        self, pool: str, *, dry_run: bool = False, request_id: str = ""
    ) -> scheduler_pb2.ScheduleResponse:
        request = scheduler_pb2.ScheduleRequest(
            pool=pool, dry_run=dry_run, request_id=request_id or self.new_request_id()
        )
        reply: scheduler_pb2.ScheduleResponse = await self.call(self.scheduler.Schedule, request)
        return reply

    async def explain(self, uid: str) -> scheduler_pb2.ExplainWorkloadResponse:
        reply: scheduler_pb2.ExplainWorkloadResponse = await self.call(
            self.scheduler.ExplainWorkload, scheduler_pb2.ExplainWorkloadRequest(uid=uid)
        )
        return reply

    async def list_workloads(
        self,
        *,
        pool: str = "",
        queue: str = "",
        states: Sequence[str] = (),
        page_size: int = 0,
    ) -> list[scheduler_pb2.WorkloadStatus]:
        """Every workload matching the filters, all pages followed."""
        found: list[scheduler_pb2.WorkloadStatus] = []
        token = ""
        while True:
            reply: scheduler_pb2.ListWorkloadsResponse = await self.call(
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

    async def report_events(
        self, events: Sequence[ledger_pb2.LedgerEvent]
    ) -> ledger_pb2.ReportEventsResponse:
        reply: ledger_pb2.ReportEventsResponse = await self.call(
            self.ledger.ReportEvents, ledger_pb2.ReportEventsRequest(events=events)
        )
        return reply

    async def stream_events(
        self,
        batches: Iterable[Sequence[ledger_pb2.LedgerEvent]]
        | AsyncIterable[Sequence[ledger_pb2.LedgerEvent]],
        *,
        timeout_s: float | None = None,
    ) -> ledger_pb2.ReportEventsResponse:
        """Send `batches` (a plain or an async iterable) over one `StreamEvents` call."""

        async def requests() -> AsyncIterator[ledger_pb2.ReportEventsRequest]:
            if isinstance(batches, AsyncIterable):
                async for batch in batches:
                    yield ledger_pb2.ReportEventsRequest(events=batch)
            else:
                for batch in batches:
                    yield ledger_pb2.ReportEventsRequest(events=batch)

        reply: ledger_pb2.ReportEventsResponse = await self.ledger.StreamEvents(
            requests(), timeout=timeout_s or self.timeout_s
        )
        return reply

    async def get_fair_share(self, pool: str) -> ledger_pb2.GetFairShareResponse:
        reply: ledger_pb2.GetFairShareResponse = await self.call(
            self.ledger.GetFairShare, ledger_pb2.GetFairShareRequest(pool=pool)
        )
        return reply

    async def get_fair_share_history(
        self,
        pool: str,
        *,
        queue: str = "",
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> ledger_pb2.GetFairShareHistoryResponse:
        reply: ledger_pb2.GetFairShareHistoryResponse = await self.call(
            self.ledger.GetFairShareHistory, fair_share_history_request(pool, queue, since, until)
        )
        return reply

    async def get_usage(
        self,
        *,
        pool: str = "",
        queue: str = "",
        period: ledger_pb2.UsagePeriod.ValueType = ledger_pb2.USAGE_PERIOD_DAY,
        since: datetime | None = None,
        until: datetime | None = None,
        include_open_hour: bool = False,
    ) -> ledger_pb2.GetUsageResponse:
        reply: ledger_pb2.GetUsageResponse = await self.call(
            self.ledger.GetUsage,
            usage_request(pool, queue, period, since, until, include_open_hour),
        )
        return reply
