"""Finding the CPython that production runs user code on (3.10 for SandboxFusion), where users keep one.

SandboxFusion's image runs user programs in a conda env made with ``python=3.10``; the Python
runtime's venv (``mocksandbox runtime install --languages python``) is built on an interpreter of
the same minor version, so that tracebacks, syntax and the standard library are production's. The
places looked at, in order: ``python3.10`` on PATH, pyenv's versions, uv's managed interpreters
(``uv python find``, and its install dir), conda's environments. Each candidate is started once to
check what it is (a pyenv shim on PATH may name a version that is not selected) and that it can
make a venv (Debian's interpreter needs ``python3.10-venv`` for that).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

#: Printed by a candidate: its version, its implementation, its real executable. ``ensurepip`` is
#: what ``python -m venv`` needs and distributions leave out (Debian's ``python3.X-venv``).
_PROBE_CODE = (
    "import sys, venv, ensurepip; "
    "print('%d.%d.%d' % sys.version_info[:3], sys.implementation.name, sys.executable)"
)

#: Where conda installs live when no ``conda`` is active (the installers' default names).
_CONDA_ROOTS = ("miniconda3", "anaconda3", "miniforge3", "mambaforge", "micromamba")
#: The env SandboxFusion's image runs user code in: looked at first among conda's envs.
SANDBOXFUSION_CONDA_ENV = "sandbox-runtime"


@dataclass(frozen=True)
class Interpreter:
    """A CPython that can make venvs."""

    path: str
    version: tuple[int, int, int]
    #: Where it was found: ``PATH``, ``pyenv``, ``uv``, ``conda``, ``--python-interpreter``, ...
    source: str

    @property
    def minor(self) -> str:
        """``3.10``."""
        return f"{self.version[0]}.{self.version[1]}"

    def describe(self) -> str:
        return f"CPython {'.'.join(map(str, self.version))} ({self.source}: {self.path})"


def parse_minor(version: str) -> tuple[int, int]:
    """``"3.10"`` (or ``"3.10.13"``) as ``(3, 10)``; ``ValueError`` for anything else."""
    match = re.fullmatch(r"\s*(\d+)\.(\d+)(?:\.\d+)?\s*", version)
    if match is None:
        raise ValueError(f"not a Python version: {version!r} (write it as 3.10)")
    return int(match[1]), int(match[2])


#: Runs a candidate: its :class:`Interpreter` (``source`` as given), or why it is no use (a string).
Probe = Callable[[str, str], "Interpreter | str"]


def probe_interpreter(path: str, source: str, timeout: float = 30.0) -> Interpreter | str:
    """Start ``path`` once: what it is, or why it cannot make the runtime's venv."""
    try:
        done = subprocess.run(
            [path, "-I", "-c", _PROBE_CODE], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{path}: does not run ({exc})"
    words = done.stdout.split(maxsplit=2)
    if done.returncode != 0 or len(words) != 3:
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        # A traceback's last line says what failed; a wrapper's (a pyenv shim's) first line does.
        errors = [line for line in lines if "Error" in line]
        why = errors[-1] if errors else lines[0] if lines else f"exit status {done.returncode}"
        if "ensurepip" in why:
            why += " (Debian and Ubuntu: apt-get install python3.X-venv)"
        return f"{path}: {why}"
    version_text, implementation, executable = words
    if implementation != "cpython":
        return f"{path}: {implementation}, not CPython"
    major, minor, micro = (int(part) for part in version_text.split("."))
    return Interpreter(executable.strip(), (major, minor, micro), source)


def candidates(
    minor: tuple[int, int],
    environ: Mapping[str, str],
    which: Callable[[str], str | None],
) -> Iterator[tuple[str, str]]:
    """``(path, source)`` of every interpreter of ``minor`` that might be here, best first. Only
    files are looked at (and ``uv python find`` run); nothing is started."""
    name = f"python{minor[0]}.{minor[1]}"
    on_path = which(name)
    if on_path:
        yield on_path, "PATH"
    home = environ.get("HOME") or os.path.expanduser("~")
    # pyenv: versions/3.10.13, newest patch first (not 3.10-dev, 3.10.13t and the like).
    pyenv_root = environ.get("PYENV_ROOT") or os.path.join(home, ".pyenv")
    pattern = re.compile(rf"{minor[0]}\.{minor[1]}\.(\d+)")
    versions = []
    for entry in _listdir(os.path.join(pyenv_root, "versions")):
        match = pattern.fullmatch(entry)
        if match:
            versions.append((int(match[1]), entry))
    for _, entry in sorted(versions, reverse=True):
        yield os.path.join(pyenv_root, "versions", entry, "bin", name), "pyenv"
    # uv: what it would choose, then what it installed (uv itself may not be on PATH).
    uv = which("uv")
    if uv:
        found = _uv_find(uv, f"{minor[0]}.{minor[1]}")
        if found:
            yield found, "uv"
    xdg_data = environ.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")
    uv_dir = environ.get("UV_PYTHON_INSTALL_DIR") or os.path.join(xdg_data, "uv", "python")
    uv_pattern = os.path.join(uv_dir, f"cpython-{minor[0]}.{minor[1]}.*", "bin", name)
    for path in sorted(glob.glob(uv_pattern), reverse=True):
        yield path, "uv"
    # conda: the active env, the active install's envs, then installs under their default names.
    roots = []
    if environ.get("CONDA_EXE"):
        roots.append(os.path.dirname(os.path.dirname(environ["CONDA_EXE"])))
    roots += [os.path.join(home, root) for root in _CONDA_ROOTS] + ["/opt/conda"]
    prefixes = [environ["CONDA_PREFIX"]] if environ.get("CONDA_PREFIX") else []
    for root in dict.fromkeys(roots):
        envs = sorted(_listdir(os.path.join(root, "envs")), key=lambda env: env != SANDBOXFUSION_CONDA_ENV)
        prefixes += [os.path.join(root, "envs", env) for env in envs] + [root]
    for prefix in dict.fromkeys(prefixes):
        yield os.path.join(prefix, "bin", name), "conda"


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _uv_find(uv: str, version: str) -> str | None:
    try:
        done = subprocess.run(
            [uv, "python", "find", version],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = done.stdout.strip()
    return path if done.returncode == 0 and path else None


@dataclass
class Search:
    """What :func:`find_python` found, and what it looked at (for the message when nothing)."""

    found: Interpreter | None
    #: One line per candidate that was no use, and why.
    rejected: list[str]


def find_python(
    version: str,
    environ: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] | None = None,
    probe: Probe = probe_interpreter,
) -> Search:
    """The first CPython ``version`` (``"3.10"``) found where users keep one (see the module)."""
    minor = parse_minor(version)
    environ = os.environ if environ is None else environ
    path = environ.get("PATH", os.defpath)
    which = which or (lambda name: shutil.which(name, path=path))
    rejected: list[str] = []
    seen: set[str] = set()
    for candidate, source in candidates(minor, environ, which):
        if candidate in seen or not os.path.exists(candidate):
            continue
        seen.add(candidate)
        result = probe(candidate, source)
        if isinstance(result, str):
            rejected.append(result)
        elif result.version[:2] != minor:
            rejected.append(f"{candidate}: is {result.minor}")
        else:
            return Search(result, rejected)
    return Search(None, rejected)


def server_interpreter() -> Interpreter:
    """The interpreter this server runs on (the fallback when no other is found)."""
    major, minor, micro = sys.version_info[:3]
    return Interpreter(sys.executable, (major, minor, micro), "this server's interpreter")


def how_to_get(version: str, uv: str | None = None) -> str:
    """Ways to put a CPython ``version`` where :func:`find_python` looks; ``uv``: the uv found here,
    which can fetch one itself (from the internet, not from a package index)."""
    fetch = f"{uv} python install {version} (uv is here; it downloads CPython, so it needs the internet)"
    return (
        f"{fetch if uv else f'uv python install {version} (needs the internet)'}; pyenv install {version}; "
        f"conda create -n {SANDBOXFUSION_CONDA_ENV} python={version}; "
        f"apt-get install python{version} python{version}-venv (where the distribution has it); "
        f"or name one with --python-interpreter PATH"
    )
