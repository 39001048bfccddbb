"""`python -m loop_guard demo`."""

import sys

from loop_guard.cli import main

sys.exit(main())
