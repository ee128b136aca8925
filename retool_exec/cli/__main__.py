"""``python -m retool_exec.cli``."""

import sys

from retool_exec.cli import main

sys.exit(main())
