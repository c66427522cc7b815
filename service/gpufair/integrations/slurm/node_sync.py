"""Step 1 of a cycle (bridge.py): the nodes of mapped partitions upserted into their pools
(pruning the pools' nodes Slurm no longer has); drained, down or failing nodes are not ready."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from gpufair.integrations.slurm.bridge_part import BridgePart
from gpufair.integrations.slurm.mapping import map_node
from gpufair.v1 import cluster_pb2

if TYPE_CHECKING:
    from gpufair.integrations.slurm.bridge import CycleReport


@dataclass(eq=False)
class NodeSync(BridgePart):
    _sent_nodes: bytes | None = field(default=None, init=False)
    # This cycle's mapped nodes: ready (up, not drained)?
    ready: dict[str, bool] = field(default_factory=dict, init=False)
    # When this bridge first read each node ready again after reading it not ready (or gone),
    # by its own clock; none from its first cycle, whose nodes' past it does not know.
    ready_since: dict[str, float] = field(default_factory=dict, init=False)

    def sync(self, report: CycleReport) -> None:
        mapped = [n for n in (map_node(self.config, s) for s in self.slurm.nodes()) if n]
        mapped.sort(key=lambda n: n.name)
        ready_before, self.ready = self.ready, {n.name: n.ready for n in mapped}
        if ready_before:
            for name, ready in self.ready.items():
                if ready and not ready_before.get(name, False):
                    self.ready_since[name] = self.clock()
        key = b"".join(n.SerializeToString(deterministic=True) for n in mapped)
        if key == self._sent_nodes:
            return
        try:
            self.client.upsert_nodes(mapped, prune_pools=self.config.pools)
        except grpc.RpcError as exc:
            if not _failed_precondition(exc):
                raise
            # A node gone from Slurm still has work in gpufair: update the rest, prune later.
            report.errors.append(f"nodes: not pruned yet: {exc.details()}")
            try:
                self.client.upsert_nodes(mapped)
            except grpc.RpcError as again:
                if not _failed_precondition(again):
                    raise
                # A node Slurm put in another pool or GPU type, or gave fewer GPUs, still holds
                # work gpufair placed there: the nodes so changed keep gpufair's pool, type and
                # GPU count this cycle (the rest is updated, the other changed nodes too), and
                # change in a cycle after their work has ended.
                report.errors[-1] = f"nodes: not moved yet: {again.details()}"
                try:
                    self.client.upsert_nodes(self._unmoved(mapped, held=self._held_gpus()))
                except grpc.RpcError as third:
                    if not _failed_precondition(third):
                        raise
                    # Work bound between the two reads: every changed node waits this cycle.
                    self.client.upsert_nodes(self._unmoved(mapped, held=None))
            return
        self._sent_nodes = key

    def _held_gpus(self) -> dict[str, int]:
        """Per node, the highest GPU index bound or running work holds there (-1: work that
        holds no GPU of it), as gpufair lists its work: what makes gpufair refuse to move the
        node (any work) or to shrink it (a GPU at or past the new count)."""
        held: dict[str, int] = {}
        for status in self.client.list_workloads(states=["bound", "running"]):
            for pod in status.pods:
                highest = max(pod.gpu_indices, default=-1)
                held[pod.node] = max(held.get(pod.node, -1), highest)
        return held

    def _unmoved(
        self, mapped: list[cluster_pb2.Node], *, held: dict[str, int] | None
    ) -> list[cluster_pb2.Node]:
        """`mapped`, with gpufair's stored pool, GPU type and GPU count kept for each node whose
        change gpufair refuses while its work runs: a node Slurm put in another pool or GPU type
        and that work uses (`held` names it), and a node with fewer GPUs than gpufair's count
        below a GPU its work holds. The other changed nodes go as Slurm has them. `held` None:
        every changed node keeps gpufair's values. gpufair's config is read once, only when a
        move or shrink was refused."""
        stored = {n.name: n for n in self.client.get_config().config.nodes}
        kept = []
        for node in mapped:
            was = stored.get(node.name)
            moved = was is not None and (was.pool, was.gpu_type) != (node.pool, node.gpu_type)
            shrunk = was is not None and node.gpu_count < was.gpu_count
            if held is not None:
                moved = moved and node.name in held
                shrunk = shrunk and held.get(node.name, -1) >= node.gpu_count
            if was is not None and (moved or shrunk):
                unmoved = cluster_pb2.Node()
                unmoved.CopyFrom(node)
                unmoved.pool, unmoved.gpu_type = was.pool, was.gpu_type
                unmoved.gpu_count = max(node.gpu_count, was.gpu_count)
                kept.append(unmoved)
            else:
                kept.append(node)
        return kept


def _failed_precondition(exc: grpc.RpcError) -> bool:
    return isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.FAILED_PRECONDITION
