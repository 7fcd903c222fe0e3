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
import shlex
import tarfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import requests

from mocksandbox.execution.engine import CommandRunner
from mocksandbox.execution.process import CommandSpec
from mocksandbox.models import CommandRunStatus


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
        self, root: Path, script: str, cwd: Path, timeout: float, env: Mapping[str, str]
    ) -> ExecResult: ...


class LocalExecutor:
    """Runs scripts through the engine's runner (the same confinement and limits as /run_code)."""

    name = "local"

    def __init__(self, runner: CommandRunner, base_env: Mapping[str, str]) -> None:
        self.runner = runner
        self.base_env = dict(base_env)

    def run(self, root: Path, script: str, cwd: Path, timeout: float, env: Mapping[str, str]) -> ExecResult:
        result = self.runner.run(
            CommandSpec(
                command=script, cwd=str(cwd), env={**self.base_env, **env}, stdin=None, timeout=timeout
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
        self._http = requests.Session()
        self._http.trust_env = False  # never route the sandbox's traffic through a proxy

    def run(self, root: Path, script: str, cwd: Path, timeout: float, env: Mapping[str, str]) -> ExecResult:
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
            "run_timeout": timeout + _REMOTE_HEADROOM_S,
            "files": sent,
            "fetch_files": [_CHANGES, _LISTING, _STATUS],
        }
        try:
            response = self._http.post(
                self.url, json=body, timeout=timeout + _REMOTE_HEADROOM_S + self.http_timeout_extra_s
            )
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
