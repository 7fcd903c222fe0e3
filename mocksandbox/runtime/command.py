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
        "--python-requirements",
        metavar="FILE",
        help="requirements for the Python runtime's venv (default: a pinned subset of SandboxFusion's)",
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
    from mocksandbox.runtime.catalog import PYTHON_REQUIREMENTS
    from mocksandbox.runtime.install import Host, InstallError, plan_install, resolve_languages, run_plan
    from mocksandbox.runtime.layout import RuntimeDir
    from mocksandbox.settings import SettingsError

    try:
        settings = _settings(args.runtime_dir)
        languages = resolve_languages(args.languages.split(",") if args.languages else None, args.all)
        requirements: tuple[str, ...] = PYTHON_REQUIREMENTS
        if args.python_requirements:
            text = Path(args.python_requirements).read_text()
            requirements = tuple(
                line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")
            )
    except (InstallError, SettingsError, OSError) as exc:
        print(f"mocksandbox runtime install: {exc}", file=sys.stderr)
        return 2
    runtime = RuntimeDir(settings.runtime_dir)
    print(f"runtime dir: {runtime.root}", flush=True)
    plan = plan_install(languages, runtime, Host.detect(runtime), requirements)
    code = run_plan(plan, sys.stdout, dry_run=args.dry_run)
    # Asked by name, a language nothing here can give is a failure; with --all it is only a note.
    if not args.all and plan.unavailable and not args.dry_run:
        return 1
    return code


def _languages(args: argparse.Namespace) -> int:
    from mocksandbox.runtime.layout import RuntimeDir
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
    return 0
