"""``mocksandbox runtime install``: plan the steps a set of languages needs, then run them.

A plan is a list of :class:`Step`, each with the exact commands it runs (``--dry-run`` prints them)
and a check that says whether it is already done, so a second install does nothing. System
packages need root: without it, the step is not run and the plan prints the command to run.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from mocksandbox.runtime.catalog import (
    GO_DEBIAN_PACKAGES,
    JAVA_JARS,
    LANGUAGE_NEEDS,
    LIBRARIES,
    NODE_DEPENDENCIES,
    PYTHON_REQUIREMENTS,
    TORCH_CPU_INDEX,
)
from mocksandbox.runtime.installer import Installer
from mocksandbox.runtime.interpreters import Interpreter, server_interpreter
from mocksandbox.runtime.layout import RuntimeDir
from mocksandbox.runtime.progress import run_installer

#: SandboxFusion's runtime/node/package.json settings that decide how ``npm run test`` behaves:
#: jest without colours, at most 2 workers, and its JSON report in ``jest-report.json``.
NODE_PACKAGE_JSON: Mapping[str, object] = {
    "name": "coderunner",
    "version": "1.0.0",
    "private": True,
    "scripts": {"test": "FORCE_COLOR=0 jest"},
    "jest": {"maxWorkers": 2, "testResultsProcessor": "jest-json-reporter"},
    "jestJsonReporter": {"outputFile": "jest-report.json"},
    "dependencies": dict(NODE_DEPENDENCIES),
}
BABEL_CONFIG = """module.exports = {
  presets: [
    ['@babel/preset-env', { targets: { node: 'current' } }],
    '@babel/preset-typescript'
  ],
};
"""
#: Copied into every Go run as SandboxFusion copies its runtime/go module. Inert in GOPATH mode
#: (GO111MODULE=off), kept so a program sees the same files beside it.
GO_MOD = "module SeedSandbox\n\ngo 1.19\n"
GO_MAIN = """package main

// Builds when the runtime's Go libraries resolve (checked by `mocksandbox runtime install`).
import (
\t"fmt"

\t_ "github.com/sirupsen/logrus"
\t_ "github.com/spf13/cobra"
\t_ "github.com/stretchr/testify/assert"
\t_ "go.uber.org/zap"
\t_ "gopkg.in/yaml.v3"
)

func main() {
\tfmt.Println("123")
}
"""
#: Debian's Kotlin (1.3) says "running Kotlin scripts is not yet supported" to ``kotlin x.kts``,
#: SandboxFusion's command; ``kotlinc -script`` runs them.
KOTLIN_SHIM = """#!/bin/sh
# mocksandbox runtime: `kotlin FILE.kts` as newer Kotlin runs it, on Debian's Kotlin 1.3.
case "$1" in
  *.kts) exec {kotlinc} -script "$@" ;;
esac
exec {kotlin} "$@"
"""
#: Environment for npm: puppeteer's install step would download a browser build, which cannot
#: be fetched here; the package itself installs (launching a browser then fails, as it says).
NPM_ENV = {"PUPPETEER_SKIP_DOWNLOAD": "1", "PUPPETEER_SKIP_CHROMIUM_DOWNLOAD": "1"}
APT_INSTALL = ("apt-get", "install", "-y", "--no-install-recommends")


class InstallError(ValueError):
    """Languages that cannot be asked for (unknown names); the message says which."""


@dataclass(frozen=True)
class Host:
    """What planning needs to know about this machine (tests pass a made-up one)."""

    is_root: bool
    which: Callable[[str], str | None]
    #: The subset of the given Debian packages that are installed.
    installed_packages: Callable[[Sequence[str]], set[str]]
    has_apt: bool
    #: The interpreter the Python runtime's venv is made with (``interpreters.find_python``).
    python: Interpreter = field(default_factory=server_interpreter)
    #: What makes that venv and installs into it: uv or pip (``installer.choose_installer``).
    installer: Installer = field(default_factory=Installer)

    @classmethod
    def detect(
        cls, runtime: RuntimeDir, python: Interpreter | None = None, installer: Installer | None = None
    ) -> Host:
        path = f"{runtime.bin_dir}:{os.environ.get('PATH', os.defpath)}"
        return cls(
            is_root=os.geteuid() == 0,
            which=lambda name: shutil.which(name, path=path),
            installed_packages=debian_installed,
            has_apt=shutil.which("apt-get") is not None and shutil.which("dpkg-query") is not None,
            python=python or server_interpreter(),
            installer=installer or Installer(),
        )


def debian_installed(packages: Sequence[str]) -> set[str]:
    """Which of ``packages`` dpkg says are installed."""
    if not packages or shutil.which("dpkg-query") is None:
        return set()
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package} ${Status}\n", *packages],
        capture_output=True,
        text=True,
        check=False,
    )
    installed = set()
    for line in result.stdout.splitlines():
        name, _, status = line.partition(" ")
        if status.endswith("install ok installed"):
            installed.add(name.partition(":")[0])
    return installed


@dataclass
class Step:
    """One thing to install: its commands (argv lists), then Python-side work (files, links)."""

    title: str
    done: Callable[[], bool]
    commands: list[tuple[str, ...]] = field(default_factory=list)
    action: Callable[[], None] | None = None
    #: What ``action`` does, for ``--dry-run``.
    action_text: str = ""
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    #: Why it cannot run here, with the command that would do it (e.g. it needs root).
    blocked: str = ""
    #: Python-side work before ``commands`` (files they read).
    prepare: Callable[[], None] | None = None
    #: Indexes of ``commands`` whose failure is reported and does not stop the step.
    optional: frozenset[int] = frozenset()
    #: Indexes of ``commands`` (pip's or uv's installs) shown as a line of progress, not their own
    #: output, which goes to ``log``.
    condensed: frozenset[int] = frozenset()
    log: Path | None = None


@dataclass
class Plan:
    steps: list[Step]
    #: Things asked for that no package source here has, with the reason.
    unavailable: list[str]


def resolve_languages(names: Iterable[str] | None, every: bool) -> list[str]:
    """``--languages a,b`` or ``--all`` as a list of table names (``js``/``ts`` are not in it)."""
    if every:
        return list(LANGUAGE_NEEDS)
    chosen = [name.strip() for name in names or () if name.strip()]
    unknown = [name for name in chosen if name not in LANGUAGE_NEEDS]
    if unknown:
        raise InstallError(f"unknown language(s): {', '.join(unknown)}; known: {', '.join(LANGUAGE_NEEDS)}")
    if not chosen:
        raise InstallError("name languages with --languages L,... or ask for --all")
    return chosen


def plan_install(
    languages: Sequence[str],
    runtime: RuntimeDir,
    host: Host,
    python_requirements: Sequence[str] = PYTHON_REQUIREMENTS,
    python_profile: str = "default",
) -> Plan:
    """The steps that give ``languages`` their toolchains and runtime libraries here; the Python
    runtime gets ``python_requirements`` (named ``python_profile``) on ``host.python``."""
    unavailable: list[str] = []
    packages: list[str] = []
    libraries: list[str] = []
    shims: list[str] = []
    for language in languages:
        needs = LANGUAGE_NEEDS[language]
        toolchain = needs.toolchain
        # A binary that a shim provides is made by the shim's step, not by a package.
        missing = [b for b in toolchain.binaries if host.which(b) is None and b not in toolchain.shims]
        if missing and toolchain.unavailable:
            unavailable.append(f"{language}: {toolchain.unavailable}")
        elif missing:
            packages += toolchain.debian
        shims += [name for name in toolchain.shims if name not in shims]
        for name in needs.libraries:
            library = LIBRARIES[name]
            if library.unavailable:
                unavailable.append(f"{language} ({name}): {library.unavailable}")
            elif name not in libraries:
                libraries.append(name)
                packages += library.debian
    if "node_modules" in libraries and host.which("npm") is None:
        packages.append("npm")
    if "dmd" in shims and host.which("dmd") is None:
        packages.append("ldc")
    packages = list(dict.fromkeys(packages))
    steps = [_debian_step(packages, host)] if packages else []
    # Quick steps first, the Python venv (minutes of downloads) last.
    libraries.sort(key=lambda name: name == "python_runtime")
    for name in libraries:
        steps += _library_steps(name, runtime, host, python_requirements, python_profile)
    steps += [_shim_step(name, runtime, host) for name in shims]
    return Plan(steps, list(dict.fromkeys(unavailable)))


def _debian_step(packages: list[str], host: Host) -> Step:
    def done() -> bool:
        return host.installed_packages(packages) >= set(packages)

    install = (*APT_INSTALL, *packages)
    step = Step(f"Debian packages: {' '.join(packages)}", done, [("apt-get", "update"), install])
    if not host.has_apt:
        step.blocked = f"this host has no apt-get/dpkg: install the equivalents of {' '.join(packages)}"
    elif not host.is_root:
        step.blocked = (
            "installing system packages needs root; run:\n"
            f"    sudo apt-get update && sudo {' '.join(install)}"
        )
    return step


def _files_done(runtime: RuntimeDir, paths: Iterable[str]) -> Callable[[], bool]:
    return lambda: all(runtime.has(path) for path in paths)


def _write_if_changed(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _library_steps(
    name: str, runtime: RuntimeDir, host: Host, python_requirements: Sequence[str], python_profile: str
) -> list[Step]:
    library = LIBRARIES[name]
    if name in ("javatuples", "junit5"):
        jars = {path: source for path, source in JAVA_JARS.items() if path in library.paths}

        def copy_jars() -> None:
            for path, source in jars.items():
                target = runtime.path(path)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)

        copies = "copy " + ", ".join(f"{source} -> {runtime.path(path)}" for path, source in jars.items())
        return [Step(f"{name}: {library.description}", _files_done(runtime, jars), [], copy_jars, copies)]
    if name == "node_modules":
        package_json = json.dumps(NODE_PACKAGE_JSON, indent=2) + "\n"
        node_dir = runtime.node_dir

        def write_node_files() -> None:
            _write_if_changed(node_dir / "package.json", package_json)
            _write_if_changed(node_dir / "babel.config.js", BABEL_CONFIG)

        def node_done() -> bool:
            current = node_dir / "package.json"
            return _files_done(runtime, library.paths)() and current.read_text() == package_json

        return [
            Step(
                "node: package.json and babel.config.js (SandboxFusion's jest configuration)",
                lambda: (
                    (node_dir / "package.json").exists()
                    and (node_dir / "package.json").read_text() == package_json
                    and (node_dir / "babel.config.js").exists()
                ),
                [],
                write_node_files,
                f"write {node_dir}/package.json, {node_dir}/babel.config.js",
            ),
            Step(
                f"node_modules: {len(NODE_DEPENDENCIES)} packages from the npm registry",
                node_done,
                [("npm", "install", "--no-audit", "--no-fund", "--loglevel=error")],
                cwd=str(node_dir),
                env=NPM_ENV,
            ),
        ]
    if name == "go_modules":
        go_dir = runtime.go_dir

        def write_go_files() -> None:
            _write_if_changed(go_dir / "go.mod", GO_MOD)
            _write_if_changed(go_dir / "go.sum", "")
            _write_if_changed(go_dir / "main.go", GO_MAIN)
            runtime.gopath.mkdir(parents=True, exist_ok=True)

        return [
            Step(
                f"go: {library.description}",
                _files_done(runtime, library.paths),
                [],
                write_go_files,
                f"write {go_dir}/go.mod, go.sum, main.go; make {runtime.gopath} (Debian: "
                f"{len(GO_DEBIAN_PACKAGES)} golang-*-dev packages)",
            )
        ]
    if name == "python_runtime":
        venv = runtime.venv_dir
        python = host.python
        # The header says what the venv is (RuntimeDir.python_profile reads it): another profile or
        # another interpreter's minor version makes the step run again.
        header = f"# mocksandbox python runtime: profile {python_profile}, CPython {python.minor}\n"
        requirements = header + "\n".join(python_requirements) + "\n"
        stamp = runtime.python_stamp
        requirement_file = str(stamp) + ".new"
        made_on = runtime.python_version()
        # A venv of another minor version is made again (its packages' builds are that version's).
        clear = ("--clear",) if made_on is not None and made_on[:2] != python.version[:2] else ()

        def write_requirements() -> None:
            venv.mkdir(parents=True, exist_ok=True)
            Path(requirement_file).write_text(requirements)

        def python_done() -> bool:
            return stamp.exists() and stamp.read_text() == requirements

        def mark_done() -> None:
            os.replace(requirement_file, stamp)

        installer = host.installer
        commands = installer.venv_commands(python.path, venv, clear=bool(clear))
        first_install = len(commands)
        optional = set()
        torch = [line for line in python_requirements if line.startswith("torch==")]
        if torch:
            # Its CPU build first, from PyTorch's own index (PyPI has only the CUDA one): the
            # requirements then find it installed. Where that index cannot be reached, the
            # requirements take PyPI's build instead (the step says so), without waiting minutes
            # per retry (uv's own timeout is 30 s).
            optional.add(len(commands))
            patience = () if installer.uv else ("--timeout", "30", "--retries", "1")
            commands.append(
                installer.install_command(venv, *patience, "--index-url", TORCH_CPU_INDEX, torch[0])
            )
        commands.append(installer.install_command(venv, "-r", requirement_file))
        return [
            Step(
                f"python: a venv on {python.describe()} with {len(python_requirements)} packages "
                f"from PyPI (profile {python_profile})",
                python_done,
                commands,
                mark_done,
                f"write {requirement_file} first; record it as {stamp} when {installer.name} is done",
                prepare=write_requirements,
                optional=frozenset(optional),
                condensed=frozenset(range(first_install, len(commands))),
                log=runtime.root / "python" / "install.log",
                env=installer.env,
            )
        ]
    # Debian-only libraries (Perl, Lua modules): the package step installs them.
    return []


def _shim_step(name: str, runtime: RuntimeDir, host: Host) -> Step:
    target = runtime.bin_dir / name

    def done() -> bool:
        return os.path.lexists(target)

    if name in ("tsx", "tsc"):

        def link_node_bin() -> None:
            runtime.bin_dir.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.join("..", "node", "node_modules", ".bin", name), target)

        return Step(f"bin/{name} -> node_modules/.bin/{name}", done, [], link_node_bin, f"link {target}")
    if name == "dmd":

        def link_ldmd2() -> None:
            ldmd2 = shutil.which("ldmd2")
            if ldmd2 is None:
                raise RuntimeError("ldmd2 (Debian package ldc) is not on PATH")
            runtime.bin_dir.mkdir(parents=True, exist_ok=True)
            os.symlink(ldmd2, target)

        if host.which("dmd") is not None:
            return Step("dmd: found on PATH", lambda: True)
        return Step("bin/dmd -> LDC's dmd-compatible ldmd2", done, [], link_ldmd2, f"link {target}")
    if name == "kotlin":

        def write_kotlin_shim() -> None:
            kotlinc, kotlin = shutil.which("kotlinc"), shutil.which("kotlin")
            if kotlinc is None or kotlin is None:
                raise RuntimeError("kotlin and kotlinc (Debian package kotlin) are not on PATH")
            runtime.bin_dir.mkdir(parents=True, exist_ok=True)
            target.write_text(KOTLIN_SHIM.format(kotlinc=kotlinc, kotlin=kotlin))
            target.chmod(0o755)

        def kotlin_done() -> bool:
            return done() or _kotlin_runs_scripts(host)

        return Step(
            "bin/kotlin: `kotlin x.kts` on Debian's Kotlin 1.3",
            kotlin_done,
            [],
            write_kotlin_shim,
            f"write {target}",
        )
    raise ValueError(f"no shim named {name}")


def _kotlin_runs_scripts(host: Host) -> bool:
    """Whether the ``kotlin`` on PATH runs ``.kts`` files itself (Kotlin 1.3.70 and later)."""
    kotlin = host.which("kotlin")
    if kotlin is None:
        return False
    try:
        result = subprocess.run([kotlin, "-version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    words = (result.stdout + result.stderr).split()
    version = words[words.index("version") + 1] if "version" in words else ""
    parts = [int(part) for part in version.split("-")[0].split(".")[:2] if part.isdigit()]
    return len(parts) == 2 and tuple(parts) >= (1, 4)


def run_plan(plan: Plan, out: TextIO, dry_run: bool = False) -> int:
    """Run (or, ``dry_run``, print) each step not yet done; 0 when every step is done after."""
    failed = 0
    total = len(plan.steps)
    if not total:
        print("nothing to install for these languages", file=out)
    for number, step in enumerate(plan.steps, 1):
        print(f"[{number}/{total}] {step.title}", file=out, flush=True)
        if step.done():
            print("      already there", file=out, flush=True)
            continue
        if dry_run:
            if step.blocked:
                print(f"      cannot run here: {step.blocked}", file=out)
            for argv in step.commands:
                where = f" (in {step.cwd})" if step.cwd else ""
                print(f"      would run: {_shell_words(argv)}{where}", file=out)
            if step.action_text:
                print(f"      would {step.action_text}", file=out)
            continue
        if step.blocked:
            print(f"      skipped: {step.blocked}", file=out, flush=True)
            failed += 1
            continue
        started = time.monotonic()
        try:
            _run_step(step, out)
        except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
            print(f"      failed: {exc}", file=out, flush=True)
            failed += 1
            continue
        state = "done" if step.done() else "ran, but the result is not complete"
        failed += state != "done"
        print(f"      {state} ({time.monotonic() - started:.1f}s)", file=out, flush=True)
    for reason in plan.unavailable:
        print(f"cannot install here: {reason}", file=out)
    if failed:
        print(f"{failed} step(s) not done", file=out)
    return 1 if failed else 0


def _run_step(step: Step, out: TextIO) -> None:
    env = {**os.environ, **step.env}
    if step.cwd:
        os.makedirs(step.cwd, exist_ok=True)
    if step.prepare is not None:
        step.prepare()
    for index, argv in enumerate(step.commands):
        optional = index in step.optional
        if index in step.condensed:
            # pip's and uv's many lines become one of progress (their output goes to the log).
            code = run_installer(argv, out, env=env, cwd=step.cwd, log=step.log)
            if code != 0 and not optional:
                raise subprocess.CalledProcessError(code, argv)
        else:
            print(f"      $ {_shell_words(argv)}", file=out, flush=True)
            # The tools' own progress goes straight to the terminal (apt and npm draw their own).
            code = subprocess.run(
                argv, cwd=step.cwd, env=env, check=not optional, stdin=subprocess.DEVNULL
            ).returncode
        if code != 0:
            print(
                f"      (that failed, exit status {code}; going on without it)",
                file=out,
                flush=True,
            )
    if step.action is not None:
        step.action()


def _shell_words(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(word) for word in argv)
