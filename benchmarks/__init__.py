"""Benchmarks of redis_agentstate, side by side with the alternatives and the floor Redis sets.

Run ``python -m benchmarks`` (see ``benchmarks/README.md``).
"""
