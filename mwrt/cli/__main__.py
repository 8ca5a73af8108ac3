"""`python -m mwrt.cli`: the `mwrt` command where its script is not on PATH."""

import sys

from . import main

sys.exit(main())
