"""A private Redis for demos, examples and local runs (see :mod:`redis_agentstate.fleet.embedded`).

This import path is the documented one (README, guides, examples); the code
lives with the rest of the fleet tooling in :mod:`redis_agentstate.fleet`,
apart from the library core.
"""

from __future__ import annotations

from .fleet.embedded import KINDS, EmbeddedServer, EmbeddedUnavailable, env_or_private_url, start_embedded

__all__ = ["KINDS", "EmbeddedServer", "EmbeddedUnavailable", "env_or_private_url", "start_embedded"]
