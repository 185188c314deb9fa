"""Fleet tooling around the library, not part of its core: ``agentstate demo`` (a fleet of worker
processes with a crash and a freeze, :mod:`.demo`), its CLI commands (:mod:`.cli`) and the private
Redis it and the examples start (:mod:`.embedded`, also importable as ``redis_agentstate.embedded``).

The stores never import from here.
"""
