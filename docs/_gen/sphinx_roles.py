"""A griffe extension for the API page: the docstrings' Sphinx roles (``:class:`~x.Y```,
``:mod:`x```) become plain code (``Y``, ``x``), as their Sphinx rendering would read."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|mod|meth|func|attr|data|exc|obj):`(~?)([^`]+)`")


def _plain(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = ROLE.sub(_plain, obj.docstring.value)
            obj.docstring.value = text.replace("``", "`")
