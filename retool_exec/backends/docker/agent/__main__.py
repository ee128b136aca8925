"""``python3 -I -B agent.pyz``: the container's PID 1."""

import sys

PYTHONS_OWN = frozenset(sys.modules)
"""What python3 has imported before the agent's first import (for ``zygote.Setup``)."""

from . import zygote  # noqa: E402 - after the count above

zygote.Setup.pythons_own = PYTHONS_OWN

from .supervisor import main  # noqa: E402

sys.exit(main(sys.argv))
