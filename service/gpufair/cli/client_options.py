"""What every command that calls a gpufair server shares: `--address`, `--timeout-s` and the
credentials' options (`cli/auth.py`), and `connect`, the client they describe."""

from __future__ import annotations

import argparse
import math
import os

from gpufair.cli.auth import add_auth_client_options, client_auth_kwargs
from gpufair.client import DEFAULT_ADDRESS, GpufairClient

ADDRESS_ENV = "GPUFAIR_ADDRESS"
# A day: far beyond any call's need, and well inside what gRPC can take as a deadline (past
# about 2^31 s it overflows into one already past).
MAX_CALL_TIMEOUT_S = 86400.0


def add_client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--address",
        default=os.environ.get(ADDRESS_ENV, DEFAULT_ADDRESS),
        help=f"gpufair server (default ${ADDRESS_ENV} or {DEFAULT_ADDRESS})",
    )
    p.add_argument(
        "--timeout-s", type=call_timeout_s, default=30.0, help="deadline per call, in seconds"
    )
    add_auth_client_options(p)


def call_timeout_s(value: str) -> float:
    """--timeout-s: gRPC takes 0, a negative, NaN or an overflowing deadline as one already past,
    and the call would fail with DEADLINE_EXCEEDED as if the server were slow."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_CALL_TIMEOUT_S:  # NaN fails both
        raise argparse.ArgumentTypeError(f"{value!r}: give seconds in (0, {MAX_CALL_TIMEOUT_S:g}]")
    return seconds


def connect(args: argparse.Namespace) -> GpufairClient:
    """The client the options of `add_client_options` describe (used as a context manager)."""
    return GpufairClient(args.address, timeout_s=args.timeout_s, **client_auth_kwargs(args))
