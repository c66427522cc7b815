"""`gpufair convert kai-queues FILE...`: KAI-Scheduler Queue objects to a gpufair cluster file.

The conversion is `integrations/kai_queues.py`; the file written is checked the way `gpufair
apply` will check it (shape and every config rule), so what it prints can be applied as is once
nodes are added.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from gpufair.api.convert_cluster import config_from_proto
from gpufair.cli.options import SubCommands
from gpufair.config_file import ConfigFileError, parse_config
from gpufair.domain.config_rules import validate_config
from gpufair.integrations.kai_queues import (
    KaiConversion,
    KaiQueueError,
    cluster_file,
    queues_from_yaml,
)


def add_convert_command(sub: SubCommands) -> None:
    """Register `convert kai-queues` on the subcommands of `gpufair`."""
    convert = sub.add_parser("convert", help="convert another scheduler's config to gpufair's")
    what = convert.add_subparsers(dest="source", required=True, metavar="SOURCE")
    kai = what.add_parser(
        "kai-queues",
        help="KAI-Scheduler Queue YAML (scheduling.run.ai/v2) to a cluster file",
        description="Write a cluster file whose pool divides GPUs by KAI-Scheduler's rules "
        "(division: kai, usage_basis: total, rounding: whole_gpus); see "
        "docs/kai-compatibility.md.",
    )
    kai.add_argument("files", nargs="+", type=Path, help="YAML files of Queue objects ('-': stdin)")
    kai.add_argument("--pool", default="default", help="the pool the quotas are for")
    kai.add_argument("--gpu-type", default="gpu", help="the pool's GPU type name")
    kai.add_argument("--compute-weight", type=float, default=1.0, help="CU of one GPU")
    kai.add_argument("--memory-gib", type=float, default=80.0, help="memory of one GPU")
    kai.add_argument(
        "--pool-gpus", type=float, default=None, help="the pool's GPUs: needed for quota -1"
    )
    kai.add_argument("--output", "-O", type=Path, default=None, help="write here, not stdout")
    kai.set_defaults(func=cmd_convert_kai_queues)


def cmd_convert_kai_queues(args: argparse.Namespace) -> int:
    texts = [
        ("stdin", sys.stdin.read()) if str(f) == "-" else (str(f), _read(f)) for f in args.files
    ]
    options = KaiConversion(
        pool=args.pool,
        gpu_type=args.gpu_type,
        compute_weight=args.compute_weight,
        memory_gib=args.memory_gib,
        pool_gpus=args.pool_gpus,
    )
    try:
        data = cluster_file(queues_from_yaml(texts), options)
    except KaiQueueError as exc:
        raise ConfigFileError(str(exc)) from exc
    config, violations = config_from_proto(parse_config(data, "converted queues"))
    violations = violations or validate_config(config)
    if violations:
        listed = "\n".join(f"  - {v.field_path}: {v.message}" for v in violations)
        raise ConfigFileError(f"the converted config would be refused:\n{listed}")
    text = yaml.safe_dump(data, sort_keys=False)
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text)
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise ConfigFileError(f"{path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigFileError(f"{path}: not UTF-8 text ({exc.reason})") from exc
