"""The session layer: the four swedev operations over instances, work dirs, executors and the store.

A session's directory (``<state_dir>/sessions/<sid>/``) holds ``workspace/<repo>__<version>/`` (a
private git checkout of the instance's base state), ``tmp/`` (its private ``/tmp``) and ``ctl/``
(the shell's working directory, the editor's undo history). Actions on one session run one at a
time; sessions run side by side. Every state change is written to SQLite before it is answered.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shlex
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from mocksandbox.execution.engine import CommandRunner, program_environment
from mocksandbox.execution.world import RunOwner, remove_own_tree
from mocksandbox.sessions.actions import (
    ActionError,
    DiffBlock,
    FunctionCall,
    observation,
    parse_action,
    truncate_observation,
)
from mocksandbox.sessions.editor import Editor
from mocksandbox.sessions.errors import (
    ScoringError,
    SessionEndedError,
    SessionLimitError,
    StateDirError,
    UnknownSessionError,
)
from mocksandbox.sessions.executor import (
    PROBE_TIMEOUT_S,
    BackendProbe,
    ExecResult,
    LocalExecutor,
    RemoteExecutor,
    SessionExecutor,
)
from mocksandbox.sessions.gitops import GitError, apply_patch, collect_patch, copy_repo
from mocksandbox.sessions.instances import Instance, InstanceRegistry
from mocksandbox.sessions.isolation import (
    MOUNT_POINT,
    Isolation,
    IsolationSetting,
    RunWorld,
    choose_isolation,
)
from mocksandbox.sessions.paths import SAFE_ROOT, PathMap
from mocksandbox.sessions.reward import RewardMode, RewardResult, score
from mocksandbox.sessions.store import SessionRecord, SessionStore
from mocksandbox.settings import Settings

log = logging.getLogger(__name__)

_CONTROL_KEYS = {"C-c", "C-d", "C-z", "ctrl+c", "ctrl-c"}


@dataclass(frozen=True)
class SessionConfig:
    """The settings the session layer reads (see :class:`mocksandbox.settings.Settings`)."""

    state_dir: str | None = None
    tmp_root: str | None = None
    session_ttl_s: float = 3600.0
    max_sessions: int = 1024
    reward_mode: RewardMode = "f2p"
    command_timeout_s: float = 120.0
    reward_timeout_s: float = 600.0
    max_timeout_s: float = 3600.0
    #: Interpreter for the tests (``<python> -m pytest``); its directory goes first on ``PATH``.
    python: str = "python3"
    backend: str | None = None
    backend_python: str = "python3"
    #: ``auto``: a world per session where the server makes worlds (isolation ``lite``), else a
    #: private mount namespace per command where possible, else path translation.
    isolation: IsolationSetting = "auto"

    @classmethod
    def from_settings(cls, settings: Settings) -> SessionConfig:
        return cls(
            state_dir=settings.state_dir,
            tmp_root=settings.tmp_root,
            session_ttl_s=settings.session_ttl_s,
            max_sessions=settings.max_sessions,
            reward_mode=settings.reward_mode,
            command_timeout_s=settings.session_command_timeout_s,
            reward_timeout_s=settings.reward_timeout_s,
            max_timeout_s=settings.max_timeout_s,
            python=settings.python,
            backend=settings.swedev_backend,
            backend_python=settings.swedev_backend_python,
            isolation=settings.session_isolation,
        )


@dataclass(frozen=True)
class _Workspace:
    """One live session's directories and helpers."""

    record: SessionRecord
    instance: Instance
    root: Path
    repo: Path
    paths: PathMap

    @property
    def ctl(self) -> Path:
        return self.root / "ctl"


class SessionManager:
    """Sessions over the loaded instances. Nothing touches the disk until the first session (or
    at once, when a ``state_dir`` is configured, so that a bad one fails at start-up)."""

    def __init__(
        self,
        config: SessionConfig,
        registry: InstanceRegistry,
        executor: SessionExecutor,
        clock: Callable[[], float] = time.time,
        runs_in_worlds: bool = False,
        run_owner: RunOwner | None = None,
    ) -> None:
        self.config = config
        self.registry = registry
        self.executor = executor
        #: The server gives its runs worlds of their own (isolation ``lite``): so can the sessions.
        self.runs_in_worlds = runs_in_worlds
        #: Whom what the server makes for a command in a world is given to, where what it writes
        #: as itself would not be the command's own (``RunOwner``: a root server's runs without
        #: idmapped mounts), else ``None``.
        self.run_owner = run_owner
        #: Wall-clock time: TTLs must survive a restart, which monotonic time does not.
        self.clock = clock
        self._lock = threading.RLock()
        self._session_locks: dict[str, threading.Lock] = {}
        self._state_dir: Path | None = None
        self._ephemeral = config.state_dir is None
        self._store: SessionStore | None = None
        self._lock_file: TextIO | None = None
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        self._isolation: tuple[Isolation, str] | None = None
        #: Instances whose tests were seen to report results here (see ``score``'s ``tests_known_to_run``).
        self._tests_run: set[str] = set()
        #: One of several processes over a state dir prepared by another (see :meth:`create`).
        self._shared = False

    @classmethod
    def create(
        cls,
        settings: Settings,
        runner: CommandRunner,
        clock: Callable[[], float] = time.time,
        shared_state_dir: bool = False,
        runs_in_worlds: bool = False,
        run_owner: RunOwner | None = None,
    ) -> SessionManager:
        """The session layer for ``settings``: instances loaded and checked, executor chosen.

        ``shared_state_dir``: this is one of several worker processes over ``settings.state_dir``,
        which the process that started them prepared and locked (:func:`open_shared_state_dir`):
        no lock and no recovery here, and every session is locked across processes.
        ``runs_in_worlds``: ``runner`` makes worlds (the engine's isolation is ``lite``);
        ``run_owner``: whom what the server makes for them is given to (``Isolation.run_owner``)."""
        registry = InstanceRegistry.from_paths(settings.instances_dirs)
        config = SessionConfig.from_settings(settings)
        executor: SessionExecutor
        if config.backend:
            executor = RemoteExecutor(config.backend, python=config.backend_python)
        else:
            base_env = program_environment(os.environ, settings.run_env_keep)
            base_env["PATH"] = f"{Path(config.python).parent}:{base_env.get('PATH', os.defpath)}"
            executor = LocalExecutor(runner, base_env)
        local = isinstance(executor, LocalExecutor)
        manager = cls(
            config, registry, executor, clock, runs_in_worlds=runs_in_worlds and local, run_owner=run_owner
        )
        manager._shared = shared_state_dir
        if config.state_dir is not None:
            manager._ensure_open()
        return manager

    # -- state dir, store, reaper ---------------------------------------------------------------

    @property
    def state_dir(self) -> Path | None:
        return self._state_dir

    def _ensure_open(self) -> SessionStore:
        with self._lock:
            if self._store is not None:
                return self._store
            if self.config.state_dir is not None:
                state_dir = Path(self.config.state_dir).expanduser().resolve()
                state_dir.mkdir(parents=True, exist_ok=True)
            else:
                state_dir = Path(tempfile.mkdtemp(prefix="mocksandbox-state-", dir=self.config.tmp_root))
            state_dir = state_dir.resolve()
            if not SAFE_ROOT.match(str(state_dir)):
                raise StateDirError(
                    f"state dir {state_dir}: use a path of letters, digits, '_', '.', '-' and '/' only "
                    "(session paths are written into shell commands)"
                )
            lock_file = None if self._shared else _lock_state_dir(state_dir)
            for sub in STATE_SUBDIRS:
                (state_dir / sub).mkdir(exist_ok=True)
            store = SessionStore(state_dir / "sessions.sqlite3")
            self._state_dir, self._store, self._lock_file = state_dir, store, lock_file
            if not self._shared:  # the process that prepared a shared dir recovered it already
                recover_state_dir(store, state_dir, self.clock)
            self._stop.clear()
            self._reaper = threading.Thread(target=self._reap_forever, name="mocksandbox-reaper", daemon=True)
            self._reaper.start()
            return store

    def _reap_forever(self) -> None:
        interval = min(max(self.config.session_ttl_s / 4, 0.5), 30.0)
        while not self._stop.wait(interval):
            try:
                self.expire_idle()
            except Exception:  # a reaper that dies would leak every later session
                log.exception("expiring idle sessions failed")

    @contextmanager
    def _session_lock(self, sid: str, blocking: bool = True) -> Iterator[bool]:
        """One action at a time per session: a lock per thread of this process and, with a shared
        state dir, a file lock across the worker processes."""
        with self._lock:
            lock = self._session_locks.setdefault(sid, threading.Lock())
        if not lock.acquire(blocking):
            yield False
            return
        try:
            if self._shared and self._state_dir is not None:
                with _file_lock(self._state_dir / "locks" / sid, blocking) as taken:
                    yield taken
            else:
                yield True
        finally:
            lock.release()

    # -- the four operations --------------------------------------------------------------------

    def start(self, instance_hash: int | str) -> str:
        """A new session at the instance's base state; its ``sid`` (a decimal 63-bit integer)."""
        instance = self.registry.find(instance_hash)
        store = self._ensure_open()
        assert self._state_dir is not None
        self.isolation()  # decided (and probed) before the first session, not inside an action
        self.expire_idle()
        base, _ = self.registry.base_repo(instance, self._state_dir / "bases")
        now = self.clock()
        with store.transaction():
            live = store.count("live")
            if live >= self.config.max_sessions:
                raise SessionLimitError(
                    f"too many live sessions: {live} of max_sessions={self.config.max_sessions}; "
                    "call /postprocess on finished sessions, or wait for idle ones to expire "
                    f"(session_ttl_s={self.config.session_ttl_s:g})"
                )
            sid = self._new_sid(store)
            root = self._state_dir / "sessions" / sid
            store.insert(
                SessionRecord(
                    sid=sid,
                    instance_id=instance.instance_id,
                    instance_hash=str(instance.instance_hash),
                    state="live",
                    reason=None,
                    root=str(root),
                    created_at=now,
                    last_active_at=now,
                    ended_at=None,
                    actions=0,
                    agent_finished=False,
                    patch=None,
                    patch_taken=False,
                    result=None,
                    result_for=None,
                )
            )
        try:
            with self._session_lock(sid):
                (root / "tmp").mkdir(parents=True)
                (root / "ctl").mkdir()
                copy_repo(base, root / "workspace" / instance.workspace_name)
                for name in ("tmp", "ctl", "workspace"):  # (the dirs its commands work in)
                    self._give_to_commands(root / name)
        except BaseException:
            remove_own_tree(root)
            with store.transaction() as db:
                db.execute("DELETE FROM sessions WHERE sid = ?", (sid,))
            raise
        return sid

    def process_action(self, sid: int | str, content: str) -> str:
        """Run the action in ``content``; the observation (``EXECUTION RESULT of [...]:\\n...``)."""
        key = self._key(sid)
        with self._session_lock(key):
            workspace = self._live_workspace(key)
            store = self._ensure_open()
            store.touch(key, self.clock())
            action = parse_action(content)
            if isinstance(action, FunctionCall):
                name = action.name
                if name == "execute_bash":
                    output = self._execute_bash(workspace, action.params)
                elif name == "str_replace_editor":
                    editor = Editor(
                        workspace.paths,
                        workspace.ctl / "editor_history.json",
                        workspace.instance.workspace_path,
                        made=self._give_to_commands,
                    )
                    output = editor.run(action.params)
                else:
                    store.update(key, agent_finished=1)
                    output = "The task is marked as finished; the changes will be evaluated."
                if action.ignored_calls:
                    output += (
                        f"\n[Only the first function call was run: {action.ignored_calls} more in the same "
                        "message were ignored. Call one function per message.]"
                    )
            elif isinstance(action, DiffBlock):
                name = "apply_patch"
                output = self._apply_diff_block(workspace, action.patch)
            else:
                assert isinstance(action, ActionError)
                name, output = action.name, action.message
            store.touch(key, self.clock(), actions=1)
            return truncate_observation(observation(name, output))

    def postprocess(self, sid: int | str) -> dict[str, Any]:
        """End the session: take its patch, free its work dir, score it. Idempotent."""
        key = self._key(sid)
        store = self._ensure_open()
        with self._session_lock(key):
            record = self._record(key)
            if record.state == "live":
                patch = self._take_patch(record)
                self._free(record)
                store.update(
                    key,
                    state="finished",
                    reason="postprocess",
                    ended_at=self.clock(),
                    patch=patch,
                    patch_taken=1,
                )
            result = self._score_locked(key)
            record = self._record(key)
        self._forget_lock(key)
        return {
            "sid": key,
            "state": record.state,
            "instance_id": record.instance_id,
            "patch_bytes": None
            if record.patch is None
            else len(record.patch.encode("utf-8", "surrogateescape")),
            "reward": result.reward,
            "resolved": result.resolved,
        }

    def compute_reward(self, sid: int | str) -> dict[str, Any]:
        """The session's reward, scored as SWE-bench scores; cached per patch, so idempotent."""
        key = self._key(sid)
        with self._session_lock(key):
            answer = self._score_locked(key).answer()
            ended = self._record(key).state != "live"
        if ended:
            self._forget_lock(key)
        return answer

    def _score_locked(self, key: str) -> RewardResult:
        store = self._ensure_open()
        record = self._record(key)
        patch = record.patch if record.state != "live" else self._take_patch(record)
        digest = hashlib.sha256(
            b"none" if patch is None else b"patch\0" + patch.encode("utf-8", "surrogateescape")
        )
        fingerprint = f"{self.config.reward_mode}:{digest.hexdigest()}"
        if record.result is not None and record.result_for == fingerprint:
            return RewardResult.from_json(json.loads(record.result))
        instance = self.registry.get(record.instance_id)
        assert self._state_dir is not None
        base, sha = self.registry.base_repo(instance, self._state_dir / "bases")
        python = self.config.backend_python if self.config.backend else self.config.python
        try:
            result = score(
                instance,
                base,
                sha,
                patch,
                self.executor,
                self._state_dir / "scratch",
                python,
                self._env(instance, None),
                min(self.config.reward_timeout_s, self.config.max_timeout_s),
                self.config.reward_mode,
                tests_known_to_run=instance.instance_id in self._tests_run,
                in_world=self.isolation()[0] == "world",
                give=self._give_to_commands,
            )
        except ScoringError as exc:
            # Not cached: the next call scores again (once the environment is fixed, it succeeds).
            log.error("scoring session %s failed: %s", key, exc)
            raise ScoringError(f"session {key}: {exc}") from None
        if any(status != "MISSING" for status in result.tests.values()):
            self._tests_run.add(instance.instance_id)
        store.update(key, result=json.dumps(result.to_json()), result_for=fingerprint)
        return result

    def check_backend(self, timeout: float = PROBE_TIMEOUT_S) -> BackendProbe | None:
        """With ``--swedev-backend``: check that it answers and runs pytest with the configured
        interpreter (raises :class:`~mocksandbox.sessions.errors.BackendError` with one line saying
        what failed and what to do). ``None`` when commands run here."""
        if isinstance(self.executor, RemoteExecutor):
            return self.executor.probe(timeout)
        return None

    # -- expiry, listing, reset -----------------------------------------------------------------

    def expire_idle(self) -> list[str]:
        """Reclaim live sessions idle for ``session_ttl_s``: their patch is kept (so a reward can
        still be computed), their work dir freed, their state ``leaked``. Answers their sids."""
        if self._store is None:
            return []
        store = self._store
        expired = []
        for sid in store.idle_since(self.clock() - self.config.session_ttl_s):
            with self._session_lock(sid, blocking=False) as acquired:
                if not acquired:
                    continue  # an action is running: not idle after all
                record = store.get(sid)
                if record is None or record.state != "live":
                    continue
                if record.last_active_at >= self.clock() - self.config.session_ttl_s:
                    continue
                patch = self._take_patch(record)
                self._free(record)
                store.update(
                    sid, state="leaked", reason="expired", ended_at=self.clock(), patch=patch, patch_taken=1
                )
                expired.append(sid)
        for sid in expired:
            self._forget_lock(sid)
        return expired

    def list_sessions(self) -> dict[str, Any]:
        """Live, finished and leaked sessions, with the limits in force."""
        groups: dict[str, list[dict[str, Any]]] = {"live": [], "finished": [], "leaked": []}
        if self._store is not None or not self._ephemeral:
            store = self._ensure_open()
            self.expire_idle()
            for record in store.all():
                groups.setdefault(record.state, []).append(record.describe())
        return {
            **groups,
            "counts": {state: len(items) for state, items in groups.items()},
            "max_sessions": self.config.max_sessions,
            "session_ttl_s": self.config.session_ttl_s,
            "reward_mode": self.config.reward_mode,
            "backend": self.executor.name,
            "state_dir": None if self._state_dir is None else str(self._state_dir),
            "persistent": not self._ephemeral,
            "instances": len(self.registry),
        }

    def describe(self, sid: int | str) -> dict[str, Any]:
        """One session in full (its patch included)."""
        record = self._record(self._key(sid))
        instance = self.registry.get(record.instance_id)
        return {**record.describe(), "workspace": instance.workspace_path, "patch": record.patch}

    def patch_so_far(self, sid: int | str) -> str | None:
        """The model's change: an ended session's frozen patch, or a live one's diff against its
        base as the work tree is now (taken between actions, never during one)."""
        key = self._key(sid)
        record = self._record(key)
        if record.state != "live":  # (and no lock is made for an unknown or ended sid)
            return record.patch
        with self._session_lock(key):
            record = self._record(key)
            return record.patch if record.state != "live" else self._take_patch(record)

    def reset(self) -> None:
        """Forget every session: live ones are ended and their work dirs removed, records deleted.
        Instances and their built base repositories stay."""
        with self._lock:
            store = self._store
            if store is None or self._state_dir is None:
                return
            for record in store.all():
                remove_own_tree(record.root)
            store.clear()
            for child in (self._state_dir / "sessions").iterdir():
                remove_own_tree(child)
            self._session_locks.clear()

    def close(self) -> None:
        """Stop the reaper and close the store; a temporary state dir is removed, a configured one
        is kept (live sessions continue after a restart)."""
        with self._lock:
            self._stop.set()
            if self._reaper is not None:
                self._reaper.join(timeout=10)
                self._reaper = None
            if self._store is not None:
                self._store.close()
                self._store = None
            if self._lock_file is not None:
                with suppress(OSError):
                    fcntl.flock(self._lock_file, fcntl.LOCK_UN)
                self._lock_file.close()
                self._lock_file = None
            if self._ephemeral and self._state_dir is not None:
                remove_own_tree(self._state_dir)
            if self._state_dir is not None:
                self.registry.forget_bases(self._state_dir / "bases")
            self._state_dir = None

    # -- helpers --------------------------------------------------------------------------------

    @staticmethod
    def _key(sid: int | str) -> str:
        """The canonical form of a sid sent as an int or a string: its decimal digits."""
        if isinstance(sid, bool):
            raise UnknownSessionError(f"unknown sid {sid!r}: a sid is a decimal integer")
        if isinstance(sid, int):
            return str(sid)
        text = sid.strip()
        if re.fullmatch(r"\+?\d+", text):
            return str(int(text))
        raise UnknownSessionError(f"unknown sid {sid!r}: a sid is a decimal integer")

    def _forget_lock(self, key: str) -> None:
        """Drop an ended session's lock, so that the map does not grow with every session ever run.
        (A caller that still holds the old lock object races only with idempotent work.)"""
        with self._lock:
            self._session_locks.pop(key, None)

    @staticmethod
    def _new_sid(store: SessionStore) -> str:
        while True:
            sid = str(secrets.randbits(63) or 1)
            if store.get(sid) is None:
                return sid

    def _record(self, key: str) -> SessionRecord:
        record = self._ensure_open().get(key)
        if record is None:
            raise UnknownSessionError(f"unknown sid {key!r}: no session has this id")
        return record

    def _live_workspace(self, key: str) -> _Workspace:
        record = self._record(key)
        if record.state != "live":
            why = {
                "postprocess": "it was post-processed",
                "expired": f"it was idle for more than {self.config.session_ttl_s:g} s",
                "lost": "its work dir was lost",
            }.get(record.reason or "", record.reason or "")
            raise SessionEndedError(f"session {key} has ended ({record.state}: {why}); start a new one")
        instance = self.registry.get(record.instance_id)
        root = Path(record.root)
        return _Workspace(record, instance, root, root / "workspace" / instance.workspace_name, PathMap(root))

    def _env(self, instance: Instance, root: Path | None, namespace: bool = False) -> dict[str, str]:
        env = {
            "PYTHONDONTWRITEBYTECODE": "1",
            # The instance's repository is the environment: the server's own pytest plugins are not.
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "GIT_PAGER": "cat",
            "PAGER": "cat",
            "SWE_INSTANCE_ID": instance.instance_id,
        }
        if root is not None:
            env["TMPDIR"] = "/tmp" if namespace else str(root / "tmp")
            env["GIT_CEILING_DIRECTORIES"] = MOUNT_POINT if namespace else str(root)
        env.update(instance.env)
        return env

    def isolation(self) -> tuple[Isolation, str]:
        """How sessions see ``/workspace`` (``world``, ``namespace`` or ``paths``) and why; decided
        on first use."""
        with self._lock:
            if self._isolation is None:
                self._isolation = choose_isolation(
                    self.config.isolation,
                    remote=self.config.backend is not None,
                    tmp_root=self.config.tmp_root,
                    world_probe=self._world_unavailable if self.runs_in_worlds else None,
                )
            return self._isolation

    def _world_unavailable(self) -> str | None:
        """Why a session's command cannot run in a world here (``None``: it can). A real run, of a
        throwaway session: its ``/workspace`` and ``/tmp`` bound, its layer made."""
        # Where sessions live (a path runs find masked: the binds must show it all the same).
        parent = self._state_dir / "scratch" if self._state_dir is not None else self.config.tmp_root
        probe = Path(tempfile.mkdtemp(prefix="mocksandbox-world-probe-", dir=parent))
        try:
            for name in ("workspace", "tmp"):
                (probe / name).mkdir()
            (probe / "workspace" / "seen").write_text("")
            if self.run_owner is not None:
                for name in ("workspace", "tmp"):
                    self.run_owner.give_tree(str(probe / name))
            world = RunWorld(
                probe / "world", ((str(probe / "workspace"), MOUNT_POINT), (str(probe / "tmp"), "/tmp"))
            )
            # (Without idmapped mounts the host root's /etc is read-only to a command: refused, the
            # write reaches the host no more than where it lands in the command's layer.)
            script = (
                f"test -e {MOUNT_POINT}/seen && touch /tmp/probe && "
                "{ touch /etc/mocksandbox-probe 2>/dev/null; true; }"
            )
            ran = self.executor.run(probe, script, MOUNT_POINT, 30.0, {}, world=world)
            if ran.error or ran.exit_code != 0 or not (probe / "tmp" / "probe").exists():
                said = (ran.error or ran.output).strip() or f"exit status {ran.exit_code}"
                return f"a command could not run in one ({said})"
            if os.path.exists("/etc/mocksandbox-probe"):
                return "a command's write reached the host"
            return None
        finally:
            remove_own_tree(probe)

    def _give_to_commands(self, path: Path) -> None:
        """``path`` and what is below it given to the uid of the session's commands, where they run
        in worlds and what the server writes as itself would not be theirs (``run_owner``): the
        model's commands change what the server made (its repository, files the editor or a patch
        made), as where the host root's files are the run root's."""
        if self.run_owner is not None and self.isolation()[0] == "world" and path.exists():
            self.run_owner.give_tree(str(path))

    def _execute_bash(self, workspace: _Workspace, params: Mapping[str, Any]) -> str:
        command = str(params.get("command", ""))
        if str(params.get("is_input", "")).lower() == "true" or command.strip() in _CONTROL_KEYS:
            return "ERROR: No previous running command to interact with."
        if not command.strip():
            return "ERROR: No previous running command to retrieve logs from."
        timeout = self.config.command_timeout_s
        if isinstance(params.get("timeout"), float) and params["timeout"] > 0:
            timeout = params["timeout"]
        timeout = min(timeout, self.config.max_timeout_s)
        isolation = self.isolation()[0]
        namespace = isolation != "paths"  # the agent's paths are the real ones
        paths, root, q = workspace.paths, workspace.root, shlex.quote
        # The shell's directory, as the agent sees it: kept from one command to the next.
        repo = workspace.instance.workspace_path
        cwd = repo
        with suppress(OSError):
            remembered = (workspace.ctl / "cwd").read_text().strip()
            if remembered and (paths.real_path(remembered) or Path(remembered)).is_dir():
                cwd = remembered
        world: RunWorld | None = None
        run_cwd: Path | str = workspace.repo
        if isolation == "world":
            # The relay binds the session's dirs; the fd-9 file below is written in place too.
            binds = ((str(root / "workspace"), MOUNT_POINT), (str(root / "tmp"), "/tmp"))
            world = RunWorld(root / "world", (*binds, (str(workspace.ctl), str(workspace.ctl))))
            setup, launcher, run_cwd = "", "/bin/bash -c", MOUNT_POINT
        elif namespace:
            setup = (
                f"mount --bind {q(str(root / 'workspace'))} {MOUNT_POINT} && "
                f"mount --bind {q(str(root / 'tmp'))} /tmp || "
                "{ echo 'mocksandbox: cannot mount the session' >&2; exit 125; }\n"
            )
            launcher = "unshare --mount --propagation private -- /bin/bash -c"
        else:
            setup, launcher = "", "/bin/bash -c"
            cwd, repo, command = paths.to_real(cwd), str(workspace.repo), paths.to_real(command)
        # On exit, the shell's directory goes to fd 9 (in agent terms: the session root stripped).
        remember = f'__ms_pwd=$(pwd); printf "%s" "${{__ms_pwd#{root}}}" >&9'
        inner = (
            f"{setup}cd {q(cwd)} 2>/dev/null || cd {q(repo)}\ntrap {q(remember)} EXIT\neval {q(command)}\n"
        )
        cwd_next, cwd_file = q(str(workspace.ctl / "cwd.next")), q(str(workspace.ctl / "cwd"))
        script = (
            "exec 2>&1\n"
            f"{launcher} {q(inner)} 9>{cwd_next}\n"
            "__ms_rc=$?\n"
            f"if [ -s {cwd_next} ]; then mv -f {cwd_next} {cwd_file}; fi\n"
            "exit $__ms_rc\n"
        )
        env = self._env(workspace.instance, root, namespace)
        result = self.executor.run(root, script, run_cwd, timeout, env, world=world)
        return self._bash_observation(workspace, result, timeout)

    @staticmethod
    def _bash_observation(workspace: _Workspace, result: ExecResult, timeout: float) -> str:
        output = workspace.paths.to_agent(result.output).rstrip("\n")
        if result.error:
            error = workspace.paths.to_agent(result.error)
            return f"{output}\nERROR: the command could not be run: {error}".lstrip("\n")
        if result.timed_out:
            return (
                f"{output}\n[Command timed out after {timeout:g} seconds and was killed. Run long jobs with "
                "a smaller input or a timeout of their own.]"
            )
        return f"{output}\n[Command finished with exit code {result.exit_code}]"

    def _apply_diff_block(self, workspace: _Workspace, patch: str) -> str:
        patch = _relative_diff_paths(patch, workspace.instance.workspace_name)
        try:
            applied = apply_patch(workspace.repo, patch, ceiling=workspace.root)
        except GitError as exc:
            return f"ERROR: the patch could not be applied: {workspace.paths.to_agent(str(exc))}"
        self._give_to_commands(workspace.repo)  # (the files it made: the model's commands edit them)
        text = workspace.paths.to_agent(applied.output).strip()
        if applied.ok:
            return text or "The patch was applied."
        return (
            f"ERROR: the patch does not apply to {workspace.instance.workspace_path}; nothing was changed.\n"
            f"{text}\nUse paths relative to the repository root (--- a/pkg/module.py, +++ b/pkg/module.py) "
            "and context lines that match the current files."
        )

    def _take_patch(self, record: SessionRecord) -> str | None:
        """The model's change in a live session (``None`` if it cannot be taken)."""
        instance = self.registry.get(record.instance_id)
        root = Path(record.root)
        work_tree = root / "workspace" / instance.workspace_name
        if not work_tree.is_dir():
            return None
        assert self._state_dir is not None
        base, sha = self.registry.base_repo(instance, self._state_dir / "bases")
        try:
            return collect_patch(base, sha, work_tree, root / "ctl" / "patch-scratch")
        except GitError:
            log.exception("taking the patch of session %s failed", record.sid)
            return None

    @staticmethod
    def _free(record: SessionRecord) -> None:
        remove_own_tree(record.root)


def _relative_diff_paths(patch: str, workspace_name: str) -> str:
    """Diff headers with the repository's agent path (``/workspace/<name>/x``, ``a/workspace/<name>/x``)
    made relative as git expects them (``a/x``, ``b/x``)."""
    prefix = re.compile(rf"(?:[ab]/)?/?workspace/{re.escape(workspace_name)}/")
    lines = []
    for line in patch.splitlines(keepends=True):
        if line.startswith(("--- ", "+++ ")):
            side = "a/" if line.startswith("---") else "b/"
            line = line[:4] + prefix.sub(side, line[4:], count=1)
        elif line.startswith("diff --git ") and line.count(" ") == 3:
            first, second = line[len("diff --git ") :].split(" ")
            line = f"diff --git {prefix.sub('a/', first, count=1)} {prefix.sub('b/', second, count=1)}"
        lines.append(line)
    return "".join(lines)


#: What a state dir holds besides the SQLite store (``locks``: per-session locks across processes).
STATE_SUBDIRS = ("sessions", "bases", "scratch", "locks")


def _lock_state_dir(state_dir: Path) -> TextIO:
    """Hold the state dir for this server alone (released when the file is closed)."""
    lock_file = (state_dir / "lock").open("a+")
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock_file.close()
        raise StateDirError(f"state dir {state_dir} is in use by another mocksandbox server") from None
    return lock_file


@contextmanager
def _file_lock(path: Path, blocking: bool) -> Iterator[bool]:
    """An exclusive ``flock`` on ``path`` (created if missing); yields whether it was taken."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def recover_state_dir(store: SessionStore, state_dir: Path, clock: Callable[[], float]) -> None:
    """After a restart: live sessions whose work dir is gone are leaked; stray dirs are removed."""
    known = set()
    for record in store.all():
        known.add(record.sid)
        if record.state == "live" and not (Path(record.root) / "workspace").is_dir():
            store.update(record.sid, state="leaked", reason="lost", ended_at=clock())
    for child in (state_dir / "sessions").iterdir():
        if child.name not in known:
            remove_own_tree(child)
    for sub in ("scratch", "locks"):
        remove_own_tree(state_dir / sub)
        (state_dir / sub).mkdir()


@dataclass
class SharedStateDir:
    """A state dir prepared, recovered and held by the process that starts worker processes over
    it (each opens it with ``SessionManager.create(..., shared_state_dir=True)``)."""

    path: Path
    #: Made for this run (no ``state_dir`` configured): removed by :meth:`close`.
    temporary: bool
    _lock_file: TextIO

    def close(self) -> None:
        with suppress(OSError):
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
        self._lock_file.close()
        if self.temporary:
            remove_own_tree(self.path)


def open_shared_state_dir(settings: Settings, clock: Callable[[], float] = time.time) -> SharedStateDir:
    """Prepare ``settings.state_dir`` (a temporary one if unset) for several worker processes."""
    temporary = settings.state_dir is None
    if settings.state_dir is not None:
        state_dir = Path(settings.state_dir).expanduser().resolve()
        state_dir.mkdir(parents=True, exist_ok=True)
    else:
        state_dir = Path(tempfile.mkdtemp(prefix="mocksandbox-state-", dir=settings.tmp_root)).resolve()
    if not SAFE_ROOT.match(str(state_dir)):
        raise StateDirError(
            f"state dir {state_dir}: use a path of letters, digits, '_', '.', '-' and '/' only "
            "(session paths are written into shell commands)"
        )
    lock_file = _lock_state_dir(state_dir)
    for sub in STATE_SUBDIRS:
        (state_dir / sub).mkdir(exist_ok=True)
    store = SessionStore(state_dir / "sessions.sqlite3")
    try:
        recover_state_dir(store, state_dir, clock)
    finally:
        store.close()
    return SharedStateDir(state_dir, temporary, lock_file)
