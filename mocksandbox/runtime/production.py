"""Production's Python runtime, as data, and the divergence notes of answers this one cannot match.

SandboxFusion's image runs user Python in a conda env of CPython 3.10 with the packages of its
``runtime/python/requirements.txt`` (``data/sandboxfusion-requirements.txt``). The mock's runtime
(``mocksandbox runtime install --languages python``) is built to match: on a CPython of the version
production runs (setting ``production_python``), with a profile of those pins. Where it cannot
match, the answer carries a note (DESIGN seam 9), never a changed body:

* every answer produced by Python of another minor version (tracebacks, syntax and the standard
  library differ: 3.11's ``~~^~~`` markers, ``tomllib``, ``except*``, ``typing.Self``, ...);
* every answer whose program failed to import a module that production's runtime has
  (``data/sandboxfusion-modules.txt``: the import names of its packages and of what they pull in).
"""

from __future__ import annotations

import functools
import re
import subprocess
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from mocksandbox import divergence
from mocksandbox.runtime.interpreters import parse_minor
from mocksandbox.runtime.layout import RuntimeDir, venv_version

#: The profile of SandboxFusion's whole list (``runtime install --python-profile full``).
FULL_PROFILE = "full"
#: Python's own words for a module that is not there (``ImportError`` too: Python 2's and some
#: packages' wording); the name is the first component that is missing.
_NO_MODULE = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '([\w.]+)'")


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


def missing_production_modules(text: str) -> list[str]:
    """Modules production's runtime has that ``text`` (a run's output) says could not be imported.
    Only a missing top-level module counts: ``No module named 'sklearn.externals'`` is a module
    gone from a package both have, which a note about versions would not explain."""
    modules = sandboxfusion_modules()
    found = [name for name in _NO_MODULE.findall(text) if "." not in name and name in modules]
    return list(dict.fromkeys(found))


def module_note(module: str, profile: str | None) -> str:
    """The note of a run that could not import ``module``, which production's runtime has."""
    distribution = sandboxfusion_modules()[module]
    pin = sandboxfusion_pins().get(normalise(distribution))
    source = (
        f"SandboxFusion's requirements.txt pins {distribution}=={pin}"
        if pin
        else f"{distribution} comes with a package of SandboxFusion's requirements.txt"
    )
    if profile == FULL_PROFILE:
        fix = f"its profile is the full list, so pip could not install {distribution} here"
    else:
        fix = "`mocksandbox runtime install --languages python --python-profile full` installs it"
    return f"production's Python runtime has {module} ({source}); this one does not: {fix}"


def version_note(here: tuple[int, int, int] | None, python: str, production: str) -> str:
    """The note of an answer produced by Python of another minor version than production's."""
    shown = ".".join(map(str, here)) if here else "of an unknown version"
    return (
        f"user Python here is CPython {shown} ({python}); production runs CPython {production}, "
        "whose tracebacks, syntax and standard library differ (3.11 added tomllib, except*, "
        "typing.Self and the ~~^~~ markers under tracebacks): `mocksandbox runtime install "
        f"--languages python` builds the runtime on a {production} (--python-interpreter names one)"
    )


def interpreter_version(python: str, timeout: float = 30.0) -> tuple[int, int, int] | None:
    """The version of ``python``: from its venv's ``pyvenv.cfg`` when it has one (no start), else
    by running it; ``None`` when it does not run."""
    version = venv_version(Path(python).parent.parent)
    if version is not None:
        return version
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = done.stdout.split()
    if done.returncode != 0 or len(parts) != 3:
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


@dataclass(frozen=True)
class RuntimeFacts:
    """What user Python runs on here, against production's."""

    python: str
    version: tuple[int, int, int] | None
    #: The runtime venv's profile (``default``, ``full``, ``custom``), or ``None`` when ``python``
    #: is not a runtime made by ``runtime install`` (the server's own interpreter, another one).
    profile: str | None
    #: ``3.10``.
    production: str

    @property
    def same_minor(self) -> bool:
        return self.version is not None and self.version[:2] == parse_minor(self.production)

    def describe(self) -> str:
        """One line for the banner and ``mocksandbox languages``."""
        version = ".".join(map(str, self.version)) if self.version else "(does not run)"
        profile = f"profile {self.profile}" if self.profile else "not a runtime made by `runtime install`"
        line = (
            f"CPython {version}, {profile}; production: CPython {self.production} with SandboxFusion's "
            f"{len(sandboxfusion_requirements())} pinned packages"
        )
        if not self.same_minor:
            line += (
                f". NOT production's version: answers carry a `runtime` note (`mocksandbox runtime "
                f"install --languages python` builds it on a {self.production}; see its output for where "
                "it looked)"
            )
        elif self.profile != FULL_PROFILE:
            line += " (`--python-profile full` installs them all; a run missing one carries a note)"
        return line


class PythonRuntime:
    """The divergence notes of answers produced by user Python (runs, kernels) on one server.

    What it needs of the interpreter is found at the first answer, not when it is made: a server
    whose ``python`` does not exist still starts, and says so in its answers."""

    def __init__(self, python: str, production: str) -> None:
        self.python = python
        self.production = production
        self._facts: RuntimeFacts | None = None
        self._lock = threading.Lock()

    def facts(self) -> RuntimeFacts:
        with self._lock:
            if self._facts is None:
                self._facts = RuntimeFacts(
                    self.python,
                    interpreter_version(self.python),
                    runtime_profile(self.python),
                    self.production,
                )
            return self._facts

    def note_outputs(self, outputs: Iterable[str | None]) -> None:
        """Note what differs from production for an answer whose program printed ``outputs``."""
        facts = self.facts()
        # An interpreter that does not run says so in the answer itself (no version to compare).
        if facts.version is not None and not facts.same_minor:
            divergence.note(divergence.RUNTIME, version_note(facts.version, self.python, self.production))
        for text in outputs:
            for module in missing_production_modules(text or ""):
                divergence.note(divergence.RUNTIME, module_note(module, facts.profile))


def runtime_profile(python: str) -> str | None:
    """The profile a runtime venv was built with (its ``runtime install`` stamp), if ``python`` is
    one's interpreter."""
    venv = Path(python).parent.parent
    if venv.name != "venv" or venv.parent.name != "python":
        return None
    return RuntimeDir(venv.parent.parent).python_profile()
