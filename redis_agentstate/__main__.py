"""``python -m redis_agentstate``: the ``agentstate`` command line (see :mod:`redis_agentstate.cli`)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
