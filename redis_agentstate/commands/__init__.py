"""What the ``agentstate`` commands share (``common``) and the views they draw (``stats_view``).

The command line itself is :mod:`redis_agentstate.cli`; each integration adds its own
commands (``fleet/cli.py``, ``langgraph/cli.py``, ``server/cli.py``) on these helpers.
"""
