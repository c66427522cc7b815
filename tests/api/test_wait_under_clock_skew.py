"""A wait in report.workload_accounting never reads below 0, through the real API.

The submitter's clock 5 minutes ahead of the batch system's: a workload submitted at 10:05 by
its clock starts at 10:00 by the batch system's. The ledger stores both as sent (each is the
truth of its own clock), and the accounting view read a wait of -300 s; it reads 0 now, and a
workload that waited 10 minutes still reads 600 s.
"""

from __future__ import annotations

import time

from sqlalchemy import Engine, text

from gpufair.client import GpufairClient
from gpufair.v1 import scheduler_pb2
from tests.api.ledger_support import STARTED, STORED, cluster, event, report


def test_a_start_stamped_before_its_submit_waited_0_seconds(
    client: GpufairClient, db: Engine
) -> None:
    client.apply_config(cluster())
    start_s = float(int(time.time()) - 3600)
    submits = {"ahead": start_s + 300, "waited": start_s - 600}
    for uid, submit_s in submits.items():
        w = scheduler_pb2.Workload(uid=uid, queue="llm", pool="main", pods=1, gpus_per_pod=1)
        w.submit_time.FromNanoseconds(round(submit_s * 1e9))
        assert client.submit_workloads([w]).results[0].accepted
    started = [
        event(STARTED, "ahead", start_s, [("a1", [0], 1.0)]),
        event(STARTED, "waited", start_s, [("a1", [1], 1.0)]),
    ]
    assert [r.status for r in report(client, *started)] == [STORED, STORED]
    with db.connect() as conn:
        waits = conn.execute(
            text(
                "SELECT workload, wait_s, extract(epoch FROM start_time - submit_time) "
                "FROM report.workload_accounting ORDER BY workload"
            )
        ).all()
    assert [tuple(r) for r in waits] == [("ahead", 0.0, -300), ("waited", 600.0, 600)]
