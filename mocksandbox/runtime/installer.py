"""Making venvs and putting packages into them: with uv where it is here or can be had, pip otherwise.

uv (PyPI's ``uv``, one binary) makes a venv in well under a second and installs an order of
magnitude faster than pip. Whichever does the work, the result is the same: the same requirement
lines, the same indexes. uv reads none of pip's configuration, so pip's own settings (pip.conf and
the ``PIP_*`` variables: index, extra indexes, find-links, constraints, certificate) are
handed to uv in uv's names, and where there are several indexes uv is told to weigh them all as pip
does (its default takes a package from the first index that has it). A setting the user gave uv
itself is left as it is; pip's ``no-index``, which uv does not take from the environment, keeps pip.

Where uv comes from, in order: the ``uv`` on PATH, one beside this interpreter or in the venv
(``make serve`` puts it there), one in a directory the caller names (the runtime dir's
``tools/uv``), and last, when the caller allows, one pip installs into that directory. If none can
be had, pip does everything, as it did before uv.

Standard library only: the Makefile runs this module (``python -m mocksandbox.runtime.installer``)
from the checkout before anything is installed, to make ``.venv`` and install the project into it.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

#: ``--installer``: ``auto`` takes uv where it is here or can be had, else pip.
INSTALLER_CHOICES = ("auto", "uv", "pip")

#: pip's settings that decide where packages come from, and uv's names for them: ``(variable,
#: separator)`` where pip's value is a whitespace-separated list and uv's takes ``separator``.
PIP_TO_UV: Mapping[str, tuple[str, str]] = {
    "index-url": ("UV_INDEX_URL", " "),
    "extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
    "cert": ("SSL_CERT_FILE", " "),
}

Argv = tuple[str, ...]


def venv_python(venv: str | os.PathLike[str]) -> str:
    return str(Path(venv) / "bin" / "python")


@dataclass(frozen=True)
class Installer:
    """What puts packages into venvs here: uv (``uv`` is its path) or, when ``uv`` is ``None``, pip."""

    uv: str | None = None
    #: ``uv --version``'s answer, and where it was found (for the lines printed).
    uv_version: str = ""
    origin: str = ""
    #: Variables uv runs with: pip's settings in uv's names (:func:`uv_environment`).
    env: Mapping[str, str] = field(default_factory=dict)
    #: Why pip, when uv was looked for and not taken.
    why_pip: str = ""

    @property
    def name(self) -> str:
        return "uv" if self.uv else "pip"

    def describe(self) -> str:
        if self.uv:
            return f"{self.uv_version or 'uv'} ({self.origin}: {self.uv})"
        return f"pip ({self.why_pip})" if self.why_pip else "pip"

    def venv_commands(self, python: str, venv: str | os.PathLike[str], clear: bool = False) -> list[Argv]:
        """Make ``venv`` on ``python`` with pip in it (a venv made before is kept unless ``clear``)."""
        if self.uv:
            keep = "--clear" if clear else "--allow-existing"
            return [(self.uv, "venv", "--quiet", "--seed", keep, "--python", python, str(venv))]
        return [
            (python, "-m", "venv", *(("--clear",) if clear else ()), str(venv)),
            (venv_python(venv), "-m", "pip", "install", "--quiet", "--upgrade", "pip"),
        ]

    def install_command(self, venv: str | os.PathLike[str], *args: str) -> Argv:
        """``pip install ARGS`` into ``venv``, by whichever installs here. Its output says what it
        does, package by package (:mod:`~mocksandbox.runtime.progress` makes a line of it)."""
        if self.uv:
            return (self.uv, "pip", "install", "--python", venv_python(venv), *args)
        return (venv_python(venv), "-m", "pip", "install", "--progress-bar", "off", *args)


# -- pip's settings, for uv ---------------------------------------------------------------------------


def parse_pip_config(listing: str) -> dict[str, str]:
    """pip's settings from ``pip config list``'s lines (``global.find-links='/opt/wheels'``): the
    key without its section, the value unquoted; variables (``:env:``) win over files."""
    from_files: dict[str, str] = {}
    from_env: dict[str, str] = {}
    for line in listing.splitlines():
        name, equals, quoted = line.partition("=")
        section, dot, key = name.strip().rpartition(".")
        if not equals or not dot or section not in (":env:", "global", "install"):
            continue
        try:
            value = ast.literal_eval(quoted.strip())
        except (ValueError, SyntaxError):
            value = quoted.strip().strip("'\"")
        (from_env if section == ":env:" else from_files)[key] = str(value)
    return {**from_files, **from_env}


def uv_environment(pip_settings: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that make uv fetch from where pip would (see the module); none that the
    user set in ``environ`` is changed."""
    env: dict[str, str] = {}
    for key, (variable, separator) in PIP_TO_UV.items():
        value = pip_settings.get(key, "").split()
        if value and variable not in environ and variable not in env:
            env[variable] = separator.join(value)
    # pip takes the best match from all its indexes; uv, by default, takes a package from the first
    # index that has it (where a local mirror lags behind PyPI, an older release).
    if "UV_EXTRA_INDEX_URL" in env or "UV_FIND_LINKS" in env:
        env.setdefault("UV_INDEX_STRATEGY", environ.get("UV_INDEX_STRATEGY", "unsafe-best-match"))
    return env


def read_pip_settings(python: str) -> dict[str, str]:
    """What ``python -m pip config list`` says (nothing when pip is not there or fails)."""
    try:
        done = subprocess.run(
            [python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_pip_config(done.stdout) if done.returncode == 0 else {}


def _pip_says_no_index(settings: Mapping[str, str]) -> bool:
    return settings.get("no-index", "").strip().lower() in ("1", "true", "yes", "on")


# -- finding uv, and getting it ------------------------------------------------------------------------


def uv_version(uv: str) -> str | None:
    """``uv --version`` (``uv 0.13.9 ...``), or ``None`` when it does not run."""
    try:
        done = subprocess.run([uv, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = done.stdout.split()
    return " ".join(words[:2]) if done.returncode == 0 and words[:1] == ["uv"] else None


def find_uv(
    places: Iterable[tuple[str | os.PathLike[str], str]] = (),
    which: Callable[[str], str | None] = shutil.which,
) -> tuple[str, str, str] | None:
    """``(path, version, origin)`` of the first uv that runs: on PATH, then ``places`` (``(path,
    what it is)``), then beside this interpreter."""
    candidates: list[tuple[str, str]] = []
    on_path = which("uv")
    if on_path:
        candidates.append((on_path, "on PATH"))
    candidates += [(str(path), origin) for path, origin in places]
    candidates.append((str(Path(sys.executable).parent / "uv"), "beside this interpreter"))
    seen: set[str] = set()
    for path, origin in candidates:
        if path in seen or not os.path.isfile(path):
            continue
        seen.add(path)
        version = uv_version(path)
        if version:
            return path, version, origin
    return None


def obtain_uv(python: str, target: Path | None, out: TextIO) -> str | None:
    """Let ``python``'s pip put uv into ``target`` (a directory of its own: nothing else changes),
    or with ``None`` into ``python``'s own venv; the path of its binary, or ``None`` (and why,
    printed) when pip cannot get it."""
    started = time.monotonic()
    where = target if target is not None else Path(python).parent.parent
    print(f"      getting uv (faster installs) with pip into {where} ...", file=out, flush=True)
    argv = [python, "-m", "pip", "install", "--quiet", "uv"]
    if target is not None:
        argv[-1:-1] = ["--upgrade", "--target", str(target)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"      no uv ({exc}): pip installs instead", file=out, flush=True)
        return None
    binary = (target / "bin" / "uv") if target is not None else Path(python).parent / "uv"
    if done.returncode != 0 or not binary.is_file():
        why = _first_error(done.stderr or done.stdout) or f"exit status {done.returncode}"
        print(f"      no uv ({why}): pip installs instead", file=out, flush=True)
        return None
    print(f"      got uv ({time.monotonic() - started:.1f}s)", file=out, flush=True)
    return str(binary)


def _first_error(text: str) -> str:
    """pip's first ``ERROR`` line (what went wrong; later ones say where to read about it)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return errors[0] if errors else lines[-1] if lines else ""


def choose_installer(
    mode: str,
    pip_python: str,
    out: TextIO,
    places: Iterable[tuple[str | os.PathLike[str], str]] = (),
    obtain: bool = False,
    obtain_into: Path | None = None,
    which: Callable[[str], str | None] = shutil.which,
    environ: Mapping[str, str] | None = None,
) -> Installer:
    """The installer for ``mode`` (``auto``, ``uv``, ``pip``): uv found (:func:`find_uv`, and in
    ``obtain_into``) or, with ``obtain``, got by ``pip_python``'s pip (into ``obtain_into``, else
    into its own venv); else pip. ``ValueError`` when ``uv`` was asked for and none can be had."""
    if mode not in INSTALLER_CHOICES:
        raise ValueError(f"installer {mode!r}: choose one of {', '.join(INSTALLER_CHOICES)}")
    if mode == "pip":
        return Installer(why_pip="asked for")
    environ = os.environ if environ is None else environ
    settings = read_pip_settings(pip_python)
    if _pip_says_no_index(settings) and mode == "auto":
        return Installer(why_pip="pip is set to no-index, which uv would not follow")
    places = list(places)
    if obtain_into is not None:
        places.append((obtain_into / "bin" / "uv", "got by pip earlier"))
    found = find_uv(places, which)
    if found is None and obtain:
        binary = obtain_uv(pip_python, obtain_into, out)
        version = uv_version(binary) if binary else None
        if binary and version:
            found = (binary, version, "got by pip just now")
    if found is None:
        if mode == "uv":
            raise ValueError("no uv here (none on PATH, and pip could not get one)")
        why = "no uv here, and pip could not get one" if obtain else "no uv here yet (pip may get one)"
        return Installer(why_pip=why)
    path, version, origin = found
    return Installer(path, version, origin, uv_environment(settings, environ))


# -- the Makefile's side: .venv and the project in it ----------------------------------------------------


def make_project_venv(venv: Path, mode: str, out: TextIO) -> int:
    """``make``'s ``.venv``: made on this interpreter with pip in it, and uv too where it can be
    had (the uv on PATH makes it; else pip puts uv into it), so that installs into it are fast."""
    started = time.monotonic()
    python = sys.executable
    found = None if mode == "pip" else find_uv(which=shutil.which)
    if found is not None:
        uv, version, origin = found
        print(f"{venv}: a venv on {python} (by {version}, {origin})", file=out, flush=True)
        # Its seed packages (pip, setuptools) come from where pip's would.
        env = uv_environment(read_pip_settings(python), os.environ)
        code = _run_all(Installer(uv, version, origin).venv_commands(python, venv), out, env=env)
    elif mode == "pip":
        print(f"{venv}: a venv on {python} (by pip, as asked)", file=out, flush=True)
        code = _run_all(Installer().venv_commands(python, venv), out)
    else:
        # No uv on PATH: a venv without pip (a fraction of a second), then this interpreter's pip puts
        # uv and pip into it; where that fails (an old pip, no uv to be had), ensurepip gives it pip.
        print(f"{venv}: a venv on {python}, with uv (got by pip) for installs", file=out, flush=True)
        code = _run_all([(python, "-m", "venv", "--without-pip", str(venv))], out)
        if code == 0:
            get = (python, "-m", "pip", "--python", venv_python(venv), "install", "--quiet", "uv", "pip")
            if _run_all([get], out, quiet_failure=True) != 0:
                print("      no uv to be had: pip installs instead (slower)", file=out, flush=True)
                code = _run_all(
                    [
                        (venv_python(venv), "-m", "ensurepip", "--upgrade", "--default-pip"),
                        (venv_python(venv), "-m", "pip", "install", "--quiet", "--upgrade", "pip"),
                    ],
                    out,
                )
    if code == 0:
        print(f"      done ({time.monotonic() - started:.1f}s)", file=out, flush=True)
    return code


def install_into(venv: Path, args: Sequence[str], mode: str, what: str, out: TextIO) -> int:
    """``pip install ARGS`` into ``venv``, by uv where it is (on PATH or in the venv), else pip,
    with a line of progress; its full output in ``venv/install.log``."""
    from mocksandbox.runtime.progress import run_installer

    try:
        places = [(venv / "bin" / "uv", "in the venv")]
        installer = choose_installer(mode, venv_python(venv), out, places, obtain=True)
    except ValueError as exc:
        print(f"mocksandbox.runtime.installer: {exc}", file=sys.stderr)
        return 2
    print(f"{venv}: {what} (by {installer.describe()})", file=out, flush=True)
    argv = installer.install_command(venv, *args)
    return run_installer(argv, out, env={**os.environ, **installer.env}, log=venv / "install.log")


def _run_all(
    commands: Sequence[Argv], out: TextIO, quiet_failure: bool = False, env: Mapping[str, str] | None = None
) -> int:
    """Run each of ``commands`` until one fails (its exit status) with their output kept back: it
    is shown when one fails, unless ``quiet_failure`` (the caller says what failing means)."""
    environ = {**os.environ, **env} if env else None
    for argv in commands:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False, env=environ
        )
        if done.returncode != 0:
            if not quiet_failure:
                print(f"      failed (exit status {done.returncode}): {' '.join(argv)}", file=out)
                print(done.stdout + done.stderr, file=out, end="", flush=True)
            return done.returncode
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mocksandbox.runtime.installer venv DIR`` / ``install DIR -- ARGS``, for the Makefile."""
    parser = argparse.ArgumentParser(
        prog="python -m mocksandbox.runtime.installer",
        description="Make a venv with pip (and uv where it can be had) in it, or install into one: "
        "by uv where it is here, else by pip.",
    )
    parser.add_argument("--installer", choices=INSTALLER_CHOICES, default="auto")
    actions = parser.add_subparsers(dest="action", required=True)
    make = actions.add_parser("venv", help="make DIR on this interpreter")
    make.add_argument("venv", type=Path)
    install = actions.add_parser("install", help="pip install ARGS into DIR")
    install.add_argument("venv", type=Path)
    install.add_argument("--what", default="packages", help="what is installed, for the lines printed")
    install.epilog = "pip install's arguments follow a --: install .venv -- -e '.[jupyter]'"
    words = list(sys.argv[1:] if argv is None else argv)
    split = words.index("--") if "--" in words else len(words)
    args = parser.parse_args(words[:split])
    if args.action == "venv":
        return make_project_venv(args.venv, args.installer, sys.stdout)
    return install_into(args.venv, words[split + 1 :], args.installer, args.what, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
