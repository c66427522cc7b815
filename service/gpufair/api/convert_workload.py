"""Workloads and placements between proto and domain."""

from __future__ import annotations

from gpufair.domain.errors import Violation
from gpufair.domain.limits import timestamp_violations
from gpufair.domain.model import PodBinding, TopologyConstraint, Workload
from gpufair.v1 import scheduler_pb2 as pb


def submit_time_violations(msg: pb.Workload, path: str) -> list[Violation]:
    """The Timestamp's own fields, before they are made one instant (which would hide nanos
    out of range, and seconds out of range that such nanos bring back in): seconds at
    `{path}.submit_time`, nanos at `{path}.submit_time.nanos`."""
    if not msg.HasField("submit_time"):
        return []
    return timestamp_violations(
        f"{path}.submit_time", msg.submit_time.seconds, msg.submit_time.nanos
    )


def workload_from_proto(msg: pb.Workload, received_at_s: float) -> Workload:
    submit = msg.submit_time
    submit_s = submit.seconds + submit.nanos / 1e9 if msg.HasField("submit_time") else received_at_s
    topology = (
        TopologyConstraint(level=msg.topology.level, required=msg.topology.required)
        if msg.HasField("topology")
        else None
    )
    return Workload(
        uid=msg.uid,
        queue=msg.queue,
        pool=msg.pool,
        pods=msg.pods,
        gpus_per_pod=msg.gpus_per_pod,
        submit_time_s=submit_s,
        min_pods=msg.min_pods if msg.HasField("min_pods") else None,
        allowed_gpu_types=tuple(msg.allowed_gpu_types),
        min_gpu_memory_gib=msg.min_gpu_memory_gib,
        cpu_millicores_per_pod=msg.cpu_millicores_per_pod,
        memory_mib_per_pod=msg.memory_mib_per_pod,
        topology=topology,
        priority_class=msg.priority_class,
        preemptible=msg.preemptible if msg.HasField("preemptible") else True,
        min_runtime_s=msg.min_runtime_s,
        partition_profile=msg.partition_profile,
        compute_units=msg.compute_units,
        mixed_gpu_types=msg.mixed_gpu_types,
        pods_on_distinct_nodes=msg.pods_on_distinct_nodes,
    )


def workload_to_proto(w: Workload) -> pb.Workload:
    msg = pb.Workload(
        uid=w.uid,
        queue=w.queue,
        pool=w.pool,
        pods=w.pods,
        gpus_per_pod=w.gpus_per_pod,
        allowed_gpu_types=list(w.allowed_gpu_types),
        min_gpu_memory_gib=w.min_gpu_memory_gib,
        cpu_millicores_per_pod=w.cpu_millicores_per_pod,
        memory_mib_per_pod=w.memory_mib_per_pod,
        priority_class=w.priority_class,
        preemptible=w.preemptible,
        min_runtime_s=w.min_runtime_s,
        partition_profile=w.partition_profile,
        compute_units=w.compute_units,
        mixed_gpu_types=w.mixed_gpu_types,
        pods_on_distinct_nodes=w.pods_on_distinct_nodes,
    )
    if w.min_pods is not None:
        msg.min_pods = w.min_pods
    if w.topology is not None:
        msg.topology.level = w.topology.level
        msg.topology.required = w.topology.required
    msg.submit_time.FromNanoseconds(round(w.submit_time_s * 1e9))
    return msg


def bindings_to_proto(bindings: tuple[PodBinding, ...]) -> list[pb.PodBinding]:
    return [
        pb.PodBinding(
            pod_index=b.pod_index,
            node=b.node,
            gpu_indices=list(b.gpu_indices),
            gpu_fraction=b.gpu_fraction,
            partition_start=b.partition_start,
        )
        for b in bindings
    ]
