"""``mocksandbox runtime install`` and ``mocksandbox languages``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    runtime = subparsers.add_parser(
        "runtime",
        help="install toolchains and SandboxFusion's runtime libraries for languages",
        description="Toolchains (Debian packages) and the libraries SandboxFusion's runners give "
        "programs (Java jars, node_modules, Go libraries, a Python venv), in the runtime dir the "
        "server uses (setting runtime_dir).",
    )
    actions = runtime.add_subparsers(dest="runtime_command", required=True, metavar="ACTION")
    install = actions.add_parser("install", help="install what languages need (idempotent)")
    which = install.add_mutually_exclusive_group(required=True)
    which.add_argument("--languages", metavar="L,...", help="comma-separated languages (as in requests)")
    which.add_argument("--all", action="store_true", help="every language this machine can get")
    install.add_argument(
        "--runtime-dir", metavar="DIR", help="where to install (default: setting runtime_dir)"
    )
    install.add_argument(
        "--python-profile",
        choices=("default", "full"),
        default="default",
        help="the Python runtime's packages: default (SandboxFusion's pins for the packages reward code "
        "imports most) or full (SandboxFusion's whole requirements.txt: torch, tensorflow, ...; GBs)",
    )
    install.add_argument(
        "--python-requirements",
        metavar="FILE",
        help="requirements for the Python runtime's venv instead of a profile's (profile custom)",
    )
    install.add_argument(
        "--python-interpreter",
        metavar="PATH",
        help="build the Python runtime on this interpreter (default: a CPython of the version production "
        "runs, setting production_python, found on PATH, in pyenv, uv or conda; else this server's)",
    )
    install.add_argument(
        "--installer",
        choices=("auto", "uv", "pip"),
        default="auto",
        help="what makes the Python runtime's venv and installs its packages (default auto: uv where it is "
        "on PATH or beside this interpreter, or pip can get it; else pip; the same pins either way)",
    )
    install.add_argument(
        "--dry-run", action="store_true", help="print the steps and commands; change nothing"
    )
    install.set_defaults(handler=_install)

    languages = subparsers.add_parser(
        "languages",
        help="which languages run here (or on a deployment), with toolchains and runtime libraries",
    )
    languages.add_argument("--url", help="probe this deployment over HTTP instead of this host")
    languages.add_argument("--runtime-dir", metavar="DIR", help="runtime dir to inspect (this host)")
    languages.set_defaults(handler=_languages)


def _settings(runtime_dir: str | None) -> Any:
    from mocksandbox.settings import load_settings

    return load_settings(overrides={"runtime_dir": runtime_dir})


def _install(args: argparse.Namespace) -> int:
    from mocksandbox.runtime.catalog import LANGUAGE_NEEDS, python_profile_requirements
    from mocksandbox.runtime.install import Host, InstallError, plan_install, resolve_languages, run_plan
    from mocksandbox.runtime.layout import RuntimeDir
    from mocksandbox.runtime.production import read_requirements
    from mocksandbox.settings import SettingsError

    try:
        settings = _settings(args.runtime_dir)
        languages = resolve_languages(args.languages.split(",") if args.languages else None, args.all)
        profile = args.python_profile
        requirements = python_profile_requirements(profile)
        if args.python_requirements:
            requirements = read_requirements(Path(args.python_requirements).read_text())
            profile = "custom"
    except (InstallError, SettingsError, OSError) as exc:
        print(f"mocksandbox runtime install: {exc}", file=sys.stderr)
        return 2
    runtime = RuntimeDir(settings.runtime_dir)
    print(f"runtime dir: {runtime.root}", flush=True)
    python = None
    if any("python_runtime" in LANGUAGE_NEEDS[language].libraries for language in languages):
        python = _runtime_interpreter(args.python_interpreter, settings.production_python)
        if python is None:
            return 2
    plan = plan_install(languages, runtime, Host.detect(runtime, python), requirements, profile)
    if any(step.condensed and not step.done() for step in plan.steps):
        # pip's or uv's work to do: uv where it can be had (found, or, unless a dry run, got by pip).
        installer = _installer(args.installer, runtime, obtain=not args.dry_run)
        if installer is None:
            return 2
        plan = plan_install(
            languages, runtime, Host.detect(runtime, python, installer), requirements, profile
        )
    code = run_plan(plan, sys.stdout, dry_run=args.dry_run)
    # Asked by name, a language nothing here can give is a failure; with --all it is only a note.
    if not args.all and plan.unavailable and not args.dry_run:
        return 1
    return code


def _installer(mode: str, runtime: Any, obtain: bool) -> Any:
    """The ``installer.Installer`` for the Python runtime, saying which; ``None`` when ``--installer
    uv`` cannot be had."""
    from mocksandbox.runtime.installer import choose_installer

    try:
        installer = choose_installer(
            mode, sys.executable, sys.stdout, obtain=obtain, obtain_into=runtime.root / "tools" / "uv"
        )
    except ValueError as exc:
        print(f"mocksandbox runtime install: --installer {mode}: {exc}", file=sys.stderr)
        return None
    print(f"packages by {installer.describe()}", flush=True)
    return installer


def _runtime_interpreter(named: str | None, production: str) -> Any:
    """The interpreter to build the Python runtime on (an ``interpreters.Interpreter``), saying
    which and why; ``None`` when the one named does not run."""
    from mocksandbox.runtime.interpreters import (
        find_python,
        how_to_get,
        probe_interpreter,
        server_interpreter,
    )

    if named:
        found = probe_interpreter(named, "--python-interpreter")
        if isinstance(found, str):
            print(f"mocksandbox runtime install: --python-interpreter {found}", file=sys.stderr)
            return None
        print(f"python runtime on {found.describe()}", flush=True)
        if found.minor != production:
            print(
                f"  note: production runs CPython {production} (setting production_python): answers "
                f"produced on {found.minor} carry a divergence note",
                flush=True,
            )
        return found
    search = find_python(production)
    if search.found is not None:
        print(f"python runtime on {search.found.describe()}", flush=True)
        return search.found
    from mocksandbox.runtime.installer import find_uv

    fallback = server_interpreter()
    looked = "".join(f"\n    {line}" for line in search.rejected) or " (none there)"
    uv = find_uv()
    print(
        f"WARNING: no CPython {production} (production's, setting production_python) found on PATH, in "
        f"pyenv, uv or conda; tried:{looked}\n"
        f"  building the Python runtime on {fallback.describe()} instead: the banner, "
        f"`mocksandbox languages` and every Python answer will say so.\n"
        f"  To get one: {how_to_get(production, uv[0] if uv else None)}; then run this again.",
        flush=True,
    )
    return fallback


def _languages(args: argparse.Namespace) -> int:
    from mocksandbox.runtime.layout import RuntimeDir
    from mocksandbox.runtime.production import PythonRuntime
    from mocksandbox.runtime.report import format_table, host_languages, remote_languages
    from mocksandbox.settings import SettingsError

    if args.url:
        print(f"languages at {args.url} (probed over /run_code):", flush=True)
        print(format_table(remote_languages(args.url)))
        return 0
    try:
        settings = _settings(args.runtime_dir)
    except SettingsError as exc:
        print(f"mocksandbox languages: {exc}", file=sys.stderr)
        return 2
    runtime = RuntimeDir(settings.runtime_dir)
    state = "" if runtime.root.is_dir() else " (not there: nothing installed yet)"
    print(f"languages on this host; runtime dir {runtime.root}{state}; user python {settings.python}")
    print(format_table(host_languages(runtime, settings.python)))
    print(f"python runtime: {PythonRuntime(settings.python, settings.production_python).facts().describe()}")
    return 0
