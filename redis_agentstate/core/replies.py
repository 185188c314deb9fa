"""Reading raw replies, for every core: the low floor a data path reaches down to.

A reply comes as redis-py parsed it (``decode_responses=False``: bytes) or, inside a pipeline or
from a script, as raw bytes and ints; these helpers read both the same way.
"""

from __future__ import annotations

from typing import Any

__all__ = ["lenient_text", "text", "time_ms"]


def text(value: Any) -> str:
    """A bytes reply as str (UTF-8: what the library writes; anything else raises), else ``str``."""
    return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value)


def lenient_text(value: Any) -> str:
    """As :func:`text`, with bytes that are not UTF-8 replaced: for what a person reads (an
    operator's view, an error naming a key this library did not write)."""
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def time_ms(reply: Any) -> int:
    """``TIME`` as parsed by redis-py (a pair of ints) or raw (two byte strings), in ms."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000
