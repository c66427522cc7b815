"""The `gpufair` command line: `main` (the commands) with `auth` (serve and client options for
TLS and tokens, `gpufair token`) and `report` (`gpufair report`)."""

from gpufair.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
