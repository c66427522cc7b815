"""The limit checks and the bounded error output of domain/limits.py and request_rules.py."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from types import FrameType

from gpufair.domain.config_rules import validate_config, validate_nodes
from gpufair.domain.errors import InvalidInputError, NotFound, Violation
from gpufair.domain.limits import (
    MAX_VIOLATIONS_SHOWN,
    capped,
    echo,
    instant_violations,
    number_violations,
    text_violations,
)
from gpufair.domain.model import ClusterConfig, Node, Queue, frozen_map
from gpufair.domain.request_rules import object_names_violations, prune_pools_violations
from gpufair.domain.usage import UsageInputs, finite_usage


def test_numbers_must_be_finite_and_in_range() -> None:
    assert number_violations("x", 5e-324, 0.001, 64) == [
        Violation("x", "must be in [0.001, 64], got 4.94066e-324")
    ]
    assert number_violations("x", math.nan, 0, 1) == [
        Violation("x", "must be a finite number, got nan")
    ]
    assert number_violations("x", 0.0, 0.0, 1.0, lo_open=True) == [
        Violation("x", "must be in (0, 1], got 0")
    ]
    assert number_violations("x", 1.0, 0.0, 1.0, lo_open=True) == []


def test_strings_are_bounded_and_free_of_control_characters() -> None:
    assert text_violations("p", "ok") == []
    assert text_violations("p", "", required=True) == [Violation("p", "is required")]
    assert text_violations("p", "a\x00") == [Violation("p", "contains a NUL character (U+0000)")]
    assert text_violations("p", "a\u0085") == [
        Violation("p", "contains a control character (U+0085)")
    ]
    assert text_violations("p", "x" * 64, 63) == [Violation("p", "longer than 63 characters (64)")]
    assert text_violations("p", "名前 with spaces") == []


def test_instants_lie_in_1970_to_9999() -> None:
    assert instant_violations("t", 0) == []
    assert instant_violations("t", 253_402_300_799) == []
    assert len(instant_violations("t", 253_402_300_800)) == 1
    assert len(instant_violations("t", -1)) == 1


def test_error_output_is_capped_and_never_echoes_much() -> None:
    many = [Violation(f"queues[{i}].parent", "too deep " + "!" * 500) for i in range(984)]
    shown = capped(many)
    assert len(shown) == MAX_VIOLATIONS_SHOWN + 1
    assert all(len(v.message) <= 240 for v in shown)
    assert shown[-1] == Violation(
        f"queues[{MAX_VIOLATIONS_SHOWN}].parent",
        f"and {984 - MAX_VIOLATIONS_SHOWN} more violations like the above",
    )
    assert len(str(InvalidInputError(many))) <= 1_000
    assert (
        str(NotFound("queue", "q" * 1_000_000))
        == f"queue '{'q' * 78}… (1000000 characters) not found"
    )
    assert echo("short") == "'short'"


def lines_run(call: Callable[[], object]) -> int:
    """Python lines executed by `call()`: a count of work that the machine's load cannot move."""
    count = 0

    def trace(frame: FrameType, event: str, arg: object) -> Callable[..., object]:
        nonlocal count
        if event == "line":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
    return count


def chain_of(n: int) -> ClusterConfig:
    return ClusterConfig(queues=tuple(Queue(f"q{i}", f"q{i - 1}" if i else None) for i in range(n)))


def test_depth_check_is_linear_in_the_number_of_queues() -> None:
    violations = validate_config(chain_of(50_000))
    too_deep = [v for v in violations if "deeper than" in v.message]
    assert len(too_deep) == 50_000 - 16
    assert too_deep[0] == Violation("queues[16].parent", "queue tree deeper than 16 levels (17)")
    # Four times the chain, about four times the work (a depth walk per queue would be 16x).
    small, large = (chain_of(n) for n in (2_000, 8_000))
    ratio = lines_run(lambda: validate_config(large)) / lines_run(lambda: validate_config(small))
    assert 3.5 < ratio < 4.5


def test_validators_for_the_node_rpcs() -> None:
    nodes = (
        Node("n1", "main", "a100", 8, 64_000, 512_000, labels=frozen_map({"rack": "r\x00"})),
        Node("n1", "ghost", "a100", 2000, 64_000, 512_000),
    )
    assert validate_nodes(nodes, {"a100"}, {"main"}) == [
        Violation("nodes[1].name", "duplicate name 'n1'"),
        Violation("nodes[0].labels[rack]", "contains a NUL character (U+0000)"),
        Violation("nodes[1].pool", "unknown pool 'ghost'"),
        Violation("nodes[1].gpu_count", "must be in [0, 1024], got 2000"),
    ]
    assert prune_pools_violations(["main", "", "p" * 64]) == [
        Violation("prune_pools[1]", "is required"),
        Violation("prune_pools[2]", "longer than 63 characters (64)"),
    ]
    assert object_names_violations("names", "node", []) == [
        Violation("names", "name at least one node")
    ]
    assert object_names_violations("names", "node", ["n1", "n\x002"]) == [
        Violation("names[1]", "contains a NUL character (U+0000)")
    ]


def test_usage_that_is_not_finite_counts_as_no_history() -> None:
    usage = UsageInputs(
        usage_cu_s={"a": 10.0, "b": math.inf},
        group_capacity_cu_s={None: math.inf, "dept": 5.0},
    )
    cleaned, dropped = finite_usage(usage)
    assert dict(cleaned.usage_cu_s) == {"a": 10.0}
    assert dict(cleaned.group_capacity_cu_s) == {"dept": 5.0}
    assert dropped == [
        "decayed usage not finite, treated as no history: usage_cu_s['b'] = inf, "
        "group_capacity_cu_s[None] = inf"
    ]
    assert finite_usage(cleaned) == (cleaned, [])
