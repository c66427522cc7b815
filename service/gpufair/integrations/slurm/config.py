"""The Slurm bridge's mapping file: which Slurm things mean which gpufair things.

    partitions:            # Slurm partition -> gpufair node pool (unlisted partitions are ignored)
      gpu: gpu
    accounts:              # Slurm account -> gpufair leaf queue
      vision: vision
    default_queue: ""      # queue of accounts not listed; empty = such jobs stay held, with a reason
    gpu_types:             # Slurm GRES type -> gpufair GPU type
      a100: a100-80gb
      rtx4090: rtx4090-24gb
    features:              # optional: a node feature a job may ask for with --constraint
      gpumem40: {min_gpu_memory_gib: 40}
      a100: {gpu_types: [a100-80gb]}
    non_preemptible_qos: [inference]
    uid_prefix: slurm-     # workload uid = prefix + Slurm job id
    cycle_s: 5             # one bridge cycle per this many seconds (a duration: 5s, 1m)
    heartbeat_s: 60        # how often a running job's heartbeat is sent
    slurm_bin: ""          # folder of the Slurm commands; empty = PATH

Every mistake in the file is reported at once, each with its field path, before anything runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufair.config_file import ConfigFileError, parse_duration_s

_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_KNOWN_KEYS = {
    "partitions",
    "accounts",
    "default_queue",
    "gpu_types",
    "features",
    "non_preemptible_qos",
    "uid_prefix",
    "cycle_s",
    "heartbeat_s",
    "slurm_bin",
}


@dataclass(frozen=True)
class FeatureRule:
    """What asking for a node feature (`--constraint=NAME`) means to gpufair."""

    gpu_types: tuple[str, ...] = ()
    min_gpu_memory_gib: float = 0.0


@dataclass(frozen=True)
class BridgeConfig:
    partitions: dict[str, str]
    gpu_types: dict[str, str]
    accounts: dict[str, str] = field(default_factory=dict)
    default_queue: str = ""
    features: dict[str, FeatureRule] = field(default_factory=dict)
    non_preemptible_qos: frozenset[str] = frozenset()
    uid_prefix: str = "slurm-"
    cycle_s: float = 5.0
    heartbeat_s: float = 60.0
    slurm_bin: str = ""

    @property
    def pools(self) -> list[str]:
        return sorted(set(self.partitions.values()))

    def queue_of(self, account: str) -> str:
        return self.accounts.get(account, self.default_queue)


def _names_map(data: Any, path: str, errors: list[str], *, required: bool) -> dict[str, str]:
    if data is None:
        if required:
            errors.append(f"{path}: required (a mapping of names)")
        return {}
    if not isinstance(data, dict) or (not data and required):
        errors.append(f"{path}: expected a non-empty mapping of names")
        return {}
    out: dict[str, str] = {}
    for key, value in data.items():
        if not isinstance(value, str) or not _NAME_RE.match(value) or not _NAME_RE.match(str(key)):
            errors.append(f"{path}.{key}: expected a name ([A-Za-z0-9._-]), got {value!r}")
            continue
        out[str(key)] = value
    return out


def _positive_s(data: Any, path: str, default: float, errors: list[str]) -> float:
    if data is None:
        return default
    try:
        value = parse_duration_s(data, path)
    except ConfigFileError as exc:
        errors.append(str(exc))
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        errors.append(f"{path}: expected a positive duration, got {data!r}")
        return default
    return float(value)


def _features(data: Any, errors: list[str]) -> dict[str, FeatureRule]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        errors.append("features: expected a mapping of feature -> {gpu_types, min_gpu_memory_gib}")
        return {}
    out: dict[str, FeatureRule] = {}
    for name, rule in data.items():
        path = f"features.{name}"
        if (
            not isinstance(rule, dict)
            or set(rule) - {"gpu_types", "min_gpu_memory_gib"}
            or not rule
        ):
            errors.append(f"{path}: expected gpu_types and/or min_gpu_memory_gib")
            continue
        types = rule.get("gpu_types", [])
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            errors.append(f"{path}.gpu_types: expected a list of gpufair GPU type names")
            types = []
        memory = rule.get("min_gpu_memory_gib", 0.0)
        if isinstance(memory, bool) or not isinstance(memory, int | float) or memory < 0:
            errors.append(f"{path}.min_gpu_memory_gib: expected a number >= 0, got {memory!r}")
            memory = 0.0
        out[str(name)] = FeatureRule(tuple(types), float(memory))
    return out


def parse_config(data: Any) -> BridgeConfig:
    """A validated config from parsed YAML; ConfigFileError lists every problem."""
    if not isinstance(data, dict):
        raise ConfigFileError("the mapping file: expected a mapping at the top")
    errors = [f"{key}: unknown field" for key in data if key not in _KNOWN_KEYS]
    partitions = _names_map(data.get("partitions"), "partitions", errors, required=True)
    gpu_types = _names_map(data.get("gpu_types"), "gpu_types", errors, required=True)
    accounts = _names_map(data.get("accounts"), "accounts", errors, required=False)
    default_queue = data.get("default_queue", "") or ""
    if not isinstance(default_queue, str):
        errors.append(f"default_queue: expected a queue name, got {default_queue!r}")
        default_queue = ""
    qos = data.get("non_preemptible_qos", []) or []
    if not isinstance(qos, list) or not all(isinstance(q, str) for q in qos):
        errors.append("non_preemptible_qos: expected a list of QOS names")
        qos = []
    prefix = data.get("uid_prefix", "slurm-")
    if not isinstance(prefix, str) or (prefix and not _NAME_RE.match(prefix)):
        errors.append(f"uid_prefix: expected [A-Za-z0-9._-]*, got {prefix!r}")
        prefix = "slurm-"
    slurm_bin = data.get("slurm_bin", "") or ""
    if not isinstance(slurm_bin, str):
        errors.append("slurm_bin: expected a folder")
        slurm_bin = ""
    config = BridgeConfig(
        partitions=partitions,
        gpu_types=gpu_types,
        accounts=accounts,
        default_queue=default_queue,
        features=_features(data.get("features"), errors),
        non_preemptible_qos=frozenset(qos),
        uid_prefix=prefix,
        cycle_s=_positive_s(data.get("cycle_s"), "cycle_s", 5.0, errors),
        heartbeat_s=_positive_s(data.get("heartbeat_s"), "heartbeat_s", 60.0, errors),
        slurm_bin=slurm_bin,
    )
    if errors:
        raise ConfigFileError("the mapping file is invalid:\n  - " + "\n  - ".join(errors))
    return config


def load_config(path: str | Path) -> BridgeConfig:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"{path}: not valid YAML: {exc}") from exc
    try:
        return parse_config(data)
    except ConfigFileError as exc:
        raise ConfigFileError(f"{path}: {exc}") from exc
