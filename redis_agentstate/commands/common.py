"""What the ``agentstate`` commands share: the one-line error, JSON output, terminal escaping,
argument types and the parser that reports usage errors in one line.

Below both :mod:`redis_agentstate.cli` and :mod:`redis_agentstate.fleet.cli`, which import it
(and not each other's helpers), so the CLI has no import circle.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
from dataclasses import fields, is_dataclass
from enum import Enum
from typing import Any, NoReturn

from ..errors import InvalidArgument
from ..keys import validate_namespace

__all__ = ["CliError", "Parser", "dump", "esc", "jsonable", "namespace_arg", "positive", "whole"]


class CliError(Exception):
    """An error the CLI reports as one line and exit status 1 (never a traceback).

    ``kind`` is the ``type`` of the ``--json`` error object.
    """

    def __init__(self, message: str, kind: str = "CliError") -> None:
        super().__init__(message)
        self.kind = kind


def jsonable(value: Any) -> Any:
    """``value`` as JSON-ready data: enums by value, bytes as text (or ``{"$base64": ...}``), dataclasses as dicts."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"$base64": base64.b64encode(value).decode()}
    if is_dataclass(value) and not isinstance(value, type):
        # Field by field, not dataclasses.asdict: its deep copy recursed on its own, past what Python
        # 3.12 allows a 1,024-level value (a RecursionError in isinstance), whatever the limit here.
        return {f.name: jsonable(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {str(jsonable(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


#: Python frames ``dump`` may need beyond the caller's: a stored value nests up to 1,024 levels (the
#: codec refuses more), and jsonable and the encoder each take one per level.
_DUMP_FRAMES = 3 * 1024 + 100


def dump(value: Any) -> str:
    """``value`` as one line of JSON (exact: no escaping beyond JSON's own)."""
    try:
        return json.dumps(jsonable(value), ensure_ascii=False)
    except RecursionError:
        pass
    # Nested past the default recursion limit (about 500 levels here): a value the store took and gives
    # back, so `show` must print it, not fail with a RecursionError. Raised for this call only.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + _DUMP_FRAMES)
    try:
        return json.dumps(jsonable(value), ensure_ascii=False)
    except RecursionError:
        raise CliError("a value is nested too deeply to print as JSON", "TooDeep") from None
    finally:
        sys.setrecursionlimit(limit)


#: C0/C1 controls and DEL, line/paragraph separators, and the bidi overrides and isolates
#: that reorder what a terminal shows.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _esc_char(m: re.Match[str]) -> str:
    c = m.group()
    return _SHORT.get(c) or (f"\\x{ord(c):02x}" if ord(c) <= 0xFF else f"\\u{ord(c):04x}")


def esc(value: object) -> str:
    """``value`` as text safe to print to a terminal: control characters escaped, one line."""
    return _UNSAFE.sub(_esc_char, str(value))


#: A whole number on the command line: ASCII digits. int() also takes '+5', ' 5', '5_000' and other
#: scripts' digits (Arabic-Indic ones), and raises ValueError for '²' (isdigit() but no decimal) or 5,000 digits.
_WHOLE = re.compile(r"[0-9]+")
#: More digits than any count or size the commands take (a limit, shards, a port, a cursor).
_WHOLE_MAX_DIGITS = 19


def whole(value: str) -> int:
    """argparse type: an integer >= 0, written in ASCII digits only."""
    if not _WHOLE.fullmatch(value):
        raise argparse.ArgumentTypeError(f"not a whole number (ASCII digits 0-9): {value!r}")
    if len(value) > _WHOLE_MAX_DIGITS:
        raise argparse.ArgumentTypeError(f"too large: a number of {len(value)} digits")
    return int(value)


def positive(value: str) -> int:
    """argparse type: an integer >= 1, written in ASCII digits only."""
    n = whole(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def namespace_arg(value: str) -> str:
    """argparse type: a namespace the stores accept; ``''`` is refused, never read as the default."""
    try:
        return validate_namespace(value)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class Parser(argparse.ArgumentParser):
    """argparse, with usage errors reported like every other error: one line (exit status 2)."""

    #: Set by :func:`redis_agentstate.cli.main` from the raw arguments (parsing failed, so no parsed --json).
    json_errors = False

    def error(self, message: str) -> NoReturn:
        text = f"{message} (see: {self.prog} --help)"
        if self.json_errors:
            line = json.dumps({"error": {"type": "Usage", "message": text}}, ensure_ascii=False)
        else:
            line = f"{self.prog}: {esc(text)}"
        print(line, file=sys.stderr, flush=True)
        raise SystemExit(2)
