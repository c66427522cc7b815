"""Concurrent `Schedule` calls of one pool share cycles instead of queueing for the pool's lock
(api/cycle_gate.py), within a replica and across replicas; a caller may take the decisions of the
cycle running when it arrives only if nothing this replica committed since could be missed."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine, create_engine, event, text

from gpufair.api.cycle_gate import CycleGate
from gpufair.api.scheduler import SchedulerServicer
from gpufair.api.server import RunningServer, build_server
from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.store import locks
from gpufair.v1 import ledger_pb2, scheduler_pb2

CLUSTER = {
    "gpu_types": [{"name": "a100", "memory_gib": 80, "compute_weight": 1}],
    "pools": [{"name": "main"}],
    "nodes": [
        {
            "name": f"n{i}",
            "pool": "main",
            "gpu_type": "a100",
            "gpu_count": 8,
            "cpu_millicores": 64000,
            "memory_mib": 524288,
        }
        for i in range(8)
    ],
    "queues": [{"name": "q", "quotas": [{"pool": "main", "deserved_cu": 64}]}],
}
CALLERS = 200


def one_gpu(uid: str) -> scheduler_pb2.Workload:
    return scheduler_pb2.Workload(uid=uid, queue="q", pool="main", pods=1, gpus_per_pod=1)


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.01)


def waiting_for_the_pool_lock(db: Engine) -> int:
    """Connections of this database that wait for an advisory lock (a pool's)."""
    with db.connect() as watcher:
        return int(
            watcher.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND wait_event = 'advisory' AND datname = current_database()"
                )
            ).scalar_one()
        )


class GateWatch:
    """Where the server's `Schedule` callers are in its coalescing gate (api/cycle_gate.py), by
    request id: the gate is caught on its first call, and its slots are read under its lock."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gates: list[CycleGate[Any, Any]] = []
        call = CycleGate.call

        def watched(gate: CycleGate[Any, Any], *args: Any, **kwargs: Any) -> Any:
            if not any(g is gate for g in self.gates):
                self.gates.append(gate)
            return call(gate, *args, **kwargs)

        monkeypatch.setattr(CycleGate, "call", watched)

    def _gate(self) -> CycleGate[Any, Any]:
        [gate] = self.gates  # one server, one gate
        return gate

    def running(self, pool: str) -> list[str]:
        """The callers of the cycle that runs for `pool`, in their order of arrival."""
        gate = self._gate()
        with gate._lock:
            slot = gate._running.get(pool)
            return [] if slot is None else [m.key.request_id for m in slot.members]

    def waiting(self, pool: str) -> list[str]:
        """The callers waiting for the next cycle of `pool` (the slot behind the running one)."""
        gate = self._gate()
        with gate._lock:
            slot = gate._tail.get(pool)
            if slot is None or slot.started:
                return []
            return [m.key.request_id for m in slot.members]


@pytest.fixture
def gate_watch(monkeypatch: pytest.MonkeyPatch) -> GateWatch:
    return GateWatch(monkeypatch)


def test_200_concurrent_callers_of_one_pool_share_cycles_and_all_answer(
    client: GpufairClient, db: Engine, server: RunningServer
) -> None:
    client.apply_config(parse_config(CLUSTER))
    client.submit_workloads([one_gpu(f"w{i:03}") for i in range(100)])
    address = f"127.0.0.1:{server.port}"
    start = threading.Barrier(CALLERS)

    def call(i: int) -> tuple[str, scheduler_pb2.ScheduleResponse]:
        with GpufairClient(address, timeout_s=60, attempts=1) as c:
            request_id = f"caller-{i}"
            start.wait()
            return request_id, c.schedule("main", request_id=request_id)

    with ThreadPoolExecutor(CALLERS) as pool:
        answers = list(pool.map(call, range(CALLERS)))

    by_cycle: dict[int, list[scheduler_pb2.ScheduleResponse]] = defaultdict(list)
    for _, reply in answers:
        by_cycle[reply.cycle_id].append(reply)
    with db.connect() as conn:
        stored = dict(conn.execute(text("SELECT id, binds FROM schedule_cycles")).all())
        bound = set(conn.execute(text("SELECT uid FROM workloads WHERE state = 'bound'")).scalars())
    # Every reply is a stored cycle, and the callers of one cycle got the same decisions.
    assert set(by_cycle) == set(stored)
    for cycle_id, replies in by_cycle.items():
        assert len({r.SerializeToString(deterministic=True) for r in replies}) == 1
        assert len(replies[0].binds) == stored[cycle_id]
    # Coalesced: far fewer cycles than callers. With 8 RPC threads at most 7 callers wait for
    # one cycle; on a loaded machine callers trickle in and fewer share each (4 seen): without
    # coalescing there would be a cycle per caller.
    assert len(stored) <= CALLERS // 2
    # 64 GPUs for 100 one-GPU workloads: each placed once, by one cycle.
    placed = [b.uid for replies in by_cycle.values() for b in replies[0].binds]
    assert len(placed) == len(set(placed)) == len(bound) == 64
    # A replay of any caller's request id returns its cycle's reply.
    request_id, reply = answers[CALLERS // 2]
    assert client.schedule("main", request_id=request_id) == reply


def test_a_caller_that_waited_for_another_replicas_cycle_gets_its_reply(
    client: GpufairClient, db: Engine
) -> None:
    client.apply_config(parse_config(CLUSTER))
    client.submit_workloads([one_gpu("a"), one_gpu("b")])
    other_replica = SchedulerServicer(db)
    got: dict[str, scheduler_pb2.ScheduleResponse] = {}
    with db.connect() as conn:
        # The other replica's cycle holds the pool's lock while the call arrives and waits.
        locks.xact_lock(conn, locks.pool_key("main"))
        caller = threading.Thread(target=lambda: got.setdefault("r", client.schedule("main")))
        caller.start()
        wait_until(lambda: waiting_for_the_pool_lock(db) == 1, "the call waits for the lock")
        theirs, _ = other_replica._decide_and_record(conn, "main", time.time())
        conn.commit()
    caller.join(30)

    assert sorted(b.uid for b in theirs.binds) == ["a", "b"]
    assert got["r"].cycle_id == theirs.cycle_id  # no second cycle on its heels
    assert got["r"].binds == theirs.binds
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM schedule_cycles")).scalar_one() == 1


def test_a_caller_that_wrote_after_another_replicas_cycle_read_gets_a_cycle_of_its_own(
    client: GpufairClient, db: Engine, gate_watch: GateWatch
) -> None:
    """The slot waits for the pool's lock while another replica's cycle (which read the pool
    already) holds it. A caller that submits `c` and then joins that slot must not get the other
    replica's cycle, which missed `c`: the slot runs a cycle for it right after."""
    client.apply_config(parse_config(CLUSTER))
    client.submit_workloads([one_gpu("a"), one_gpu("b")])
    other_replica = SchedulerServicer(db)
    got: dict[str, scheduler_pb2.ScheduleResponse] = {}
    with db.connect() as conn:
        locks.xact_lock(conn, locks.pool_key("main"))
        first = threading.Thread(
            target=lambda: got.setdefault("first", client.schedule("main", request_id="first"))
        )
        first.start()
        wait_until(lambda: waiting_for_the_pool_lock(db) == 1, "the call waits for the lock")
        theirs, _ = other_replica._decide_and_record(conn, "main", time.time())  # read: no c
        client.submit_workloads([one_gpu("c")])
        second = threading.Thread(
            target=lambda: got.setdefault("second", client.schedule("main", request_id="second"))
        )
        second.start()
        # It joins the slot that waits for the lock (its cycle has not read the pool yet).
        wait_until(
            lambda: gate_watch.running("main") == ["first", "second"],
            "the second caller joins the first one's slot",
        )
        conn.commit()
    first.join(30)
    second.join(30)

    assert got["first"].cycle_id == theirs.cycle_id  # arrived before it: no cycle on its heels
    assert got["second"].cycle_id > theirs.cycle_id
    assert [b.uid for b in got["second"].binds] == ["c"]
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM schedule_cycles")).scalar_one() == 2


def test_a_caller_with_no_write_since_this_replicas_last_cycle_takes_a_later_cycle_of_another(
    db: Engine,
) -> None:
    """Another replica (its own engine: its commits are not this server's) stores a cycle after
    this server's last one. A caller that wrote nothing through this server since gets that
    cycle, no new one; the next such caller gets a fresh cycle (never the same one twice). A
    caller that submitted `b` while the other replica's next cycle ran (after its read) does not
    get that cycle, which missed `b`, but one that binds it. A server of its own: the shared
    one remembers cycle ids of earlier tests, which restart at 1 after each."""
    running = build_server(db, "127.0.0.1:0", max_workers=8)
    try:
        with GpufairClient(f"127.0.0.1:{running.port}", timeout_s=20, attempts=1) as mine:
            replies = _take_a_later_cycle(mine, db)
    finally:
        running.stop(1.0)
    own, theirs, taken, fresh, wrote = replies

    assert [b.uid for b in own.binds] == ["a"] and theirs.cycle_id > own.cycle_id
    assert taken.cycle_id == theirs.cycle_id and taken.binds == theirs.binds
    assert fresh.cycle_id > theirs.cycle_id
    assert wrote.cycle_id > fresh.cycle_id and [b.uid for b in wrote.binds] == ["b"]
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM schedule_cycles")).scalar_one() == 5


def _take_a_later_cycle(
    client: GpufairClient, db: Engine
) -> tuple[scheduler_pb2.ScheduleResponse, ...]:
    client.apply_config(parse_config(CLUSTER))
    client.submit_workloads([one_gpu("a")])
    own = client.schedule("main")
    other_engine = create_engine(db.url)
    other = SchedulerServicer(other_engine)
    try:
        with other_engine.connect() as conn:
            theirs, _ = other._decide_and_record(conn, "main", time.time())
            conn.commit()
        taken = client.schedule("main")
        fresh = client.schedule("main")
        with other_engine.connect() as conn:
            # The other replica's next cycle reads the pool, then `b` is submitted here and
            # acknowledged, then that cycle commits (after this replica's last own one).
            missed, _ = other._decide_and_record(conn, "main", time.time())
            client.submit_workloads([one_gpu("b")])
            conn.commit()
    finally:
        other_engine.dispose()
    wrote = client.schedule("main")
    assert not missed.binds and wrote.cycle_id > missed.cycle_id
    return own, theirs, taken, fresh, wrote


def test_dry_runs_are_not_coalesced_and_store_nothing(client: GpufairClient, db: Engine) -> None:
    client.apply_config(parse_config(CLUSTER))
    client.submit_workloads([one_gpu("a")])
    dry = client.schedule("main", dry_run=True)
    assert [b.uid for b in dry.binds] == ["a"] and dry.cycle_id == 0
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM schedule_cycles")).scalar_one() == 0


def test_a_request_id_reused_for_another_request_is_refused_in_a_coalesced_cycle(
    client: GpufairClient, db: Engine
) -> None:
    client.apply_config(parse_config(CLUSTER))
    first = client.schedule("main", request_id="same-id")
    with pytest.raises(grpc.RpcError) as err:
        client.scheduler.Schedule(
            scheduler_pb2.ScheduleRequest(pool="other", request_id="same-id"), timeout=10
        )
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "same-id" in (err.value.details() or "")
    assert client.schedule("main", request_id="same-id") == first


def whole_node(uid: str) -> scheduler_pb2.Workload:
    return scheduler_pb2.Workload(uid=uid, queue="q", pool="main", pods=1, gpus_per_pod=8)


def run_event(kind: int, uid: str, pods: Any = ()) -> ledger_pb2.LedgerEvent:
    msg = ledger_pb2.LedgerEvent(event_id=str(uuid.uuid4()), workload_uid=uid, kind=kind)  # type: ignore[arg-type]
    msg.occurred_at.FromNanoseconds(time.time_ns())
    for pod in pods:
        msg.pods.add(node=pod.node, gpu_indices=list(pod.gpu_indices), gpu_fraction=1.0)
    return msg


def joined_running() -> float:
    return REGISTRY.get_sample_value("gpufair_schedule_joined_running_total", {"pool": "main"}) or 0


@pytest.fixture
def held_at_bind_write(db: Engine) -> Iterator[dict[str, threading.Event]]:
    """Once `armed` is set, the next cycle that writes binds stops just before it (its snapshot
    read, its decisions made) until `go` is set; `held` is set once it stops."""
    gates = {"armed": threading.Event(), "held": threading.Event(), "go": threading.Event()}

    def hold(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if "SET state = 'bound'" in statement and gates["armed"].is_set():
            gates["armed"].clear()
            gates["held"].set()
            gates["go"].wait(30)

    event.listen(db, "before_cursor_execute", hold)
    try:
        yield gates
    finally:
        gates["go"].set()
        event.remove(db, "before_cursor_execute", hold)


def test_a_caller_joins_the_running_cycle_unless_a_write_it_made_could_be_missed(
    client: GpufairClient,
    db: Engine,
    server: RunningServer,
    held_at_bind_write: dict[str, threading.Event],
    gate_watch: GateWatch,
) -> None:
    """Two 8-GPU nodes; `r` runs on one, `a` and `p` (8 GPUs each) wait. A cycle C reads the
    pool and is held before it writes its bind (one of `a`, `p`, on the free node). A caller
    that wrote nothing joins C. A caller that then reports `r` stopped and calls must get a cycle
    that saw the stop: it binds the other of `a`, `p` onto r's node."""
    config = dict(CLUSTER, nodes=CLUSTER["nodes"][:2])
    config["queues"] = [{"name": "q", "quotas": [{"pool": "main", "deserved_cu": 16}]}]
    client.apply_config(parse_config(config))
    client.submit_workloads([whole_node("r")])
    [bind_r] = client.schedule("main").binds
    client.report_events([run_event(ledger_pb2.EVENT_KIND_STARTED, "r", bind_r.pods)])
    client.submit_workloads([whole_node("a"), whole_node("p")])
    address = f"127.0.0.1:{server.port}"
    joined_before = joined_running()

    def schedule(request_id: str) -> scheduler_pb2.ScheduleResponse:
        with GpufairClient(address, timeout_s=60, attempts=1) as c:
            return c.schedule("main", request_id=request_id)

    held_at_bind_write["armed"].set()
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(schedule, "first")  # cycle C
        assert held_at_bind_write["held"].wait(30)
        joiner = pool.submit(schedule, "joiner")  # no write since C read the pool: joins C
        wait_until(
            lambda: joined_running() == joined_before + 1, "the caller joins the running cycle"
        )
        assert gate_watch.running("main") == ["first", "joiner"]
        # A batch system reports r stopped (acknowledged), then asks for a cycle.
        ack = client.report_events([run_event(ledger_pb2.EVENT_KIND_STOPPED, "r")])
        assert [r.status for r in ack.results] == [ledger_pb2.EVENT_STATUS_STORED]
        writer = pool.submit(schedule, "writer")
        wait_until(
            lambda: gate_watch.waiting("main") == ["writer"], "the writer waits for the next cycle"
        )
        assert gate_watch.running("main") == ["first", "joiner"]  # it did not join C
        assert joined_running() == joined_before + 1
        held_at_bind_write["go"].set()
        c, joined, after = first.result(30), joiner.result(30), writer.result(30)

    assert joined.cycle_id == c.cycle_id and joined.binds == c.binds
    [taken] = [b.uid for b in c.binds]
    assert taken in ("a", "p")
    assert after.cycle_id > c.cycle_id
    # The writer's cycle saw r stopped: the other whole-node workload goes onto r's node.
    [other] = after.binds
    assert other.uid == ({"a", "p"} - {taken}).pop()
    assert [pod.node for pod in other.pods] == [pod.node for pod in bind_r.pods]
    with db.connect() as conn:
        cycles = conn.execute(text("SELECT count(*) FROM schedule_cycles")).scalar_one()
    assert cycles == 3  # r's, C (two callers) and the writer's
