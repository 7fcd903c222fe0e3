"""The git work the session layer does itself: base repositories, the model's patch, applying patches.

These are the server's own, trusted operations (argv lists, never the model's text as a command),
run directly with ``subprocess``; what the model asks for runs through the execution engine.
Every call runs with the user's and the system's git config switched off, so that a host's
``~/.gitconfig`` (signing, hooks, pagers) cannot change what a patch or a commit looks like, and
with ``GIT_CEILING_DIRECTORIES`` so that git never climbs out of a session into an enclosing repo.
Every repository is taken as safe (``safe.directory``): a session's is its commands' uid's where
the server gives them what it made (a root server's worlds without idmapped mounts), and git
would otherwise refuse a repository another user owns.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

#: Identity and date of the single commit of every base repository: fixed, so that the commit
#: hash of an instance's base state is the same on every machine (and can be kept in instance.json).
BASE_COMMIT_ENV = {
    "GIT_AUTHOR_NAME": "mocksandbox",
    "GIT_AUTHOR_EMAIL": "mocksandbox@localhost",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "mocksandbox",
    "GIT_COMMITTER_EMAIL": "mocksandbox@localhost",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000",
}
BASE_COMMIT_MESSAGE = "base"
#: Never part of a patch (nor shown by ``git status`` in a session): build and test by-products.
EXCLUDED_PATTERNS = ("__pycache__/", "*.py[cod]", ".pytest_cache/", "*.egg-info/", ".mypy_cache/")
_COPY_IGNORE = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".pytest_cache", "*.egg-info")
_GIT_TIMEOUT_S = 120.0


class GitError(RuntimeError):
    """A git command of ours that failed; the message has git's own words."""


def git_env(ceiling: str | os.PathLike[str] | None = None, **extra: str) -> dict[str, str]:
    """The environment for our git commands: no user or system config, no prompts, C locale."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_TERMINAL_PROMPT="0",
        GIT_PAGER="cat",
        LC_ALL="C",
    )
    if ceiling is not None:
        env["GIT_CEILING_DIRECTORIES"] = str(ceiling)
    env.update(extra)
    return env


def run_git(
    args: Iterable[str],
    cwd: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """``git <args>`` in ``cwd``; raises :class:`GitError` on failure when ``check``."""
    argv = ["git", "-c", "gc.auto=0", "-c", "core.fsmonitor=false", "-c", "safe.directory=*", *args]
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=dict(env) if env is not None else git_env(ceiling=cwd),
        input=stdin,
        capture_output=True,
        timeout=_GIT_TIMEOUT_S,
        check=False,
    )
    if check and done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip() or done.stdout.decode("utf-8", "replace")
        raise GitError(f"git {' '.join(argv[7:])} failed in {cwd}: {message}")
    return done


def tree_fingerprint(source: Path) -> str:
    """A short digest of a directory's files (names, modes, contents), ignoring what a copy ignores."""
    digest = hashlib.sha256()
    for path in sorted(_walk_files(source)):
        rel = path.relative_to(source).as_posix()
        digest.update(rel.encode() + b"\0")
        digest.update(b"x" if os.access(path, os.X_OK) else b"-")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _walk_files(source: Path) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames[:] = [d for d in dirnames if not _COPY_IGNORE(dirpath, [d])]
        ignored = _COPY_IGNORE(dirpath, filenames)
        for name in filenames:
            if name not in ignored:
                yield Path(dirpath) / name


def build_base_repo(source: Path, dest: Path, git_ref: str | None = None) -> str:
    """Make ``dest`` a git repository holding ``source`` as one commit; answer the commit hash.

    ``source`` is a directory at the instance's base state, or (with ``git_ref``) a git repository
    whose ``git_ref`` is the base state (its history is not carried over: a model must not find the
    fix in later commits). Built beside ``dest`` and renamed into place, so concurrent builders and
    interrupted builds never leave a half-made repository behind.
    """
    staging = dest.with_name(f"{dest.name}.building-{uuid.uuid4().hex[:8]}")
    staging.mkdir(parents=True)
    try:
        if git_ref is None:
            shutil.copytree(source, staging, symlinks=True, ignore=_COPY_IGNORE, dirs_exist_ok=True)
        else:
            archive = run_git(["archive", "--format=tar", git_ref], cwd=source).stdout
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(staging, filter="data")
        env = git_env(ceiling=staging.parent, **BASE_COMMIT_ENV)
        run_git(["init", "-q", "-b", "main"], staging, env)
        for key, value in (
            ("user.name", BASE_COMMIT_ENV["GIT_AUTHOR_NAME"]),
            ("user.email", BASE_COMMIT_ENV["GIT_AUTHOR_EMAIL"]),
            ("core.fileMode", "false"),
            ("core.pager", "cat"),
            ("gc.auto", "0"),
        ):
            run_git(["config", key, value], staging, env)
        (staging / ".git" / "info").mkdir(exist_ok=True)
        (staging / ".git" / "info" / "exclude").write_text("\n".join(EXCLUDED_PATTERNS) + "\n")
        run_git(["add", "-A"], staging, env)
        run_git(["commit", "-q", "--no-verify", "--allow-empty", "-m", BASE_COMMIT_MESSAGE], staging, env)
        sha = run_git(["rev-parse", "HEAD"], staging, env).stdout.decode().strip()
        try:
            staging.rename(dest)
        except OSError:
            if not (dest / ".git").is_dir():
                raise
            shutil.rmtree(staging, ignore_errors=True)  # another builder won the race
        return sha
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def head_commit(repo: Path) -> str:
    """The commit hash of ``repo``'s HEAD."""
    return run_git(["rev-parse", "HEAD"], repo, git_env(ceiling=repo.parent)).stdout.decode().strip()


def copy_repo(base: Path, dest: Path) -> None:
    """A private copy of a base repository (work tree and ``.git``), for one session or one scoring."""
    shutil.copytree(base, dest, symlinks=True)


def collect_patch(base: Path, base_sha: str, work_tree: Path, scratch: Path) -> str:
    """The model's change: ``git add -A && git diff --cached <base>``, as SWE-bench harnesses take it.

    Computed against the *base* repository's objects with a private index and object store in
    ``scratch``, so that it does not depend on the session's own ``.git`` (which the model may have
    committed to, reset, or deleted) and leaves the model's index untouched.
    """
    if scratch.exists():
        shutil.rmtree(scratch)
    (scratch / "objects").mkdir(parents=True)
    env = git_env(
        ceiling=work_tree.parent,
        GIT_DIR=str(base / ".git"),
        GIT_WORK_TREE=str(work_tree),
        GIT_INDEX_FILE=str(scratch / "index"),
        GIT_OBJECT_DIRECTORY=str(scratch / "objects"),
        GIT_ALTERNATE_OBJECT_DIRECTORIES=str(base / ".git" / "objects"),
    )
    try:
        run_git(["read-tree", base_sha], work_tree, env)
        run_git(["add", "-A", "--", "."], work_tree, env)
        diff = run_git(
            ["diff", "--cached", "--binary", "--no-color", "--no-ext-diff", base_sha], work_tree, env
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return diff.stdout.decode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class ApplyResult:
    """Whether a patch applied, and what git said."""

    ok: bool
    output: str


def apply_patch(repo: Path, patch: str, ceiling: Path) -> ApplyResult:
    """Apply ``patch`` to the work tree of ``repo`` as SWE-bench's harness tries it: ``git apply``,
    then ``git apply --recount`` (hand-written hunks often miscount), then ``patch --fuzz``."""
    data = patch.encode("utf-8", "surrogateescape")
    if not data.endswith(b"\n"):
        data += b"\n"
    env = git_env(ceiling=ceiling)
    outputs = []
    for args in (
        ["apply", "-v", "--whitespace=nowarn", "-"],
        ["apply", "-v", "--whitespace=nowarn", "--recount", "-"],
    ):
        done = run_git(args, repo, env, stdin=data, check=False)
        text = (done.stdout + done.stderr).decode("utf-8", "replace")
        if done.returncode == 0:
            return ApplyResult(True, text)
        outputs.append(text)
    if shutil.which("patch"):
        dry = subprocess.run(
            ["patch", "--batch", "--fuzz=5", "-p1", "--dry-run", "--forward"],
            cwd=repo,
            input=data,
            capture_output=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
        if dry.returncode == 0:
            done2 = subprocess.run(
                ["patch", "--batch", "--fuzz=5", "-p1", "--forward"],
                cwd=repo,
                input=data,
                capture_output=True,
                timeout=_GIT_TIMEOUT_S,
                check=False,
            )
            if done2.returncode == 0:
                return ApplyResult(True, done2.stdout.decode("utf-8", "replace"))
    return ApplyResult(False, outputs[0])


_DIFF_HEADER = re.compile(r"^diff --git a/(.+?) b/(.+)$")


def split_patch(patch: str) -> list[tuple[str, str]]:
    """``patch`` as ``(path, section)`` pairs, one per file (``diff --git`` sections; the path is the
    new name, or the old one for a deletion)."""
    sections: list[tuple[str, str]] = []
    current: list[str] = []
    path = ""
    for line in patch.splitlines(keepends=True):
        match = _DIFF_HEADER.match(line.rstrip("\n"))
        if match:
            if current:
                sections.append((path, "".join(current)))
            current, path = [line], match.group(2)
        elif current:
            current.append(line)
    if current:
        sections.append((path, "".join(current)))
    return sections


def changed_paths(patch: str) -> list[str]:
    """Paths a ``git diff`` touches (both names of a rename)."""
    paths: list[str] = []
    for line in patch.splitlines():
        match = _DIFF_HEADER.match(line)
        if match:
            for name in match.groups():
                if name not in paths:
                    paths.append(name)
    return paths


def is_test_path(path: str) -> bool:
    """Whether ``path`` is a test file by the usual conventions (a ``test``/``tests``/``testing``
    directory, ``test_*.py``, ``*_test.py``, ``conftest.py``)."""
    parts = path.split("/")
    name = parts[-1]
    if any(part in ("test", "tests", "testing") for part in parts[:-1]):
        return True
    return name == "conftest.py" or (
        name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))
    )


def without_paths(patch: str, drop: set[str]) -> tuple[str, list[str]]:
    """``patch`` without the sections for test files and ``drop``; also the paths left out."""
    kept, dropped = [], []
    for path, section in split_patch(patch):
        if path in drop or is_test_path(path):
            dropped.append(path)
        else:
            kept.append(section)
    return "".join(kept), dropped


def restore_paths(repo: Path, base_sha: str, paths: Iterable[str], ceiling: Path) -> None:
    """Put ``paths`` back to their base state (removing those that did not exist at the base)."""
    env = git_env(ceiling=ceiling)
    for path in paths:
        exists = run_git(["cat-file", "-e", f"{base_sha}:{path}"], repo, env, check=False).returncode == 0
        if exists:
            run_git(["checkout", base_sha, "--", path], repo, env)
        else:
            target = repo / path
            if target.is_file() or target.is_symlink():
                target.unlink()
