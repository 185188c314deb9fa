"""Fault injection for the test suite: a TCP proxy between clients and Redis."""

from .proxy import FaultProxy

__all__ = ["FaultProxy"]
