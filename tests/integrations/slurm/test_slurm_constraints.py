"""`--constraint` expressions in gpufair's terms (constraints.py), checked exhaustively: every
OR of the names of a small table, and every AND or mix of ANDs, ORs and parentheses of up to
three names (and a sample of four), with and without a GRES type, against what Slurm would accept
(a node carries a feature iff its GPU type meets the feature's rule; Slurm reads the expression
from left to right) and what gpufair's own placement filter then admits. No Slurm needed."""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import replace
from itertools import combinations, permutations, product
from typing import Any

import pytest
from test_slurm_mapping import CONFIG, job

from gpufair.api.convert_workload import workload_from_proto
from gpufair.domain.model import GpuType
from gpufair.domain.placement_ask import adequate_types
from gpufair.integrations.slurm.bridge import Bridge, CycleReport
from gpufair.integrations.slurm.config import FeatureRule
from gpufair.integrations.slurm.constraints import GpuChoice, gpu_choice
from gpufair.integrations.slurm.mapping import Unmappable, map_job
from gpufair.integrations.slurm.slurmctl import SlurmCtl
from gpufair.v1 import cluster_pb2

# gpufair's GPU types: (memory GiB, CU). h100-94gb is declared but the bridge maps no GRES to it.
GPUFAIR_TYPES = {
    "a100-80gb": (80.0, 10.0),
    "l40s-48gb": (48.0, 6.0),
    "rtx4090-24gb": (24.0, 2.0),
    "h100-94gb": (94.0, 16.0),
}
MEMORY = {name: memory for name, (memory, _) in GPUFAIR_TYPES.items()}
DOMAIN_TYPES = {name: GpuType(name, m, cu) for name, (m, cu) in GPUFAIR_TYPES.items()}
TABLE = replace(
    CONFIG,
    gpu_types={"a100": "a100-80gb", "l40s": "l40s-48gb", "rtx4090": "rtx4090-24gb"},
    features={
        "gpumem24": FeatureRule(min_gpu_memory_gib=24),
        "gpumem40": FeatureRule(min_gpu_memory_gib=40),
        "gpumem80": FeatureRule(min_gpu_memory_gib=80),
        "gpumem96": FeatureRule(min_gpu_memory_gib=96),
        "fast": FeatureRule(gpu_types=("a100-80gb", "l40s-48gb")),
        "bigfast": FeatureRule(gpu_types=("a100-80gb", "l40s-48gb"), min_gpu_memory_gib=64),
        "h100": FeatureRule(gpu_types=("h100-94gb",)),
    },
)
NAMES = sorted([*TABLE.gpu_types, *TABLE.features])
NODE_TYPES = sorted(TABLE.gpu_types.values())  # the types of the bridge's nodes


def slurm_features(gpu_type: str) -> set[str]:
    """The features a node of `gpu_type` carries in Slurm: its GRES type's name, and every rule
    its GPUs meet (the contract the bridge's `features` describe)."""
    names = {gres for gres, t in TABLE.gpu_types.items() if t == gpu_type}
    for name, rule in TABLE.features.items():
        typed = not rule.gpu_types or gpu_type in rule.gpu_types
        if typed and MEMORY[gpu_type] >= rule.min_gpu_memory_gib:
            names.add(name)
    return names


def slurm_accepts(alternatives: tuple[str, ...], gres: str) -> set[str]:
    """The node types Slurm would run the job on: a node with any of the features (and of the
    GRES type, when the job names one)."""
    return {
        t
        for t in NODE_TYPES
        if slurm_features(t) & set(alternatives) and (not gres or TABLE.gpu_types[gres] == t)
    }


def slurm_evaluates(expression: str, features: set[str]) -> bool:
    """Whether a node with `features` meets `expression`, read as Slurm reads it: strictly from
    left to right (no precedence of & over |), parentheses grouping, ',' as '&', and one operator
    at the very end ignored. Booleans per node, independent of the bridge's own way."""
    tokens = re.findall(r"[&|()]|[^&|()]+", expression.replace(",", "&"))
    if tokens[-1] in ("&", "|"):
        tokens.pop()
    levels: list[tuple[bool, str]] = [(True, "&")]  # per open group: value so far, next operator

    def fold(item: bool) -> None:
        value, op = levels[-1]
        levels[-1] = ((value and item) if op == "&" else (value or item), op)

    for token in tokens:
        if token == "(":
            levels.append((True, "&"))
        elif token == ")":
            fold(levels.pop()[0])
        elif token in ("&", "|"):
            levels[-1] = (levels[-1][0], token)
        else:
            fold(token in features)
    assert len(levels) == 1, expression
    return levels[0][0]


def gpufair_admits(workload: Any) -> set[str]:
    """The node types gpufair's placement filter lets the workload use."""
    return set(adequate_types(workload_from_proto(workload, 0.0), DOMAIN_TYPES, NODE_TYPES))


def every_constraint() -> list[tuple[str, ...]]:
    return [c for size in range(1, len(NAMES) + 1) for c in combinations(NAMES, size)]


@pytest.mark.parametrize("gres", ["", "a100", "l40s", "rtx4090"])
def test_every_alternative_set_admits_exactly_what_slurm_accepts(gres: str) -> None:
    forms: Counter[str] = Counter()
    asked: list[int] = []

    def memory() -> dict[str, float]:
        asked.append(1)
        return MEMORY

    tres = f"gres:gpu:{gres}:2" if gres else "gres:gpu:2"
    for names in every_constraint():
        expected = slurm_accepts(names, gres)
        for order in (names, names[::-1]):  # Slurm's OR has no order; neither has the mapping
            asked.clear()
            mapped = map_job(
                TABLE, job(tres_per_node=tres, features="|".join(order)), gpu_memory=memory
            )
            if isinstance(mapped, Unmappable):
                # Refused only where no node type would do: an empty type list would mean any.
                assert expected == set(), (order, mapped)
                assert "no GPU type the bridge maps meets" in mapped.reason or (
                    "contradicts the constraint" in mapped.reason
                ), mapped
                forms["refused"] += 1
                continue
            assert gpufair_admits(mapped) == expected, (order, gres, mapped)
            assert len(set(mapped.allowed_gpu_types)) == len(mapped.allowed_gpu_types)
            if asked:
                assert mapped.min_gpu_memory_gib == 0, mapped  # form 3: types alone
                forms["types"] += 1
            else:
                forms["no table"] += 1
    # Each way out is taken over the table: 2 x 1023 constraints.
    assert sorted(forms) == ["no table", "refused", "types"], forms
    assert sum(forms.values()) == 2 * (2 ** len(NAMES) - 1)


def and_and_mixed_expressions() -> list[str]:
    """Every expression of two names (`a&b`, `a|b`, `a,b`) and of three names with & and | in
    every order, with and without parentheses, a trailing operator, and 2000 random ones of four
    names (fixed seed)."""
    found = [f"{a}{op}{b}" for a, b in permutations(NAMES, 2) for op in "&|,"]
    for (a, b, c), (o1, o2) in product(permutations(NAMES, 3), product("&|", repeat=2)):
        found += [f"{a}{o1}{b}{o2}{c}", f"{a}{o1}({b}{o2}{c})", f"({a}{o1}{b}){o2}{c}"]
    found += [f"{a}&{b}{op}" for a, b in permutations(NAMES, 2) for op in "&|"]
    rng = random.Random(0)
    for _ in range(2000):
        names, ops = rng.sample(NAMES, 4), rng.choices("&|,", k=3)
        start = rng.randrange(4)
        end = rng.randrange(start, 4)
        parts = [f"({n}" if i == start < end else n for i, n in enumerate(names)]
        parts[end] += ")" if start < end else ""
        found.append(parts[0] + "".join(o + p for o, p in zip(ops, parts[1:], strict=True)))
    return found


@pytest.mark.parametrize("gres", ["", "a100", "l40s", "rtx4090"])
def test_every_and_or_mixed_expression_admits_exactly_what_slurm_accepts(gres: str) -> None:
    forms: Counter[str] = Counter()
    asked: list[int] = []

    def memory() -> dict[str, float]:
        asked.append(1)
        return MEMORY

    tres = f"gres:gpu:{gres}:2" if gres else "gres:gpu:2"
    expressions = and_and_mixed_expressions()
    for expression in expressions:
        expected = {
            t
            for t in NODE_TYPES
            if slurm_evaluates(expression, slurm_features(t))
            and (not gres or TABLE.gpu_types[gres] == t)
        }
        asked.clear()
        mapped = map_job(TABLE, job(tres_per_node=tres, features=expression), gpu_memory=memory)
        if isinstance(mapped, Unmappable):
            # Refused only where no node type would do: an empty type list would mean any.
            assert expected == set(), (expression, mapped)
            assert any(
                why in mapped.reason
                for why in (
                    "no GPU type the bridge maps meets",
                    "GPU types that exclude each other",
                    "contradicts the constraint",
                )
            ), (expression, mapped)
            forms["refused"] += 1
            continue
        assert gpufair_admits(mapped) == expected, (expression, gres, mapped)
        assert len(set(mapped.allowed_gpu_types)) == len(mapped.allowed_gpu_types)
        if asked:
            assert mapped.min_gpu_memory_gib == 0, mapped  # form 3: types alone
            forms["types"] += 1
        else:
            forms["no table"] += 1
    assert sorted(forms) == ["no table", "refused", "types"], forms
    assert sum(forms.values()) == len(expressions) == 11090


@pytest.mark.parametrize(
    ("features", "types", "memory_gib", "admitted"),
    [
        # A type and a memory rule: that type, with that memory (no table needed).
        ("a100&gpumem80", ["a100-80gb"], 80, {"a100-80gb"}),
        ("a100,gpumem40", ["a100-80gb"], 40, {"a100-80gb"}),  # Slurm reads ',' as '&'
        ("l40s&gpumem80", ["l40s-48gb"], 80, set()),  # no L40S has 80 GiB: gpufair refuses
        ("gpumem40&gpumem80", [], 80, {"a100-80gb"}),
        ("fast&gpumem40", ["a100-80gb", "l40s-48gb"], 40, {"a100-80gb", "l40s-48gb"}),
        ("fast&bigfast", ["a100-80gb", "l40s-48gb"], 64, {"a100-80gb"}),
        # Left to right, no precedence: `a|b&c` is `(a|b)&c`, `a&b|c` is `(a&b)|c`.
        ("rtx4090|a100&gpumem80", ["a100-80gb", "rtx4090-24gb"], 80, {"a100-80gb"}),
        ("a100&gpumem80|rtx4090", ["a100-80gb", "rtx4090-24gb"], 0, {"a100-80gb", "rtx4090-24gb"}),
        (
            "rtx4090|(a100&gpumem80)",
            ["a100-80gb", "rtx4090-24gb"],
            0,
            {"a100-80gb", "rtx4090-24gb"},
        ),
        ("gpumem80|l40s&fast", ["a100-80gb", "l40s-48gb"], 0, {"a100-80gb", "l40s-48gb"}),
        ("(a100|l40s)&gpumem40", ["a100-80gb", "l40s-48gb"], 40, {"a100-80gb", "l40s-48gb"}),
        ("a100|l40s&bigfast", ["a100-80gb", "l40s-48gb"], 64, {"a100-80gb"}),
        (
            "gpumem24&(rtx4090|l40s)",
            ["l40s-48gb", "rtx4090-24gb"],
            24,
            {"l40s-48gb", "rtx4090-24gb"},
        ),
        # An alternative of types that exclude each other adds nothing; a covered one neither.
        ("a100&rtx4090|gpumem40", [], 40, {"a100-80gb", "l40s-48gb"}),
        ("fast&rtx4090|gpumem80", [], 80, {"a100-80gb"}),
        ("a100|a100&gpumem80", ["a100-80gb"], 80, {"a100-80gb"}),  # (a100|a100)&gpumem80
        ("(a100&gpumem80)|a100", ["a100-80gb"], 0, {"a100-80gb"}),
        ("gpumem40|gpumem80&rtx4090|l40s", ["l40s-48gb"], 0, {"l40s-48gb"}),
        # Slurm ignores one operator at the very end. (h100-94gb: no bridge node has it.)
        ("a100&", ["a100-80gb"], 0, {"a100-80gb"}),
        ("h100|rtx4090&gpumem24|", ["h100-94gb", "rtx4090-24gb"], 24, {"rtx4090-24gb"}),
    ],
)
def test_ands_and_mixed_forms_map_to_exact_gpu_types(
    features: str, types: list[str], memory_gib: float, admitted: set[str]
) -> None:
    mapped = map_job(TABLE, job(features=features), gpu_memory=lambda: MEMORY)
    assert not isinstance(mapped, Unmappable), mapped
    assert (list(mapped.allowed_gpu_types), mapped.min_gpu_memory_gib) == (types, memory_gib)
    assert gpufair_admits(mapped) == admitted
    expected = {t for t in NODE_TYPES if slurm_evaluates(features, slurm_features(t))}
    assert admitted == expected


@pytest.mark.parametrize(
    ("features", "types", "memory_gib"),
    [
        # A GPU type, or any type with 40 GiB: on this table, A100 and L40S (not the RTX 4090).
        ("a100|gpumem40", ["a100-80gb", "l40s-48gb"], 0),
        ("rtx4090|gpumem80", ["a100-80gb", "rtx4090-24gb"], 0),
        ("rtx4090|gpumem40", ["a100-80gb", "l40s-48gb", "rtx4090-24gb"], 0),
        # Types under different memory rules: the 64 GiB rule keeps the L40S out.
        ("bigfast|rtx4090", ["a100-80gb", "rtx4090-24gb"], 0),
        ("fast|gpumem80", ["a100-80gb", "l40s-48gb"], 0),
        # A type no bridge node has (declared or not) adds nothing.
        ("h100|gpumem80", ["a100-80gb"], 0),
        # No table needed: memory alone, or typed rules that ask at least that much.
        ("gpumem80|gpumem40", [], 40),
        ("bigfast|gpumem40", [], 40),
        ("fast|l40s", ["a100-80gb", "l40s-48gb"], 0),
    ],
)
def test_alternatives_map_to_gpu_types(features: str, types: list[str], memory_gib: float) -> None:
    mapped = map_job(TABLE, job(features=features), gpu_memory=lambda: MEMORY)
    assert not isinstance(mapped, Unmappable), mapped
    assert (list(mapped.allowed_gpu_types), mapped.min_gpu_memory_gib) == (types, memory_gib)


@pytest.mark.parametrize(
    ("features", "memory", "reason"),
    [
        (
            "h100|gpumem96",
            MEMORY,
            "constraint 'h100|gpumem96': no GPU type the bridge maps meets any alternative "
            "(gpufair's types: a100-80gb 80 GiB, l40s-48gb 48 GiB, rtx4090-24gb 24 GiB)",
        ),
        (
            "a100|gpumem40",
            {"h100-94gb": 94.0},
            "constraint 'a100|gpumem40': no GPU type the bridge maps meets any alternative "
            "(gpufair's types: none declared)",
        ),
        (
            "a100&rtx4090",
            MEMORY,
            "constraint 'a100&rtx4090': no GPU type meets it: each alternative asks for GPU "
            "types that exclude each other",
        ),
        (
            "(a100|l40s)&rtx4090",
            MEMORY,
            "constraint '(a100|l40s)&rtx4090': no GPU type meets it: each alternative asks for "
            "GPU types that exclude each other",
        ),
        (
            "[a100|l40s]",
            MEMORY,
            "constraint '[a100|l40s]': brackets are not supported: they ask for one alternative "
            "shared by all the job's nodes or a count of nodes per feature, and a workload asks "
            "the same GPUs of every pod",
        ),
        (
            "[a100*2&l40s*2]",
            MEMORY,
            "constraint '[a100*2&l40s*2]': brackets are not supported: they ask for one "
            "alternative shared by all the job's nodes or a count of nodes per feature, and a "
            "workload asks the same GPUs of every pod",
        ),
        (
            "a100*2",
            MEMORY,
            "constraint 'a100*2': node counts ('*N') are not supported: they ask for a mix of "
            "nodes, and a workload asks the same GPUs of every pod",
        ),
        (
            "(a100&gpumem40)*2",
            MEMORY,
            "constraint '(a100&gpumem40)*2': node counts ('*N') are not supported: they ask for "
            "a mix of nodes, and a workload asks the same GPUs of every pod",
        ),
        # Non-GPU node features: refused, alone, in an OR and in an AND.
        ("a100|ib", MEMORY, "constraint 'ib' is not in the bridge's features or gpu_types"),
        ("ib&a100", MEMORY, "constraint 'ib' is not in the bridge's features or gpu_types"),
        # What Slurm itself does not parse.
        (
            "a100&(l40s|(rtx4090))",
            MEMORY,
            "constraint 'a100&(l40s|(rtx4090))': not a constraint the bridge can read "
            "(nested parentheses)",
        ),
        (
            "a100||l40s",
            MEMORY,
            "constraint 'a100||l40s': not a constraint the bridge can read "
            "('|' where a feature name belongs)",
        ),
        (
            "(a100|l40s",
            MEMORY,
            "constraint '(a100|l40s': not a constraint the bridge can read ('(' without ')')",
        ),
        (
            "(a100|l40s)rtx4090",
            MEMORY,
            "constraint '(a100|l40s)rtx4090': not a constraint the bridge can read "
            "('rtx4090' where an operator belongs)",
        ),
        (
            "a100)&l40s",
            MEMORY,
            "constraint 'a100)&l40s': not a constraint the bridge can read (')' without '(')",
        ),
    ],
)
def test_what_still_cannot_be_said_is_refused_with_why(
    features: str, memory: dict[str, float], reason: str
) -> None:
    assert map_job(TABLE, job(features=features), gpu_memory=lambda: memory) == Unmappable(reason)


def test_the_table_is_asked_only_when_needed_and_a_missing_one_is_refused() -> None:
    def no_table() -> dict[str, float]:
        raise AssertionError("asked for GPU memory")

    assert gpu_choice(TABLE, "gpumem40|gpumem80", no_table) == GpuChoice(frozenset(), 40.0)
    assert gpu_choice(TABLE, "a100|l40s", no_table) == GpuChoice(
        frozenset({"a100-80gb", "l40s-48gb"}), 0.0
    )
    assert gpu_choice(TABLE, "", no_table) == GpuChoice()
    assert gpu_choice(TABLE, "a100|gpumem40", None) == (
        "constraint 'a100|gpumem40': the GPU memory of each GPU type is not known"
    )


class ConfigClient:
    """GetConfig only, counted."""

    def __init__(self) -> None:
        self.reads = 0

    def get_config(self) -> cluster_pb2.GetConfigResponse:
        self.reads += 1
        types = [cluster_pb2.GpuType(name=n, memory_gib=m) for n, m in MEMORY.items()]
        return cluster_pb2.GetConfigResponse(config=cluster_pb2.ClusterConfig(gpu_types=types))


def test_bridge_reads_gpufairs_gpu_types_only_when_needed_and_once() -> None:
    client = ConfigClient()
    bridge = Bridge(TABLE, client, SlurmCtl())  # type: ignore[arg-type]
    to_submit: list[Any] = []
    report = CycleReport()
    simple, mixed = ["gpumem40", "a100"], ["a100|gpumem40", "rtx4090|gpumem80"]
    for job_id, features in enumerate(simple + mixed):
        bridge._reconciler._map(
            job(job_id=job_id, features=features), f"slurm-{job_id}", to_submit, report
        )
        assert client.reads == (0 if features in simple else 1)
    assert report.unmappable == {}
    assert [list(w.allowed_gpu_types) for _, w in to_submit] == [
        [],
        ["a100-80gb"],
        ["a100-80gb", "l40s-48gb"],
        ["a100-80gb", "rtx4090-24gb"],
    ]
