"""Move searches that found nothing, remembered across cycles (`cycle_defrag`).

In a replay most cycles ask the defragmentation phase the same question of the same capacity as
the cycle before, and a search that ends without moves retries up to `_ATTEMPTS` node sets with
a greedy pass and a trial placement each. A search is a pure function of what it reads:

- the gang's ask (shape, GPU type, pods, topology, the pool's topology levels) and the pool's
  placement strategy;
- the budget of GPUs that may still move this hour;
- the movable workloads (the nodes holding them; each one's uses and GPUs, and the shape and
  topology it would be re-placed with);
- the nodes of that GPU type (`place` reads no other): their names, sizes, labels and partition
  geometry, which do not change within a cycle (`static_key`, made once per cycle and type);
  and what takes and releases change (`dynamic_key`): each node's used GPUs, partition
  slices, free whole and partly used GPUs, free CPU and memory, and the orders placement walks
  the nodes in (`orders`: the buckets of nodes by untouched GPUs, the partly used nodes, the
  partitioned ones).

A search that found no moves is kept under all of that (`remember`), and the same search on the
same key is not run again (`skip`). One trace of a failed search outlives it: a release undone
by `Capacity.restore` puts the node last in its bucket (and in the partly used nodes when it had
left them), and the phases after defragmentation place in that order. So the memo keeps the
orders the search left, and a skipped search leaves the nodes in them (`set_orders`).
Successes are not kept (they are decided, which changes the key). The memo is a dict shared
by all pools and cycles of the process, cleared when it holds `MAX` keys or keys of `MAX_PARTS`
nodes and workloads in all (a key of a 4,000-node pool holds thousands of each): a key names
everything read, so sharing or clearing it changes how long a cycle takes, never what it
decides.
"""

from __future__ import annotations

from gpufair.domain.capacity import Capacity
from gpufair.domain.model import PlacementStrategy
from gpufair.domain.placement_ask import Ask

Orders = tuple[tuple[tuple[int, ...], ...], tuple[int, ...], tuple[int, ...]]
NO_MOVES: dict[tuple[object, ...], Orders] = {}
MAX = 256
MAX_PARTS = 200_000
_parts = [0]  # nodes and workloads in the keys held


def static_key(capacity: Capacity, gpu_type: str) -> tuple[object, ...] | None:
    """What placement reads of the nodes of `gpu_type` that does not change within a cycle;
    None when some part cannot be hashed (then nothing is remembered)."""
    key = tuple(
        (
            index,
            node.name,
            node.gpu_count,
            node.cpu_total,
            node.memory_total,
            tuple(sorted(node.labels.items())),
            tuple(sorted(node.geometry.items())),
        )
        for index in capacity.by_type.get(gpu_type, [])
        for node in (capacity.nodes[index],)
    )
    try:
        hash(key)
    except TypeError:
        return None
    return (gpu_type, len(capacity.nodes), key)


def orders(capacity: Capacity, gpu_type: str) -> Orders:
    """The orders placement walks the nodes of `gpu_type` in."""
    return (
        tuple(
            tuple(capacity.bucket(gpu_type, free))
            for free in range(capacity.max_gpus.get(gpu_type, -1) + 1)
        ),
        tuple(capacity.partial_nodes(gpu_type)),
        tuple(capacity.partitioned_nodes(gpu_type)),
    )


def set_orders(capacity: Capacity, gpu_type: str, remembered: Orders) -> None:
    """Leave the nodes of `gpu_type` in the orders a remembered search left them in (the same
    nodes in each: the state is the one the search started from)."""
    buckets, partial, partitioned = remembered
    found = [capacity.bucket(gpu_type, free) for free in range(len(buckets))]
    found += [capacity.partial_nodes(gpu_type), capacity.partitioned_nodes(gpu_type)]
    for members, order in zip(found, (*buckets, partial, partitioned), strict=True):
        if tuple(members) != order:
            members.clear()
            members.update(dict.fromkeys(order))


def dynamic_key(capacity: Capacity, gpu_type: str) -> tuple[object, ...]:
    """What placement reads of the nodes of `gpu_type` that takes and releases change."""
    nodes = tuple(
        (
            tuple(node.gpu_used),
            None if node.slices is None else tuple(node.slices),
            node.free_whole,
            node.partial_gpus,
            node.cpu_free,
            node.memory_free,
        )
        for index in capacity.by_type.get(gpu_type, [])
        for node in (capacity.nodes[index],)
    )
    return (nodes, orders(capacity, gpu_type), capacity.free_whole_by_type.get(gpu_type))


def search_key(
    capacity: Capacity,
    ask: Ask,
    strategy: PlacementStrategy,
    budget: float,
    nodes: tuple[int, ...],
    movable: tuple[tuple[object, ...], ...],
    static: tuple[object, ...] | None,
) -> tuple[object, ...] | None:
    """Everything a search reads (module docstring); None when it cannot be hashed. `nodes`:
    the nodes holding movable work; `movable`: per movable workload its uid, GPUs, uses, and
    the shape and topology it is re-placed with."""
    if static is None:
        return None
    key = (ask, strategy, budget, nodes, movable, static, dynamic_key(capacity, ask.gpu_type))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def skip(key: tuple[object, ...] | None, capacity: Capacity, gpu_type: str) -> bool:
    """Whether the search under `key` found no moves before; if so, the nodes are left in the
    orders it left them in."""
    if key is None:
        return False
    remembered = NO_MOVES.get(key)
    if remembered is None:
        return False
    set_orders(capacity, gpu_type, remembered)
    return True


def remember(key: tuple[object, ...] | None, capacity: Capacity, gpu_type: str) -> None:
    """The search under `key` found no moves and left the nodes as they are now."""
    if key is None:
        return
    parts = len(key[3]) + len(key[4]) + len(key[-1][0])  # type: ignore[arg-type,index]
    if len(NO_MOVES) >= MAX or _parts[0] + parts > MAX_PARTS:
        forget()
    NO_MOVES[key] = orders(capacity, gpu_type)
    _parts[0] += parts


def forget() -> None:
    """Empty the memo."""
    NO_MOVES.clear()
    _parts[0] = 0
