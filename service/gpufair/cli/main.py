"""The `gpufair` command: serve | migrate | database-url | apply | get (config, workloads) |
submit | cancel | delete | drain | undrain | explain | report | token | completion | simulate |
convert. Each command lives in a module of its own (`cli/serve.py`, `cli/config_commands.py`,
...) that registers it here; `main` turns what they raise into one line of error and an exit
code.

Every read takes `-o table|json|yaml`; every option's help shows its default; each `serve`
option `--foo-bar` may come from `$GPUFAIR_FOO_BAR` instead (cli/options.py)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence

import grpc

from gpufair import __version__
from gpufair.cli.auth import AuthSetupError, add_token_commands
from gpufair.cli.cancel import add_cancel_command
from gpufair.cli.client_options import add_client_options
from gpufair.cli.config_commands import add_config_commands
from gpufair.cli.convert import add_convert_command
from gpufair.cli.database_commands import (
    NoEmbeddedServer,
    add_database_commands,
    add_database_options,
)
from gpufair.cli.database_errors import DatabaseUrlError, describe
from gpufair.cli.drain import add_drain_commands
from gpufair.cli.options import completion_script, env_defaults, use_help_formatter
from gpufair.cli.report import NoDefaultPool, add_report_commands
from gpufair.cli.serve import add_serve_command
from gpufair.cli.slurm_bridge import add_slurm_bridge_command
from gpufair.cli.submit import add_submit_command
from gpufair.cli.workload_commands import add_workload_commands
from gpufair.client import field_violations
from gpufair.config_file import ConfigFileError
from gpufair.sim.command import add_simulate_command

ENV_PREFIX = "GPUFAIR_"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufair", description="Time-aware fair-share scheduling for shared GPU clusters."
    )
    parser.add_argument("--version", action="version", version=f"gpufair {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_simulate_command(sub)
    serve = add_serve_command(sub)
    add_database_commands(sub)
    add_token_commands(sub, add_database_options)

    get_sub = sub.add_parser("get", help="show stored state").add_subparsers(
        dest="what", required=True, metavar="WHAT"
    )
    add_config_commands(sub, get_sub)
    add_workload_commands(sub, get_sub)
    add_report_commands(sub, add_client_options)
    add_slurm_bridge_command(sub, add_client_options)
    add_submit_command(sub, add_client_options)
    add_cancel_command(sub, add_client_options)
    add_drain_commands(sub, add_client_options)
    add_convert_command(sub)

    completion = sub.add_parser("completion", help="print a shell completion script")
    completion.add_argument("shell", choices=["bash", "zsh"])
    completion.set_defaults(func=lambda args: _print_completion(parser, args.shell))

    # Last, so that every serve option, wherever it was added, gets its variable.
    env_defaults(serve, ENV_PREFIX)
    use_help_formatter(parser)
    return parser


def _print_completion(parser: argparse.ArgumentParser, shell: str) -> int:
    print(completion_script(parser, shell), end="")
    return 0


def _describe_rpc_error(exc: grpc.RpcError) -> str:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"cannot reach gpufair or its database: {details}"
    lines = [f"{code.name if code else 'error'}: {details}"]
    lines += [f"  - {f}: {d}" for f, d in field_violations(exc)]
    return "\n".join(lines)


def _stdout_closed() -> int:
    """What reads the output went away (`gpufair get workloads -o json | head`): stop quietly,
    as a program SIGPIPE ended does. Standard output now writes nowhere, so the interpreter's
    own flush at exit finds nothing to complain of."""
    # ValueError: no file descriptor behind sys.stdout (a test's capture); nothing to redirect.
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        code = func(args)
        sys.stdout.flush()  # a closed pipe fails here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        return _stdout_closed()
    except (
        NoEmbeddedServer,
        ConfigFileError,
        AuthSetupError,
        NoDefaultPool,
        DatabaseUrlError,
    ) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:
        print(f"error: {_describe_rpc_error(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # The store is imported only by the commands that use it, so its exception is looked
        # up, not imported: other commands start without SQLAlchemy.
        database = sys.modules.get("gpufair.store.database")
        if database is not None and isinstance(exc, database.EmbeddedUnavailable):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        unreachable = describe(exc)
        if unreachable is not None:
            print(f"error: {unreachable}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
