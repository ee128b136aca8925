"""``python3 -I -B agent.pyz``: the container's PID 1."""

import sys

from .supervisor import main

sys.exit(main(sys.argv))
