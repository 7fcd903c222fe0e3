"""Production's Python runtime, as data: SandboxFusion's packages and the modules they give.

SandboxFusion's image runs user Python in a conda env of CPython 3.10 with the packages of its
``runtime/python/requirements.txt`` (``data/sandboxfusion-requirements.txt``). The mock's runtime
(``mocksandbox runtime install --languages python``) is built to match: on a CPython of the version
production runs (setting ``production_python``), with a profile of those pins.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from importlib import resources


def _data(name: str) -> str:
    return resources.files("mocksandbox.runtime").joinpath("data", name).read_text(encoding="utf-8")


def read_requirements(text: str) -> tuple[str, ...]:
    """The requirement lines of a requirements file (comments and blank lines left out)."""
    lines = (line.split(" #", 1)[0].strip() for line in text.splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


@functools.cache
def sandboxfusion_requirements() -> tuple[str, ...]:
    """SandboxFusion's ``runtime/python/requirements.txt``, its pins as there."""
    return read_requirements(_data("sandboxfusion-requirements.txt"))


def normalise(distribution: str) -> str:
    """A distribution name as PyPI compares them (PEP 503): ``Flask_RESTful`` → ``flask-restful``."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


@functools.cache
def sandboxfusion_pins() -> Mapping[str, str]:
    """Normalised distribution name → the version SandboxFusion pins."""
    pins = {}
    for line in sandboxfusion_requirements():
        name, _, version = line.partition("==")
        pins[normalise(name)] = version.strip()
    return pins


@functools.cache
def sandboxfusion_modules() -> Mapping[str, str]:
    """Top-level import name → the distribution of production's runtime that provides it."""
    modules = {}
    for line in read_requirements(_data("sandboxfusion-modules.txt")):
        module, distribution = line.split()
        modules[module] = distribution
    return modules
