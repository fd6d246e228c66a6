"""`python -m vlaperf ...`: the `vlaperf` command, for an environment whose scripts folder is not on PATH."""

import sys

from vlaperf.cli import main

sys.exit(main())
