"""``mocksandbox languages``: which languages run, with which toolchain and runtime libraries.

For this host the answer comes from PATH (the runtime's ``bin/`` first), the toolchains' version
commands and the runtime dir; for a deployment (``--url``) from programs sent to ``/run_code``:
a hello world per language, one program per runtime library, and one bash run that prints the
toolchains' versions (so it works against SandboxFusion itself as well as against this mock).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import requests

from mocksandbox.runtime.catalog import LANGUAGE_NEEDS, LIBRARIES, install_hint
from mocksandbox.runtime.layout import RuntimeDir
from mocksandbox.runtime.probes import HELLO, LIBRARY_PROBES, Probe


@dataclass
class LanguageStatus:
    """One row of the table."""

    language: str
    runs: bool
    #: ``name version`` or what is missing.
    toolchain: str
    #: Library name → present.
    libraries: dict[str, bool] = field(default_factory=dict)
    #: The ``runtime install`` line that adds what is missing, or why nothing can.
    to_add: str = ""


def first_line(text: str, width: int = 48) -> str:
    for line in text.splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= width else line[: width - 1] + "…"
    return ""


def _hint(language: str, missing_toolchain: bool, missing_libraries: Sequence[str]) -> str:
    needs = LANGUAGE_NEEDS[language]
    reasons = []
    if missing_toolchain and needs.toolchain.unavailable:
        reasons.append(needs.toolchain.unavailable)
    reasons += [LIBRARIES[name].unavailable for name in missing_libraries if LIBRARIES[name].unavailable]
    if reasons:
        return "not installable here: " + "; ".join(reasons)
    if missing_toolchain or missing_libraries:
        return install_hint(language)
    return ""


def host_languages(runtime: RuntimeDir, python: str, timeout: float = 30.0) -> list[LanguageStatus]:
    """The table for this host: the toolchains runs would find, their versions, the libraries."""
    path = f"{runtime.bin_dir}:{os.environ.get('PATH', os.defpath)}"
    env = {**os.environ, "PATH": path}

    def version(argv: Sequence[str]) -> str:
        try:
            result = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=timeout, env=env, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"({type(exc).__name__})"
        line = first_line(result.stdout) or first_line(result.stderr)
        # Some print a bare number (npm, node): say whose it is.
        return line if argv[0].lower() in line.lower() else f"{argv[0]} {line}"

    def probe_library(name: str) -> bool:
        library = LIBRARIES[name]
        if library.paths:
            return all(runtime.has(path) for path in library.paths)
        if library.probe_argv and shutil.which(library.probe_argv[0], path=path):
            result = subprocess.run(list(library.probe_argv), capture_output=True, env=env, check=False)
            return result.returncode == 0
        return False

    def row(language: str) -> LanguageStatus:
        needs = LANGUAGE_NEEDS[language]
        libraries = {name: probe_library(name) for name in needs.libraries}
        if needs.python:
            # Settings.python: the runtime's venv if installed, else the server's own interpreter.
            found = os.path.exists(python)
            toolchain = f"python: {version([python, '--version'])}" if found else f"missing: {python}"
            if language == "python_gpu" and shutil.which("nvidia-smi", path=path) is None:
                found, toolchain = False, "missing: nvidia-smi (no GPU)"
        else:
            missing = [b for b in needs.toolchain.binaries if shutil.which(b, path=path) is None]
            found = not missing
            toolchain = version(needs.toolchain.version_argv) if found else "missing: " + ", ".join(missing)
        absent = [name for name, present in libraries.items() if not present]
        return LanguageStatus(language, found, toolchain, libraries, _hint(language, not found, absent))

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(row, LANGUAGE_NEEDS))


def remote_languages(
    url: str,
    timeout: float = 120.0,
    post: Callable[[str, Mapping[str, Any], float], Mapping[str, Any]] | None = None,
) -> list[LanguageStatus]:
    """The table for a deployment, from programs sent to its ``/run_code``."""
    base = url.rstrip("/")

    def default_post(path: str, body: Mapping[str, Any], limit: float) -> Mapping[str, Any]:
        reply = requests.post(base + path, json=body, timeout=limit)
        reply.raise_for_status()
        result: Mapping[str, Any] = reply.json()
        return result

    send = post or default_post

    def passes(probe: Probe) -> bool:
        try:
            body = send(
                "/run_code",
                {"code": probe.code, "language": probe.language, "compile_timeout": 60, "run_timeout": 60},
                timeout,
            )
        except (requests.RequestException, ValueError):
            return False
        stdout = (body.get("run_result") or {}).get("stdout") or ""
        return body.get("status") == "Success" and (probe.stdout is None or probe.stdout in stdout)

    versions = _remote_versions(send, timeout)
    library_names = sorted({name for needs in LANGUAGE_NEEDS.values() for name in needs.libraries})
    with ThreadPoolExecutor(max_workers=4) as pool:
        hello = dict(zip(HELLO, pool.map(passes, HELLO.values()), strict=True))
        library_present = dict(
            zip(
                library_names,
                pool.map(lambda name: all(map(passes, LIBRARY_PROBES.get(name, ()))), library_names),
                strict=True,
            )
        )
    rows = []
    for language, needs in LANGUAGE_NEEDS.items():
        runs = hello.get(language, False)
        libraries = {name: library_present[name] for name in needs.libraries}
        absent = [name for name, present in libraries.items() if not present]
        rows.append(
            LanguageStatus(
                language, runs, versions.get(language, "?"), libraries, _hint(language, not runs, absent)
            )
        )
    return rows


def _remote_versions(
    send: Callable[[str, Mapping[str, Any], float], Mapping[str, Any]], timeout: float
) -> dict[str, str]:
    """Each toolchain's version line, printed by one bash program on the deployment."""
    lines = []
    for language, needs in LANGUAGE_NEEDS.items():
        argv = ("python", "--version") if needs.python else needs.toolchain.version_argv
        if not argv:
            continue
        command = " ".join(map(shlex.quote, argv))
        lines.append(
            f"if command -v {shlex.quote(argv[0])} >/dev/null 2>&1; then "
            f"v=$({command} 2>&1 | grep -m1 .); else v='missing: {argv[0]}'; fi; "
            f'printf "%s\\t%s\\n" {shlex.quote(language)} "$v"'
        )
    try:
        body = send("/run_code", {"code": "\n".join(lines), "language": "bash", "run_timeout": 60}, timeout)
    except (requests.RequestException, ValueError):
        return {}
    versions = {}
    for line in ((body.get("run_result") or {}).get("stdout") or "").splitlines():
        language, _, version = line.partition("\t")
        versions[language] = first_line(version)
    return versions


def format_table(rows: Iterable[LanguageStatus]) -> str:
    """The table as text, one language per line, then what to run for what is missing."""
    rows = list(rows)
    header = ("LANGUAGE", "RUNS", "TOOLCHAIN", "RUNTIME LIBRARIES")
    table = [header]
    for row in rows:
        libraries = ", ".join(
            f"{name}{'' if present else ' (missing)'}" for name, present in row.libraries.items()
        )
        table.append((row.language, "yes" if row.runs else "no", row.toolchain, libraries or "-"))
    widths = [max(len(line[i]) for line in table) for i in range(3)]
    text = [
        "  ".join(cell.ljust(widths[i]) if i < 3 else cell for i, cell in enumerate(line)).rstrip()
        for line in table
    ]
    todo = [row for row in rows if row.to_add]
    if todo:
        text.append("")
        text += [f"{row.language}: {row.to_add}" for row in todo]
    runs = sum(row.runs for row in rows)
    text.append(f"{runs} of {len(rows)} languages run")
    return "\n".join(text)


def runtime_summary(runtime: RuntimeDir, python: str) -> str:
    """One line for ``serve``: the runtime dir, the libraries in it, how many toolchains are found.
    Only looks at files and PATH, so it costs no program start."""
    path = f"{runtime.bin_dir}:{os.environ.get('PATH', os.defpath)}"
    present = [
        name for name, library in LIBRARIES.items() if library.paths and all(map(runtime.has, library.paths))
    ]
    toolchains = sum(
        (os.path.exists(python) or not needs.python)
        and all(shutil.which(b, path=path) for b in needs.toolchain.binaries)
        for needs in LANGUAGE_NEEDS.values()
    )
    where = f"{runtime.root} ({', '.join(present)})" if present else f"none in {runtime.root}"
    return (
        f"{where}; toolchains for {toolchains} of {len(LANGUAGE_NEEDS)} languages "
        "(mocksandbox languages: details and what to install)"
    )


def missing_for(runtime: RuntimeDir, language: str, libraries: Iterable[str] = ()) -> str | None:
    """Why ``language`` (with ``libraries``) cannot run here, or ``None``: binaries on PATH (the
    runtime's ``bin/`` first) and libraries present. Cheap: no toolchain is started, except a
    library's probe command (Perl and Lua modules)."""
    path = f"{runtime.bin_dir}:{os.environ.get('PATH', os.defpath)}"
    absent = [b for b in LANGUAGE_NEEDS[language].toolchain.binaries if shutil.which(b, path=path) is None]
    if absent:
        return f"{language}: toolchain binary not on PATH: {', '.join(absent)}"
    for name in libraries:
        library = LIBRARIES[name]
        if library.paths:
            present = all(map(runtime.has, library.paths))
        elif shutil.which(library.probe_argv[0], path=path) is None:
            present = False
        else:
            env = {**os.environ, "PATH": path}
            result = subprocess.run(list(library.probe_argv), capture_output=True, env=env, check=False)
            present = result.returncode == 0
        if not present:
            return f"runtime library {name} is not installed in {runtime.root} ({install_hint(language)})"
    return None
