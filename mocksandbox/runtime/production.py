"""Production's Python runtime, as data, and the divergence notes of answers this one cannot match.

SandboxFusion's image runs user Python in a conda env of CPython 3.10 with the packages of its
``runtime/python/requirements.txt`` (``data/sandboxfusion-requirements.txt``). The mock's runtime
(``mocksandbox runtime install --languages python``) is built to match: on a CPython of the version
production runs (setting ``production_python``), with a profile of those pins. Where it cannot
match, the answer carries a note (DESIGN seam 9), never a changed body:

* every answer produced by Python of another minor version (tracebacks, syntax and the standard
  library differ: 3.11's ``~~^~~`` markers, ``tomllib``, ``except*``, ``typing.Self``, ...);
* every answer whose program failed to import a module that production's runtime has
  (``data/sandboxfusion-modules.txt``: the import names of its packages and of what they pull in);
* a run of another minor version that finished close enough to its ``run_timeout`` to have been
  ``TimeLimitExceeded`` on production's slower interpreter, or that timed out here on an interpreter
  slower than production's (:data:`PURE_PYTHON_SPEED`, measured).
"""

from __future__ import annotations

import functools
import math
import re
import subprocess
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from mocksandbox import divergence
from mocksandbox.models import CommandRunResult, CommandRunStatus
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
    if "No module named" not in text:  # (most runs' outputs: no regex, no table)
        return []
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


#: The kernels of ``benchmarks/bench_python_versions.py``, in the order of :data:`PURE_PYTHON_SPEED`.
SPEED_KERNELS = (
    "arith",
    "primes",
    "floats",
    "dicts",
    "recursion",
    "strings",
    "dynamic",
    "objects",
    "pipeline",
)

#: How fast each minor version runs pure-Python code of the kind reward code runs, against CPython
#: 3.10: per kernel of :data:`SPEED_KERNELS`, the time it takes on 3.10 divided by the time it takes
#: on that version (above 1: that version is faster than 3.10). Measured with pyenv's 3.8.18, 3.9.18,
#: 3.10.13, 3.11.7, 3.12.1 and 3.13.0 on a shared 2-core x86-64 machine (Intel Xeon, 2.1 GHz) by
#: ``python benchmarks/bench_python_versions.py --rounds 9``: CPU time, each kernel's fastest call of
#: 9 rounds (a fresh process per round and interpreter, 3 calls after a warm-up); its table "from the
#: fastest round". Between two runs of the benchmark the geometric mean of a version's medians
#: moved by up to 18 % (others' work on the machine), that of its fastest calls by 5 %. docs/runtimes.md
#: has the table. A version not here gets no time note.
PURE_PYTHON_SPEED: Mapping[tuple[int, int], tuple[float, ...]] = {
    (3, 8): (1.02, 1.12, 1.09, 1.01, 0.96, 0.84, 0.89, 0.86, 0.86),
    (3, 9): (1.03, 1.08, 0.94, 1.00, 0.96, 0.83, 0.98, 0.84, 0.91),
    (3, 10): (1.0,) * len(SPEED_KERNELS),
    (3, 11): (1.75, 1.50, 1.59, 1.09, 1.87, 1.28, 1.37, 1.30, 1.13),
    (3, 12): (1.33, 1.35, 1.78, 0.97, 1.75, 0.94, 0.97, 0.98, 1.03),
    # dynamic (an LCS table): 3.13 calls the builtin max() much faster (vectorcall).
    (3, 13): (1.28, 1.33, 1.65, 1.00, 1.85, 1.25, 2.49, 1.05, 1.06),
}
#: How far apart two runs of the benchmark put one kernel's figure (up to 14 %; 23 % for one, 3.11's
#: pipeline; 5 % for the geometric mean): differences within it are no grounds for a note. So a
#: finished run is noted only where production is slower than this interpreter by more than this on
#: some kernel, and a timed-out one only where production is faster by more than this on typical
#: code (most runs that time out never end: a note on each of them for a few per cent would be
#: noise). 3.8 and 3.9 are within it of 3.10: no time notes between them.
SPEED_NOISE = 0.15


@dataclass(frozen=True)
class Slowdown:
    """The time pure-Python work takes on production's interpreter relative to its time on this
    one, over the measured kernels (above 1: production is slower)."""

    #: The geometric mean over the kernels.
    typical: float
    #: The kernel on which production does best against this one, and the one on which it does worst.
    low: float
    high: float


def production_slowdown(here: tuple[int, int], production: tuple[int, int]) -> Slowdown | None:
    """How much longer pure-Python work takes on ``production``'s minor version than on ``here``'s
    (from :data:`PURE_PYTHON_SPEED`); ``None`` where either was not measured."""
    speed_here, speed_production = PURE_PYTHON_SPEED.get(here), PURE_PYTHON_SPEED.get(production)
    if not speed_here or not speed_production:
        return None
    ratios = [a / b for a, b in zip(speed_here, speed_production, strict=True)]
    typical = math.exp(sum(map(math.log, ratios)) / len(ratios))
    return Slowdown(typical, min(ratios), max(ratios))


def _version(minor: tuple[int, int]) -> str:
    return f"{minor[0]}.{minor[1]}"


def time_limit_note(
    here: tuple[int, int],
    production: tuple[int, int],
    status: str,
    execution_time: float | None,
    run_timeout: float,
) -> str | None:
    """The note of a run that took ``execution_time`` on CPython ``here`` and ended with ``status``
    (``Finished`` or ``TimeLimitExceeded``), which production's CPython would likely or possibly
    have ended the other way, or ``None``.

    A finished run is noted where its time, scaled to production's speed on the kernel on which
    production does worst against this version, reaches ``run_timeout``: it *could* have timed out
    there; *likely* where the typical (geometric mean) scaling already reaches it. A timed-out run is
    noted where production is faster than this version on typical code: it could have finished
    there. Differences within :data:`SPEED_NOISE` count for nothing. On production's own minor
    version nothing is said: how fast this machine is against production's is not known."""
    if here == production or execution_time is None or run_timeout <= 0:
        return None
    slowdown = production_slowdown(here, production)
    if slowdown is None:
        return None
    scope = (
        "if its time went to Python code (sleeping, I/O and compiled libraries such as numpy do not scale so)"
    )
    speeds = (
        f"production's CPython {_version(production)} takes {slowdown.typical:.2f}x the time of "
        f"{_version(here)} on typical pure-Python code ({slowdown.low:.2f}-{slowdown.high:.2f}x on the "
        "workloads measured)"
    )
    if status == CommandRunStatus.Finished:
        worst = execution_time * slowdown.high
        if slowdown.high <= 1 + SPEED_NOISE or worst < run_timeout:
            return None
        typical = execution_time * slowdown.typical
        verdict = "would likely" if typical >= run_timeout else "could"
        return (
            f"the run finished in {execution_time:.2f} s of its run_timeout of {run_timeout:g} s on "
            f"CPython {_version(here)}; {speeds}, so it would take about {typical:.2f} s there (up to "
            f"{worst:.2f} s) {scope}: production {verdict} answer TimeLimitExceeded"
        )
    if status == CommandRunStatus.TimeLimitExceeded:
        if slowdown.typical >= 1 - SPEED_NOISE:
            return None
        return (
            f"the run reached its run_timeout of {run_timeout:g} s on CPython {_version(here)}; {speeds}, "
            f"so a program that needs less than about {run_timeout / slowdown.typical:.2f} s here (up to "
            f"{run_timeout / slowdown.low:.2f} s, depending on the code) finishes in time there {scope}: "
            "production could answer Finished"
        )
    return None


def interpreter_version(python: str, timeout: float = 30.0) -> tuple[int, int, int] | None:
    """The version of ``python``: from its venv's ``pyvenv.cfg`` when it has one (no start), else
    by running it; ``None`` when it does not run."""
    version = venv_version(Path(python).parent.parent)
    if version is not None:
        return version
    try:
        done = subprocess.run(
            # (Written for any Python, 2.7 too: an old one must say what it is to be refused.)
            [python, "-c", "import sys; print(' '.join(map(str, sys.version_info[:3])))"],
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

    @functools.cached_property
    def same_minor(self) -> bool:
        """Whether user Python is production's minor version (asked for every answer: kept)."""
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
        facts = self._facts
        if facts is not None:  # (every answer asks: no lock once they are known)
            return facts
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

    def note_time(self, result: CommandRunResult, run_timeout: float) -> None:
        """Note a run whose end (finished, or timed out) production's interpreter, of another speed
        than this one's, would likely or possibly have changed."""
        facts = self.facts()
        if facts.version is None:
            return
        if facts.same_minor:
            return  # (time_limit_note says nothing on production's own minor version)
        text = time_limit_note(
            facts.version[:2], parse_minor(self.production), result.status, result.execution_time, run_timeout
        )
        if text is not None:
            divergence.note(divergence.RUNTIME, text)


def runtime_profile(python: str) -> str | None:
    """The profile a runtime venv was built with (its ``runtime install`` stamp), if ``python`` is
    one's interpreter."""
    venv = Path(python).parent.parent
    if venv.name != "venv" or venv.parent.name != "python":
        return None
    return RuntimeDir(venv.parent.parent).python_profile()
