"""The `gpufair` command line: `main` (the commands) with `auth` (serve and client options for
TLS and tokens, `gpufair token`), `report` (`gpufair report`), `submit` (`gpufair submit`),
`cancel` (`gpufair cancel`), `drain` (`gpufair drain`, `gpufair undrain`) and `options` (output
formats, defaults in help, `serve` settings from `GPUFAIR_*`, completion)."""

from gpufair.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
