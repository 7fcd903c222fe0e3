"""Where a session's commands and tests run: here (the execution engine's runner), or on a
SandboxFusion ``/run_code`` (the adapter of the design document, ``--swedev-backend URL``).

An executor runs a bash script "in" a directory tree (a session's root, or a scoring checkout). The
script speaks real local paths; a remote executor rewrites them to where it uploads the tree,
uploads every file as ``files``, and brings back what the script changed (new and modified files
as a tar archive, and the list of files left, for deletions), so that the session state stays here.
"""

from __future__ import annotations

import base64
import io
import os
import re
import shlex
import tarfile
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import requests

from mocksandbox.execution.engine import CommandRunner
from mocksandbox.execution.process import CommandSpec
from mocksandbox.models import CommandRunStatus
from mocksandbox.sessions.errors import BackendError
from mocksandbox.sessions.isolation import RunWorld


@dataclass(frozen=True)
class ExecResult:
    """What one script did. ``output`` is stdout then stderr; ``error`` is a sandbox failure."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    error: str | None = None


class SessionExecutor(Protocol):
    """Runs a script with ``root`` as its world; changes under ``root`` must be there afterwards."""

    name: str

    def run(
        self,
        root: Path,
        script: str,
        cwd: Path | str,
        timeout: float,
        env: Mapping[str, str],
        world: RunWorld | None = None,
    ) -> ExecResult:
        """``world``: run in a world of its own (local executors of a server with isolation
        ``lite``); ``cwd`` is then a path inside it."""
        ...


class LocalExecutor:
    """Runs scripts through the engine's runner (the same confinement and limits as /run_code)."""

    name = "local"

    def __init__(self, runner: CommandRunner, base_env: Mapping[str, str]) -> None:
        self.runner = runner
        self.base_env = dict(base_env)

    def run(
        self,
        root: Path,
        script: str,
        cwd: Path | str,
        timeout: float,
        env: Mapping[str, str],
        world: RunWorld | None = None,
    ) -> ExecResult:
        result = self.runner.run(
            CommandSpec(
                command=script,
                cwd=str(cwd),
                env={**self.base_env, **env},
                stdin=None,
                timeout=timeout,
                world=None if world is None else world.spec(),
            )
        )
        output = (result.stdout or "") + (result.stderr or "")
        if result.status == CommandRunStatus.Error:
            return ExecResult(output, None, error=result.stderr or "the command could not be started")
        if result.status == CommandRunStatus.TimeLimitExceeded:
            return ExecResult(output, None, timed_out=True)
        return ExecResult(output, result.return_code)


#: Exit status of ``timeout(1)`` when it had to stop the command.
_TIMEOUT_STATUS = 124
#: Extra seconds the remote run may take beyond the command's own limit: upload, sync back.
_REMOTE_HEADROOM_S = 30.0
_CHANGES = "__mocksandbox_changes.tgz"
_LISTING = "__mocksandbox_files.txt"
_STATUS = "__mocksandbox_status.txt"
#: Seconds each start-up probe of a backend may take (the ping; the interpreter and pytest check).
PROBE_TIMEOUT_S = 30.0
#: What to suggest when the backend's interpreter cannot run the tests (SandboxFusion's image).
_RUNTIME_PYTHON_HINT = (
    "point --swedev-backend-python at the interpreter of its sandbox runtime, "
    "e.g. /root/miniconda3/envs/sandbox-runtime/bin/python"
)


@dataclass(frozen=True)
class BackendProbe:
    """What :meth:`RemoteExecutor.probe` found: the backend answers, and runs pytest with ``python``."""

    url: str
    python: str
    python_version: str
    pytest_version: str

    def describe(self) -> str:
        return f"{self.python} (Python {self.python_version}, {self.pytest_version})"


class RemoteExecutor:
    """Runs scripts on a SandboxFusion ``/run_code`` (any: the real service, or another mocksandbox).

    The tree is uploaded with absolute paths under a fresh directory on the remote (SandboxFusion
    writes ``files`` with absolute names where they say), so that paths in commands can be rewritten
    before the run. A wrapper takes a listing of the tree, runs the script under ``timeout``, and
    leaves the changed files and the new listing in the run's own directory for ``fetch_files``.
    """

    def __init__(self, url: str, python: str = "python3", http_timeout_extra_s: float = 60.0) -> None:
        base = url.rstrip("/")
        self.url = base if base.endswith("/run_code") else f"{base}/run_code"
        self.name = f"remote {self.url}"
        self.python = python
        self.http_timeout_extra_s = http_timeout_extra_s
        self.base_url = self.url[: -len("/run_code")]
        self._http = requests.Session()
        self._http.trust_env = False  # never route the sandbox's traffic through a proxy

    def probe(self, timeout: float = PROBE_TIMEOUT_S) -> BackendProbe:
        """Check, before any session, that the backend can run the tests: ``GET /v1/ping`` answers
        ``"pong"``, then (through ``/run_code``, as every command goes) ``python`` runs there and
        ``python -m pytest --version`` works. Each request takes at most ``timeout`` seconds.
        Raises :class:`BackendError` with one line saying what failed and what to do."""
        where = f"--swedev-backend {self.base_url}"
        ping = f"{self.base_url}/v1/ping"
        try:
            response = self._http.get(ping, timeout=timeout)
        except requests.RequestException as exc:
            raise BackendError(
                f"{where}: GET {ping} failed ({_short_error(exc, timeout)}); start SandboxFusion there "
                "or fix the URL"
            ) from None
        if response.status_code != 200 or response.text.strip().strip('"') != "pong":
            raise BackendError(
                f"{where}: GET {ping} answered {response.status_code} {_one_line(response.text, 80)!r}, "
                'not "pong"; give the base URL of a SandboxFusion (the one that serves /run_code)'
            )
        py = shlex.quote(self.python)
        script = (
            "exec 2>&1\n"
            f"{py} -c 'import sys; print(\"__ms_probe python\", sys.version.split()[0])' "
            "|| { echo '__ms_probe failed'; exit 0; }\n"
            f"{py} -m pytest --version || {{ echo '__ms_probe failed'; exit 0; }}\n"
            "echo '__ms_probe ok'\n"
        )
        env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        with tempfile.TemporaryDirectory(prefix="mocksandbox-probe-") as scratch:
            root = Path(scratch)
            ran = self._run(root, script, root, timeout / 2, env, headroom=timeout / 4, http_timeout=timeout)
        if ran.error:
            raise BackendError(
                f"{where}: a bash run on {self.url} failed ({_one_line(ran.error, 300)}); the backend must "
                "run bash with files and fetch_files, as SandboxFusion's /run_code does"
            )
        if ran.timed_out:
            raise BackendError(
                f"{where}: running {self.python} there took more than {timeout / 2:g} s; check the backend"
            )
        lines = [line.strip() for line in ran.output.splitlines() if line.strip()]
        version = next((ln.split()[2] for ln in lines if ln.startswith("__ms_probe python ")), None)
        said = [ln for ln in lines if not ln.startswith("__ms_probe")]
        reason = _reason(said[-1] if said else f"exit code {ran.exit_code}, no output")
        if version is None:
            raise BackendError(
                f"{where}: {self.python} does not run there ({reason}); {_RUNTIME_PYTHON_HINT}"
            )
        pytest_version = next((ln for ln in said if re.match(r"pytest \d", ln)), None)
        if "__ms_probe ok" not in lines or pytest_version is None:
            what = "has no pytest" if "No module named pytest" in reason else "cannot run pytest"
            raise BackendError(f"{where}: {self.python} there {what} ({reason}); {_RUNTIME_PYTHON_HINT}")
        return BackendProbe(self.base_url, self.python, version, pytest_version)

    def run(
        self,
        root: Path,
        script: str,
        cwd: Path | str,
        timeout: float,
        env: Mapping[str, str],
        world: RunWorld | None = None,
    ) -> ExecResult:
        # No world here: the remote sandbox gives the run whatever world it gives its runs.
        return self._run(root, script, Path(cwd), timeout, env)

    def _run(
        self,
        root: Path,
        script: str,
        cwd: Path,
        timeout: float,
        env: Mapping[str, str],
        headroom: float = _REMOTE_HEADROOM_S,
        http_timeout: float | None = None,
    ) -> ExecResult:
        remote_root = f"/tmp/mocksandbox-remote-{uuid.uuid4().hex[:16]}"
        local_root = str(root)

        def remote(text: str) -> str:
            return text.replace(local_root, remote_root)

        sent: dict[str, str] = {}
        tree_files, tree_dirs = _tree(root)
        for path in tree_files:
            rel = path.relative_to(root).as_posix()
            sent[f"{remote_root}/{rel}"] = base64.b64encode(path.read_bytes()).decode("ascii")
        # ``files`` only makes the directories that hold a file: make the empty ones too.
        make_dirs = " ".join(
            shlex.quote(f"{remote_root}/{d.relative_to(root).as_posix()}") for d in tree_dirs
        )
        exports = dict(env)
        if os.path.isabs(self.python):
            exports["PATH"] = f"{os.path.dirname(self.python)}:$PATH"
        export_lines = "".join(
            f"export {key}={_quote_env(remote(value))}\n" for key, value in exports.items()
        )
        inner = f"cd {shlex.quote(remote(str(cwd)))} || exit 1\n{export_lines}{remote(script)}"
        wrapper = f"""__ms_out=$(pwd)
mkdir -p {remote_root} {make_dirs}
__ms_list() {{ (cd {remote_root} && find . -type f -printf '%P\\t%T@\\t%s\\n' | LC_ALL=C sort); }}
__ms_list > "$__ms_out/before.lst"
timeout -k 5 {max(timeout, 0.001):.3f} /bin/bash -c {shlex.quote(inner)} </dev/null
__ms_rc=$?
echo "$__ms_rc" > "$__ms_out/{_STATUS}"
__ms_list > "$__ms_out/after.lst"
cut -f1 "$__ms_out/after.lst" > "$__ms_out/{_LISTING}"
LC_ALL=C comm -13 "$__ms_out/before.lst" "$__ms_out/after.lst" | cut -f1 > "$__ms_out/changed.lst"
(cd {remote_root} && tar czf "$__ms_out/{_CHANGES}" --no-recursion -T "$__ms_out/changed.lst")
rm -rf {remote_root}
exit $__ms_rc
"""
        body = {
            "code": wrapper,
            "language": "bash",
            "run_timeout": timeout + headroom,
            "files": sent,
            "fetch_files": [_CHANGES, _LISTING, _STATUS],
        }
        if http_timeout is None:
            http_timeout = timeout + headroom + self.http_timeout_extra_s
        try:
            response = self._http.post(self.url, json=body, timeout=http_timeout)
            response.raise_for_status()
            answer = response.json()
        except (requests.RequestException, ValueError) as exc:
            return ExecResult("", None, error=f"the sandbox at {self.url} failed: {exc}")
        run = answer.get("run_result") or {}
        output = (run.get("stdout") or "") + (run.get("stderr") or "")
        output = output.replace(remote_root, local_root)
        files = answer.get("files") or {}
        if answer.get("status") == "SandboxError" or _STATUS not in files:
            message = answer.get("message") or run.get("status") or "no result"
            timed_out = run.get("status") == "TimeLimitExceeded"
            return ExecResult(output, None, timed_out=timed_out, error=None if timed_out else str(message))
        _sync_back(root, files, set(sent), remote_root)
        status = int(base64.b64decode(files[_STATUS]).decode().strip() or "1")
        if status == _TIMEOUT_STATUS:
            return ExecResult(output, None, timed_out=True)
        return ExecResult(output, status)


def _one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short_error(exc: requests.RequestException, timeout: float) -> str:
    """The cause of a failed request in a few words (requests' own text nests three exceptions)."""
    if isinstance(exc, requests.Timeout):
        return f"no answer within {timeout:g} s"
    errno = re.search(r"\[Errno -?\d+\] [^'\")]+", str(exc))
    return errno.group(0).strip() if errno else _one_line(str(exc), 200)


def _reason(line: str) -> str:
    """The telling part of a shell's or Python's last line: ``No module named pytest``, ``python3:
    command not found`` (without the ``/bin/bash: line 2:`` before it)."""
    if "No module named pytest" in line:
        return "No module named pytest"
    return _one_line(re.sub(r"^\S*bash: line \d+: ", "", line), 200)


def _quote_env(value: str) -> str:
    # ``$PATH`` inside a value must expand on the remote; everything else is literal.
    if value.endswith(":$PATH"):
        return shlex.quote(value[: -len(":$PATH")]) + ':"$PATH"'
    return shlex.quote(value)


def _tree(root: Path) -> tuple[list[Path], list[Path]]:
    """The regular files under ``root`` and its directories (without ``__pycache__``)."""
    files: list[Path] = []
    dirs: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        dirs.extend(Path(dirpath) / d for d in dirnames)
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                files.append(path)
    return files, dirs


def _sync_back(root: Path, files: Mapping[str, str], sent: set[str], remote_root: str) -> None:
    """Apply the remote run's changes to ``root``: changed files, then deletions."""
    archive = files.get(_CHANGES)
    if archive:
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(archive))) as tar:
            tar.extractall(root, filter="data")
    listing = files.get(_LISTING)
    if listing is None:
        return
    left = {line for line in base64.b64decode(listing).decode("utf-8", "replace").splitlines() if line}
    for name in sent:
        rel = name[len(remote_root) + 1 :]
        if rel not in left:
            (root / rel).unlink(missing_ok=True)
