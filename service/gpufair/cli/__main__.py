"""`python -m gpufair.cli`: the `gpufair` command."""

import sys

from gpufair.cli.main import main

sys.exit(main())
