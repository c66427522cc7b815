"""The wait a bind ends is counted from when the workload last began to wait: its submission, or
the end of its latest run when the batch system preempted it and requeued it under the same uid.
A workload that ran for three days, was preempted a minute ago and is bound again waited a
minute, not three days: counted from its submission it filled the top buckets of the queue's
wait histogram (P99 per queue, the dashboard's and DESIGN's measure of fairness) with run time."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from prometheus_client import REGISTRY
from sqlalchemy import Engine

from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import Workload
from gpufair.store import ingest_pipeline, workload_repo

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "llm-vs-vision.yaml"
DAY_S = 86400.0


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_preempted_workload_bound_again_waited_since_its_run_ended(
    client: GpufairClient, db: Engine
) -> None:
    client.apply_config(load_config_file(EXAMPLE))
    now = time.time()
    pods = (EventPod("gpu-01", (0, 1, 2, 3)),)
    with db.connect() as conn:
        workload_repo.submit(conn, [Workload("llm-ft", "llm", "default", 1, 4, now - 3 * DAY_S)])
        ingest_pipeline.ingest(
            conn,
            [
                LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, now - 3 * DAY_S, "llm-ft", pods),
                LedgerEvent(str(uuid.uuid4()), EventKind.PREEMPTED, now - 60, "llm-ft"),
            ],
            now,
        )
        conn.commit()
    wait = {"pool": "default", "queue": "llm"}
    by_type = {"pool": "default", "gpu_type": "h100-80gb"}
    first = {"pool": "default", "gang_size": "1"}
    before = {
        "le_300": _sample("gpufair_wait_seconds_bucket", **wait, le="300.0"),
        "count": _sample("gpufair_wait_seconds_count", **wait),
        "type_le_300": _sample("gpufair_wait_by_gpu_type_seconds_bucket", **by_type, le="300.0"),
        "first": _sample("gpufair_gang_first_bind_seconds_count", **first),
    }

    reply = client.schedule("default")

    assert [(b.uid, b.gpu_type) for b in reply.binds] == [("llm-ft", "h100-80gb")]
    # About 60 s since the preemption (within the 300 s bucket), not 3 days since submission.
    assert _sample("gpufair_wait_seconds_count", **wait) == before["count"] + 1
    assert _sample("gpufair_wait_seconds_bucket", **wait, le="300.0") == before["le_300"] + 1
    assert (
        _sample("gpufair_wait_by_gpu_type_seconds_bucket", **by_type, le="300.0")
        == before["type_le_300"] + 1
    )
    # It ran before: not a first bind.
    assert _sample("gpufair_gang_first_bind_seconds_count", **first) == before["first"]
