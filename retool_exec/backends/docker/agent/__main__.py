"""``python3 -I -B agent.pyz``: the container's PID 1."""

import sys

PYTHONS_OWN = frozenset(sys.modules)  # before the agent's first import (``main``)

from .supervisor import main  # noqa: E402

sys.exit(main(sys.argv, PYTHONS_OWN))
