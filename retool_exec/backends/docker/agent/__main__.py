"""``python3 -m agent`` by hand: not the container's PID 1 (``image_inputs.AGENT_LAUNCHER``).

Started so, python3's modules are not known (``runpy`` imported more), and no module
the zygote holds gives way to a call's upload (``zygote.Setup.pythons_own``)."""

import sys

from .supervisor import main

sys.exit(main(sys.argv))
