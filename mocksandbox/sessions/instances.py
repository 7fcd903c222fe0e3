"""SWE-bench-style task instances: rows in SWE-bench's own schema plus a repository snapshot.

Two layouts are read:

* an **instance directory** (what ``fixtures/swedev/<name>/`` holds)::

      instance.json   one SWE-bench row: instance_id, repo, version, base_commit, problem_statement,
                      hints_text, patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS, created_at,
                      environment_setup_commit, and instance_hash (md5(instance_id) mod 2**63)
      repo/           the repository at its base state (plain files)
      gold.patch      the gold fix (the same diff as the row's ``patch``)
      test.patch      the tests of the fix (the same diff as the row's ``test_patch``)

* a **JSONL file of rows** (``*.jsonl``) with the snapshots beside it in ``repos/<instance_id>/``
  (or where a row's ``repo_path`` says, relative to the file): plain files at the base state, or a
  git repository that holds the row's ``base_commit``.

A directory given to :func:`load_instances` may be one instance, or hold instance directories and
JSONL files. ``FAIL_TO_PASS``/``PASS_TO_PASS`` are lists, or JSON strings of lists as on the Hub.
Extension (not in SWE-bench's schema): ``env``, a mapping of environment variables for the
instance's commands and tests.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mocksandbox.sessions.errors import InstanceError, UnknownInstanceError
from mocksandbox.sessions.gitops import build_base_repo, head_commit, tree_fingerprint

log = logging.getLogger(__name__)

#: The four sample instances shipped in the package (``samples`` is a link to ``fixtures/swedev`` in
#: a checkout; the wheel and the sdist hold the files themselves).
SHIPPED_INSTANCES_DIR = Path(__file__).resolve().parent / "samples"
_REQUIRED = ("instance_id", "repo", "version", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")


def instance_hash(instance_id: str) -> int:
    """verl's ``instance_hash``: md5 of the ``instance_id`` as an integer, mod 2**63 (fits an int64)."""
    return int(hashlib.md5(instance_id.encode("utf-8")).hexdigest(), 16) % (2**63)


def workspace_dir_name(repo: str, version: str) -> str:
    """The directory the prompt names, ``/workspace/<this>``: OpenHands' SWE-bench convention."""
    return f"{repo}__{version}".replace("/", "__")


def _test_list(value: Any, key: str, where: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise InstanceError(f"{where}: {key} is a string but not a JSON list") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InstanceError(f"{where}: {key} must be a list of test ids (or a JSON string of one)")
    return list(value)


@dataclass(frozen=True)
class Instance:
    """One task: a SWE-bench row and where its base repository comes from."""

    instance_id: str
    repo: str
    version: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    instance_hash: int
    #: The repository snapshot: a directory at the base state, or a git repo (with ``git_ref``).
    source: Path
    git_ref: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    #: The row as loaded (every field, including ones this server does not use).
    row: Mapping[str, Any] = field(default_factory=dict)
    origin: str = ""

    @property
    def workspace_name(self) -> str:
        return workspace_dir_name(self.repo, self.version)

    @property
    def workspace_path(self) -> str:
        """The repository's path as the agent's prompt names it."""
        return f"/workspace/{self.workspace_name}"

    def summary(self) -> dict[str, Any]:
        """What ``GET /_mock/instances`` shows."""
        return {
            "instance_id": self.instance_id,
            "instance_hash": str(self.instance_hash),
            "repo": self.repo,
            "version": self.version,
            "workspace": self.workspace_path,
            "FAIL_TO_PASS": list(self.fail_to_pass),
            "PASS_TO_PASS": list(self.pass_to_pass),
            "origin": self.origin,
        }


def instance_from_row(
    row: Mapping[str, Any], source: Path, where: str, git_ref: str | None = None, gold: str | None = None
) -> Instance:
    """Check a SWE-bench row and make an :class:`Instance` of it."""
    missing = [key for key in _REQUIRED if key not in row]
    if missing:
        raise InstanceError(f"{where}: missing field(s) {', '.join(missing)}")
    instance_id = row["instance_id"]
    if not isinstance(instance_id, str) or not instance_id:
        raise InstanceError(f"{where}: instance_id must be a non-empty string")
    expected = instance_hash(instance_id)
    given = row.get("instance_hash")
    if given is not None and str(given) != str(expected):
        raise InstanceError(
            f"{where}: instance_hash {given} is not md5({instance_id!r}) mod 2**63 = {expected}"
        )
    patch = row.get("patch") or ""
    if gold is not None:
        if patch and patch != gold:
            raise InstanceError(f"{where}: gold.patch differs from the row's patch")
        patch = gold
    if not str(row["test_patch"]).strip():
        # Scoring applies it and runs the tests it adds: with none, no episode could be scored.
        raise InstanceError(f"{where}: test_patch is empty (it must be the diff adding the tests)")
    env = row.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise InstanceError(f"{where}: env must map variable names to strings")
    if not source.is_dir():
        raise InstanceError(f"{where}: repository snapshot {source} is not a directory")
    return Instance(
        instance_id=instance_id,
        repo=str(row["repo"]),
        version=str(row["version"]),
        base_commit=str(row.get("base_commit") or ""),
        problem_statement=str(row.get("problem_statement") or ""),
        patch=patch,
        test_patch=str(row["test_patch"]),
        fail_to_pass=tuple(_test_list(row["FAIL_TO_PASS"], "FAIL_TO_PASS", where)),
        pass_to_pass=tuple(_test_list(row["PASS_TO_PASS"], "PASS_TO_PASS", where)),
        instance_hash=expected,
        source=source,
        git_ref=git_ref,
        env=dict(env),
        row=dict(row),
        origin=where,
    )


def load_instance_dir(directory: Path) -> Instance:
    """An instance directory: ``instance.json``, ``repo/``, ``gold.patch``, ``test.patch``."""
    where = str(directory)
    try:
        row = json.loads((directory / "instance.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InstanceError(f"{where}/instance.json: {exc}") from None
    if not isinstance(row, dict):
        raise InstanceError(f"{where}/instance.json must hold one JSON object (a SWE-bench row)")
    gold_file = directory / "gold.patch"
    gold = gold_file.read_text(encoding="utf-8") if gold_file.is_file() else None
    test_file = directory / "test.patch"
    if test_file.is_file():
        test_patch = test_file.read_text(encoding="utf-8")
        if row.get("test_patch") and row["test_patch"] != test_patch:
            raise InstanceError(f"{where}: test.patch differs from the row's test_patch")
        row["test_patch"] = test_patch
    return instance_from_row(row, directory / "repo", where, gold=gold)


def load_jsonl(path: Path) -> list[Instance]:
    """Rows of a JSONL file, with snapshots in ``repos/<instance_id>/`` beside it (or ``repo_path``)."""
    instances = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InstanceError(f"{path}: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InstanceError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise InstanceError(f"{where}: each line must be one JSON object")
        snapshot = path.parent / str(row.get("repo_path") or Path("repos") / str(row.get("instance_id")))
        git_ref = None
        if (snapshot / ".git").exists():
            git_ref = str(row.get("base_commit") or "HEAD")
        instances.append(instance_from_row(row, snapshot, where, git_ref=git_ref))
    return instances


def load_instances(paths: Iterable[str | Path]) -> dict[str, Instance]:
    """Every instance under ``paths``, by ``instance_id``; later paths override earlier ones."""
    found: dict[str, Instance] = {}

    def add(instance: Instance) -> None:
        if instance.instance_id in found:
            log.info("instance %s from %s replaces the one from %s", instance.instance_id,
                     instance.origin, found[instance.instance_id].origin)  # fmt: skip
        found[instance.instance_id] = instance

    for entry in paths:
        path = Path(entry).expanduser()
        if path.is_file() and path.suffix == ".jsonl":
            for instance in load_jsonl(path):
                add(instance)
        elif path.is_dir() and (path / "instance.json").is_file():
            add(load_instance_dir(path))
        elif path.is_dir():
            for child in sorted(path.iterdir()):
                if child.is_dir() and (child / "instance.json").is_file():
                    add(load_instance_dir(child))
                elif child.is_file() and child.suffix == ".jsonl":
                    for instance in load_jsonl(child):
                        add(instance)
        else:
            raise InstanceError(f"{path}: not an instance directory, a directory of them, or a .jsonl file")
    return found


class InstanceRegistry:
    """The loaded instances, looked up by ``instance_hash``, and their base repositories (built
    once, on first use, into ``bases_dir``)."""

    def __init__(self, instances: Mapping[str, Instance]) -> None:
        self._by_id = dict(instances)
        self._by_hash = {inst.instance_hash: inst for inst in self._by_id.values()}
        self._bases: dict[tuple[str, Path], tuple[Path, str]] = {}
        self._build_locks: dict[tuple[str, Path], threading.Lock] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_paths(cls, paths: Iterable[str | Path], include_shipped: bool = True) -> InstanceRegistry:
        all_paths: list[str | Path] = []
        if include_shipped and SHIPPED_INSTANCES_DIR.is_dir():
            all_paths.append(SHIPPED_INSTANCES_DIR)
        all_paths.extend(paths)
        return cls(load_instances(all_paths))

    def __len__(self) -> int:
        return len(self._by_id)

    def all(self) -> list[Instance]:
        return sorted(self._by_id.values(), key=lambda inst: inst.instance_id)

    def get(self, instance_id: str) -> Instance:
        try:
            return self._by_id[instance_id]
        except KeyError:
            raise UnknownInstanceError(
                f"unknown instance_id {instance_id!r}: no loaded instance has it ({len(self._by_id)} "
                "instance(s) loaded; GET /_mock/instances lists them)"
            ) from None

    def find(self, key: int | str) -> Instance:
        """The instance for an ``instance_hash`` sent as an int or a decimal string. As a convenience
        for hand-written clients, an ``instance_id`` is accepted too."""
        number: int | None = None
        if isinstance(key, int) and not isinstance(key, bool):
            number = key
        elif isinstance(key, str) and key.strip().lstrip("+-").isdigit():
            number = int(key.strip())
        if number is not None:
            if number in self._by_hash:
                return self._by_hash[number]
        elif isinstance(key, str) and key in self._by_id:
            return self._by_id[key]
        raise UnknownInstanceError(
            f"unknown instance_hash {key!r}: no loaded instance has it ({len(self._by_id)} instance(s) "
            "loaded; GET /_mock/instances lists them with their hashes)"
        )

    def base_repo(self, instance: Instance, bases_dir: Path) -> tuple[Path, str]:
        """The instance's base repository under ``bases_dir`` and its commit, built on first use."""
        cache_key = (instance.instance_id, bases_dir)
        with self._lock:
            if cache_key in self._bases:
                return self._bases[cache_key]
            lock = self._build_locks.setdefault(cache_key, threading.Lock())
        with lock:
            with self._lock:
                if cache_key in self._bases:
                    return self._bases[cache_key]
            fingerprint = tree_fingerprint(instance.source) if instance.git_ref is None else instance.git_ref
            key = hashlib.sha256(f"{instance.instance_id}\0{fingerprint}".encode()).hexdigest()[:16]
            dest = bases_dir / f"{_safe_name(instance.instance_id)}-{key}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            # Worker processes sharing a state dir build each base once: the others wait for it.
            with open(dest.parent / f".{dest.name}.lock", "a") as build_lock:
                fcntl.flock(build_lock, fcntl.LOCK_EX)
                if (dest / ".git").is_dir():
                    sha = head_commit(dest)
                else:
                    sha = build_base_repo(instance.source, dest, instance.git_ref)
                    if instance.base_commit and instance.git_ref is None and sha != instance.base_commit:
                        log.info("instance %s: base commit built as %s (instance.json says %s)",
                                 instance.instance_id, sha, instance.base_commit)  # fmt: skip
            with self._lock:
                self._bases[cache_key] = (dest, sha)
            return dest, sha

    def forget_bases(self, bases_dir: Path) -> None:
        """Forget the base repositories built in ``bases_dir`` (it is being removed)."""
        with self._lock:
            for key in [key for key in self._bases if key[1] == bases_dir]:
                del self._bases[key]
                self._build_locks.pop(key, None)


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80]
