"""The node sets a victim search reads (`victim_search`) and the tests of room made before it:
whether evicting every victim of the type, or of a topology domain, could free the GPUs a
gang needs (`pool_could_fit`, `node_sets`), counting the room beside shares and partitions
that a victim's going completes (`room_beside_shares`, `_room_beside_victims`). A set that
fails its test is not searched. `victim_search` has the design.
"""

from __future__ import annotations

import heapq
from collections.abc import Container, Iterable, Iterator

from gpufair.domain.capacity import EPS, Capacity
from gpufair.domain.placement_ask import Ask, Exclusion
from gpufair.domain.placement_fit import nodes_with_room
from gpufair.domain.victim_index import VictimIndex


def pool_could_fit(capacity: Capacity, ask: Ask, index: VictimIndex) -> bool:
    """Whether the type's free GPUs (an upper bound, held nodes included) and its victims'
    GPUs together reach the GPUs the gang needs: a cheap test for the whole type. Not made
    for a partition's pods (their room is in free slices, which it does not count), and with
    partitions running every GPU of their nodes counts as free besides: a partition victim
    holds its fraction of a GPU but frees all of it when it leaves the GPU empty. For
    whole-GPU pods the free part of the part-used GPUs of nodes with victims counts too
    (`room_beside_shares`, read only when the rest falls short): a share's going frees its
    whole GPU when the rest of it is free (a 0.25 beside 0.75 free frees one GPU)."""
    free_gpus = float(capacity.free_whole_by_type.get(ask.gpu_type, 0))
    if ask.shape.gpus_per_pod < 1.0:  # whole-GPU pods cannot use shared GPUs' rest
        free_gpus += len(capacity.partial_nodes(ask.gpu_type))
    return free_gpus + index.total_gpus >= (
        ask.pods_min * ask.shape.gpus_per_pod - EPS
    ) or _could_fit_beside(capacity, ask, index, free_gpus)


def _could_fit_beside(capacity: Capacity, ask: Ask, index: VictimIndex, free_gpus: float) -> bool:
    """`pool_could_fit` where the free GPUs (`free_gpus`) and the victims' GPUs fall short:
    a partition's pods, the room beside shares, the GPUs of partitioned nodes."""
    shape = ask.shape
    if shape.profile:
        return True
    needed = ask.pods_min * shape.gpus_per_pod - EPS
    gpu_type = ask.gpu_type
    if shape.gpus_per_pod >= 1.0 and (
        free_gpus + index.total_gpus + room_beside_shares(capacity, gpu_type, index.on_node)
        >= needed
    ):
        return True
    if not index.partitions:  # no partition in the pool (`VictimIndex.partitions`)
        return False
    partitioned = capacity.partitioned_nodes(gpu_type)
    return bool(partitioned) and (
        free_gpus + len(partitioned) * capacity.max_gpus.get(gpu_type, 0) + index.total_gpus
        >= needed
    )


def room_beside_shares(
    capacity: Capacity, gpu_type: str, among: Container[int] | None = None
) -> float:
    """The free part of the part-used GPUs of `gpu_type` (of the nodes in `among`, when
    given): what the victims' GPUs leave out of the GPUs their going may wholly free. A GPU a
    share holds beside free room is wholly freed by the share's going, which frees only its
    fraction of the GPU's use: the GPUs victims may free are at most their GPUs plus this
    (over each GPU freed, its victims' use and its free part make it whole). Read only when
    the victims' GPUs alone fall short of a whole-GPU gang's: a bound in any state of the
    capacity, releases made for the search included."""
    room = 0.0
    nodes = capacity.nodes
    for node in capacity.partial_nodes(gpu_type):
        if among is None or node in among:
            for used in nodes[node].gpu_used:
                if EPS < used < 1.0 - EPS:
                    room += 1.0 - used
    return room


def node_sets(
    capacity: Capacity, ask: Ask, exclusion: Exclusion, index: VictimIndex
) -> Iterator[list[int] | None]:
    """Node sets worth searching: topology domains (lists of nodes), and None for the whole
    type. A set is dropped at once when even evicting every victim in it could not free the
    GPUs the gang needs (for whole-GPU pods, counting the room beside its victims:
    `_room_beside_victims`). A domain's list of nodes is made when the search reaches it: most
    searches stop after a few."""
    needed_gpus = ask.pods_min * ask.shape.gpus_per_pod
    whole_pods = ask.shape.gpus_per_pod >= 1.0  # whole-GPU pods cannot use shared GPUs' rest
    topology = ask.topology
    pool: list[list[int] | None] = [None] if pool_could_fit(capacity, ask, index) else []
    if topology is None:
        yield from pool
        return
    if ask.shape.profile or (index.partitions and capacity.partitioned_nodes(ask.gpu_type)):
        # A partition's room is in slices, and a partition victim may free a whole GPU: the
        # GPUs counted below bound neither, and no domain is dropped by them.
        needed_gpus = 0.0
    nodes = capacity.nodes
    free_by_node = {
        node: nodes[node].free_whole if whole_pods else nodes[node].free_gpus()
        for node in nodes_with_room(capacity, ask.shape, ask.gpu_type)
        if not exclusion.blocks(node)
    }
    free_by_domain: dict[str, float] = {}
    domain_of = capacity.domain_of(topology.level)
    for node, free in free_by_node.items():
        value = domain_of[node]
        if value is not None:
            free_by_domain[value] = free_by_domain.get(value, 0.0) + free
    victim_gpus = index.domain_gpus(topology.level)
    domains = capacity.domains(topology.level).get(ask.gpu_type, {})
    ranked: Iterable[tuple[float, str]]
    if needed_gpus > EPS:
        # Whole-GPU pods: the room beside victims that the counts above leave out, per domain
        # (`_room_beside_victims`), counted in the test only, not in the rank.
        beside = (
            _room_beside_victims(capacity, ask, exclusion, index, topology.level)
            if whole_pods
            else {}
        )
        # A domain with neither free GPUs nor victims could not hold a pod: only domains
        # that have either are tested. Those with free GPUs (a handful of a pool's hundreds)
        # are ranked at once; those with victims alone all rank as 0.0 free, so by name:
        # they are read from the index's names in that order (`domain_order`) as the search
        # reaches them, merged with the others by rank. A search that finds its domains
        # stops after a few; one that fails in every domain reads each name once, and none
        # makes a set or a sort of all of a pool's domains.
        least = needed_gpus - EPS
        roomy = sorted(
            (-free, value)
            for value, free in free_by_domain.items()
            if value in domains
            and free + victim_gpus.get(value, 0.0) + beside.get(value, 0.0) >= least
        )
        # A domain of victims alone reads the room beside them only when short without it
        # (there is none in a full pool): adding it, never negative, keeps a sum at `least`.
        victims_only = (
            (-0.0, value)
            for value in index.domain_order(topology.level)
            if value not in free_by_domain
            and value in domains
            and (
                victim_gpus[value] >= least
                or (beside and victim_gpus[value] + beside.get(value, 0.0) >= least)
            )
        )
        ranked = heapq.merge(roomy, victims_only)
    else:
        ranked = sorted(
            (-free_by_domain.get(value, 0.0), value)
            for value in domains
            if free_by_domain.get(value, 0.0) + victim_gpus.get(value, 0.0) >= needed_gpus - EPS
        )
    for _, value in ranked:
        yield [node for node in domains[value] if not exclusion.blocks(node)]
    if not topology.required:
        yield from pool


def _room_beside_victims(
    capacity: Capacity, ask: Ask, exclusion: Exclusion, index: VictimIndex, level: str
) -> dict[str, float]:
    """Per value of topology label `level`, the room on nodes with victims that a domain's
    free GPUs (nodes with a whole pod's GPUs free) and its victims' GPUs leave out, for pods
    of whole GPUs: the free GPUs of a node with fewer free than a pod takes (a victim beside
    them completes the pod's GPUs) and the free part of part-used GPUs (`room_beside_shares`).
    Empty in a full pool: no node has a GPU free or part-used."""
    gpu_type = ask.gpu_type
    whole = ask.shape.whole_gpus
    on_node = index.on_node
    nodes = capacity.nodes
    found: dict[str, float] = {}
    read: set[int] = set()
    domain_of = capacity.domain_of(level)
    # Nodes with 1 .. whole - 1 GPUs free; none of the type has more GPUs than its largest.
    fewer = range(1, min(whole, capacity.max_gpus.get(gpu_type, 0) + 1))
    groups = [capacity.bucket(gpu_type, free) for free in fewer]
    groups.append(capacity.partial_nodes(gpu_type))
    for group in groups:
        for node in group:
            if node in read or node not in on_node or exclusion.blocks(node):
                continue
            read.add(node)
            value = domain_of[node]
            if value is None:
                continue
            state = nodes[node]
            room = float(state.free_whole) if state.free_whole < whole else 0.0
            for used in state.gpu_used:
                if EPS < used < 1.0 - EPS:
                    room += 1.0 - used
            found[value] = found.get(value, 0.0) + room
    return found
