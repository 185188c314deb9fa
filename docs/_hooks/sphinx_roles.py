"""griffe extension: render the docstrings' reST idioms as Markdown for the API reference.

The docstrings are written for ``help()`` and editors, with Sphinx roles (``:class:`Lease```) and
``::`` literal-block markers. This turns a role naming a public name (one of
``redis_agentstate.__all__``, or a member of one) into a cross-reference, checked by
``mkdocs build --strict``; any other role becomes plain code. The source stays as it is.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

import redis_agentstate

PUBLIC = set(redis_agentstate.__all__)
ROLE = re.compile(r":(?:class|meth|func|attr|data|mod|exc|obj):`(~?)([\w.]+)`")
MODULES = re.compile(r"^redis_agentstate(?:\.\w+)*?\.(?=[A-Z_])")


def _role(m: re.Match[str]) -> str:
    short, target = m.group(1) == "~", m.group(2)
    shown = target.rsplit(".", 1)[-1] if short else target
    name = MODULES.sub("", target)  # redis_agentstate.errors.LeaseLost -> LeaseLost
    if name.split(".", 1)[0] in PUBLIC and name.count(".") <= 1:
        return f"[`{shown}`][redis_agentstate.{name}]"
    return f"`{shown}`"


def to_markdown(text: str) -> str:
    text = ROLE.sub(_role, text)
    text = re.sub(r"(?m)^[ \t]*::[ \t]*$\n?", "", text)  # a bare "::" line opens a literal block
    return re.sub(r"(?m)(\S)::$", r"\1:", text)  # "root::" ends its sentence with ":"


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
