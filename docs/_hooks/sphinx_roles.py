"""griffe extension: render the docstrings' reST idioms as Markdown for the API reference.

The docstrings are written for ``help()`` and editors, with Sphinx roles (``:class:`Lease```) and
``::`` literal-block markers. This turns a role naming a public name (one of
``redis_agentstate.__all__``, or a member of one) or a module the reference renders into a
cross-reference, and ``:ref:`text <heading-id>``` into a link to a guide's heading, all checked by
``mkdocs build --strict``; any other role becomes plain code. The source stays as it is.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

import redis_agentstate

PUBLIC = set(redis_agentstate.__all__)
#: The modules whose docstrings the API reference renders (``::: redis_agentstate.<module>``).
REFERENCE = Path(__file__).resolve().parent.parent / "reference"
DOCUMENTED_MODULES = {
    name
    for page in REFERENCE.glob("*.md")
    for name in re.findall(r"^::: (redis_agentstate\.[a-z_]+)$", page.read_text("utf-8"), re.M)
}
ROLE = re.compile(r":(class|meth|func|attr|data|mod|exc|obj):`(~?)([\w.]+)`")
#: ``:ref:`text <anchor>``` or ``:ref:`anchor```: a heading of a guide (its id), as Sphinx labels are.
REF = re.compile(r":ref:`(?:([^`<]+?)\s*<([\w-]+)>|([\w-]+))`")
MODULES = re.compile(r"^redis_agentstate(?:\.\w+)*?\.(?=[A-Z_])")


def _role(m: re.Match[str]) -> str:
    kind, short, target = m.group(1), m.group(2) == "~", m.group(3)
    shown = target.rsplit(".", 1)[-1] if short else target
    if kind == "mod" and target in DOCUMENTED_MODULES:
        return f"[`{shown}`][{target}]"
    name = MODULES.sub("", target)  # redis_agentstate.errors.LeaseLost -> LeaseLost
    if name.split(".", 1)[0] in PUBLIC and name.count(".") <= 1:
        return f"[`{shown}`][redis_agentstate.{name}]"
    return f"`{shown}`"


def _ref(m: re.Match[str]) -> str:
    # An autorefs link to a guide's heading: mkdocs build --strict fails if no heading has that id.
    text, anchor = (m.group(1), m.group(2)) if m.group(2) else (m.group(3), m.group(3))
    return f"[{text}][{anchor}]"


def to_markdown(text: str) -> str:
    text = ROLE.sub(_role, text)
    text = REF.sub(_ref, text)
    text = re.sub(r"(?m)^[ \t]*::[ \t]*$\n?", "", text)  # a bare "::" line opens a literal block
    return re.sub(r"(?m)(\S)::$", r"\1:", text)  # "root::" ends its sentence with ":"


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
