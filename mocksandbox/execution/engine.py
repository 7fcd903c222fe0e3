"""The execution engine: one /run_code request from temp dir to response, no HTTP in here."""

from __future__ import annotations

import base64
import math
import os
import re
import shlex
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import mocksandbox
from mocksandbox import divergence
from mocksandbox.execution.affinity import usable_cpus
from mocksandbox.execution.budget import MemoryBudget, ProcessBudget
from mocksandbox.execution.confinement import Confinement, create_confinement
from mocksandbox.execution.languages import (
    LANGUAGES,
    TOOLCHAIN_BINARIES,
    LanguageSpec,
    find_scala_object_name,
)
from mocksandbox.execution.launcher import Launcher, LauncherError
from mocksandbox.execution.process import CommandSpec, ProcessRunner
from mocksandbox.execution.run_gate import RunGate
from mocksandbox.execution.startup_proof import Proof, StartupProbe
from mocksandbox.execution.syscall_filter import FilterUnavailable, compile_run_filter
from mocksandbox.execution.workdirs import WorkdirPool, make_temp_file
from mocksandbox.execution.world import (
    FRESH_DIRS,
    KEPT_CAPABILITIES,
    RUN_DIRS,
    RUN_UID_COUNT,
    HostWorkspace,
    Isolation,
    KeptRootWorkspace,
    LayeredWorkspace,
    RunsRoot,
    Workspace,
    hidden_credential_paths,
    hidden_system_secrets,
    is_credential_variable,
    lite_unavailable_reason,
    path_in_run_dir,
    reserve_run_uids,
    run_as_user_unavailable_reason,
    runs_tmpfs_size,
    server_private_prefixes,
)
from mocksandbox.models import (
    CommandRunResult,
    CommandRunStatus,
    RunCodeRequest,
    RunCodeResponse,
    RunStatus,
    derive_run_status,
)
from mocksandbox.runtime.layout import RuntimeDir
from mocksandbox.runtime.production import PythonRuntime
from mocksandbox.settings import Settings

#: Variables of the server's environment that must not steer a user's program: a pytest run inside
#: a test suite would otherwise inherit the suite's PYTEST_ADDOPTS and xdist worker ids, and a
#: PYTHONUNBUFFERED on the host would change what a timed-out program is seen to have printed.
_HIDDEN_ENV_PREFIXES = ("PYTEST_", "MOCKSANDBOX_")
_HIDDEN_PYTHON_VARIABLES = frozenset(
    {
        "PYTHONUNBUFFERED",
        "PYTHONDEVMODE",
        "PYTHONWARNINGS",
        "PYTHONFAULTHANDLER",
        "PYTHONTRACEMALLOC",
        "PYTHONINSPECT",
        "PYTHONVERBOSE",
        "PYTHONBREAKPOINT",
        "PYTHONSTARTUP",
    }
)


#: In fork mode, Python runs with a ``memory_limit_MB`` below this are spawned: a forked interpreter
#: starts with a few MiB more address space in use than a new one (the launcher's), which only
#: shows near a small limit (under 5 MiB a new interpreter cannot even start).
FORK_MIN_MEMORY_LIMIT_MB = 128

#: The file the start-up run makes where its uid on the host is told by what it writes
#: (``ExecutionEngine.prove_isolation``).
_OWNER_PROBE = ".mocksandbox-owner-probe"
#: Why runs are without idmapped mounts where the settings say so.
IDMAPPED_MOUNTS_OFF = "the setting idmapped_mounts is off"


def program_environment(environ: Mapping[str, str], keep: Iterable[str] = ()) -> dict[str, str]:
    """The server's environment as user programs get it: SandboxFusion passes it whole; here
    without the variables that steer the server or its tests, and without those that look like
    credentials (``world.is_credential_variable``) but for those ``keep`` names."""
    kept = set(keep)
    return {
        k: v
        for k, v in environ.items()
        if k in kept
        or not (
            k.startswith(_HIDDEN_ENV_PREFIXES) or k in _HIDDEN_PYTHON_VARIABLES or is_credential_variable(k)
        )
    }


def interpreter_placeholders(python: str) -> dict[str, str]:
    """``{python}`` and ``{pytest}`` as SandboxFusion spells them, ``python <f>`` and ``pytest <f>``
    found on PATH, when the interpreter's directory has those names (venvs, conda, pyenv);
    otherwise the interpreter's full path (and ``-m pytest``)."""
    bin_dir = Path(python).parent
    if (bin_dir / "python").exists() and os.path.samefile(bin_dir / "python", python):
        python_word = "python"
    else:
        python_word = shlex.quote(python)
    pytest_word = "pytest" if (bin_dir / "pytest").exists() else f"{python_word} -m pytest"
    return {"python": python_word, "pytest": pytest_word}


def nan_timeout_result(command: str) -> CommandRunResult:
    """What SandboxFusion's ``run_command`` answers to a NaN timeout: it fails converting the
    timeout before it starts anything, and its handler turns that into an ``Error`` result."""
    return CommandRunResult(
        status=CommandRunStatus.Error,
        stderr=f"exception on running command {command}: cannot convert float NaN to integer | None",
    )


class CommandRunner(Protocol):
    """What the engine needs from a runner; tests can pass a fake, faults can wrap the real one."""

    def run(self, spec: CommandSpec) -> CommandRunResult: ...


class ExecutionEngine:
    """Runs /run_code requests: temp dir, files, compile step, run step, fetched files."""

    def __init__(
        self,
        settings: Settings,
        runner: CommandRunner,
        confinement_name: str = "",
        isolation: Isolation | None = None,
        runs_root: RunsRoot | None = None,
        world: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.runner = runner
        self.confinement_name = confinement_name
        #: What a run can see and touch (``world.py``); none: the host's files, processes, network.
        self.isolation = isolation if isolation is not None else Isolation("none")
        #: What ``auto`` could not give on this host: noted beside every answer.
        self._missing_protections = self.isolation.missing()
        #: The tmpfs holding each request's layers under isolation lite, else ``None``.
        self.runs_root = runs_root
        #: What each run's world is made of under isolation lite (the relays' config; Jupyter
        #: kernels get worlds of the same), else ``None``.
        self.world = dict(world) if world is not None else None
        #: The temp root's dirs as runs see them, worked out by the first request (lite).
        self._skeleton: list[tuple[str, int, int, int]] | None = None
        self._base_env = program_environment(os.environ, settings.run_env_keep)
        self._interpreter_placeholders = interpreter_placeholders(settings.python)
        python_dir = str(Path(settings.python).parent)
        self._python_env = {
            **self._base_env,
            "PATH": f"{python_dir}:{self._base_env.get('PATH', os.defpath)}",
        }
        self._cpp_flags: list[str] | None = None
        self._cpp_flags_lock = threading.Lock()
        #: Each run's temp dir; an empty one is kept for the next run (workdirs.py).
        self.workdirs = WorkdirPool(settings.tmp_root)
        #: Under isolation lite, where relays keep roots (not in a user namespace of the server's
        #: own, where each run mounts the host's top dirs itself): the dirs of the runs they keep
        #: roots for, on the runs' tmpfs (``KeptRootWorkspace``).
        self._kept_run_dirs: WorkdirPool | None = None
        users = (world or {}).get("userns") or {}
        if (
            runs_root is not None
            and world is not None
            and ("mapped_roots" in world or not users or users.get("programs_join"))
        ):
            os.mkdir(os.path.join(runs_root.path, RUN_DIRS), 0o700)
            # (Never reused: a relay keeps a run's dir bound in its root after the run.)
            self._kept_run_dirs = WorkdirPool(os.path.join(runs_root.path, RUN_DIRS), reuse=False)
        # SandboxFusion's runtime libraries (mocksandbox.runtime): each language's environment
        # with them is worked out once, so runs of a language share one mapping.
        self.runtime = RuntimeDir(settings.runtime_dir)
        self._language_env = {
            name: self.runtime.environment(spec, self._python_env if spec.python_env else self._base_env)
            for name, spec in LANGUAGES.items()
        }
        #: User Python against production's (its version, its packages): notes beside answers.
        self.python_runtime = PythonRuntime(settings.python, settings.production_python)
        #: What the start-up run tried and what came of it, by protection (:meth:`prove_isolation`;
        #: none without one: isolation none).
        self.proofs: dict[str, Proof] = {}

    # -- public API ---------------------------------------------------------------------------

    def close(self) -> None:
        """Remove the temp dirs kept for later runs (the runs' tmpfs goes with the launcher)."""
        self.workdirs.close()
        if self._kept_run_dirs is not None:
            self._kept_run_dirs.close()

    def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        """Answer one validated request as SandboxFusion would; never raises."""
        response = RunCodeResponse(
            status=RunStatus.Success, message="", executor_pod_name=self.settings.pod_name
        )
        for missing in self._missing_protections:
            divergence.note(divergence.ISOLATION, f"not in force for this run: {missing}")
        try:
            spec = LANGUAGES[request.language]
            compile_result, run_result, files = self._run(spec, request)
        except Exception as exc:
            # SandboxFusion's handler turns any exception into this message; the trailing " None"
            # is the return value of traceback.print_tb that it interpolates.
            response.status = RunStatus.SandboxError
            response.message = f"exception on running code {request.code}: {exc} None"
            return response
        response.compile_result = compile_result
        response.run_result = run_result
        response.files = files
        status, message = derive_run_status(compile_result, run_result)
        response.status = status
        if status == RunStatus.SandboxError:
            response.message = message
        return response

    # -- steps --------------------------------------------------------------------------------

    def _run(
        self, spec: LanguageSpec, request: RunCodeRequest
    ) -> tuple[CommandRunResult | None, CommandRunResult | None, dict[str, str]]:
        # Values are shell-quoted here, once; templates are our own text (languages.py).
        placeholders = dict(self._interpreter_placeholders)
        if "object_name" in spec.needs:
            object_name = find_scala_object_name(request.code)
            if not object_name:
                error = CommandRunResult(
                    status=CommandRunStatus.Error, return_code=1, stderr="Object name not found."
                )
                return error, None, {}
            placeholders["object_name"] = shlex.quote(object_name)
        if "cpp_flags" in spec.needs:
            placeholders["cpp_flags"] = " ".join(map(shlex.quote, self._detect_cpp_flags()))

        workspace = self.new_workspace(kept_root=self._runs_in_a_kept_root(spec, request))
        workdir = workspace.cwd  # the run's path: the same on the host without isolation
        code_path: str | None = None
        try:
            if spec.restores_files:
                restore_files(workspace, request.files)
            placeholders["dir"] = shlex.quote(workdir)
            placeholders.update(self.runtime.prepare_workdir(spec, workspace.host_cwd, request.files))
            env = self._language_env[spec.name]
            if spec.setup_command is not None:
                workspace.hand_over()
                # Before the code is written, as SandboxFusion does: C#'s `dotnet new console`
                # makes a template Program.cs that the user's code then replaces.
                self._command(
                    spec.setup_command,
                    placeholders,
                    workdir,
                    env,
                    None,
                    request.compile_timeout,
                    -1,
                    world=workspace.next_command(),
                )
            host_code_path, written = self._write_code(workspace.host_cwd, spec, request.code)
            workspace.hand_over()  # (where what the server wrote is not the run's as it is: RunOwner)
            code_path = os.path.join(workdir, os.path.basename(host_code_path))
            placeholders["file"] = shlex.quote(code_path)
            compile_result = None
            if spec.compile_command is not None:
                compile_result = self._command(
                    spec.compile_command,
                    placeholders,
                    workdir,
                    # A compiler's temp files (gcc's cc*.s, go's $WORK) go into the run's dir: one
                    # killed at its timeout leaves them behind, and the run's dir goes with the run.
                    {**env, "TMPDIR": workdir},
                    None,
                    request.compile_timeout,
                    request.memory_limit_MB,
                    world=workspace.next_command(),
                )
            run_result = None
            if compile_result is None or (
                compile_result.status == CommandRunStatus.Finished and compile_result.return_code == 0
            ):
                run_result = self._command(
                    spec.run_command,
                    placeholders,
                    workdir,
                    env,
                    request.stdin,
                    request.run_timeout,
                    request.memory_limit_MB,
                    python_file=code_path if self._forks(spec, request) else None,
                    world=workspace.next_command(last=True, keep=self._keeps_to_its_dir(spec, request)),
                    python_source=written,
                )
            self._note_missing_toolchain(spec, compile_result or run_result)
            if spec.python_env and run_result is not None:
                self.python_runtime.note_outputs((run_result.stderr, run_result.stdout))
                self.python_runtime.note_time(run_result, request.run_timeout)
            return compile_result, run_result, fetch_files(workspace, request.fetch_files)
        finally:
            workspace.close(code_path)

    def _runs_in_a_kept_root(self, spec: LanguageSpec, request: RunCodeRequest) -> bool:
        """Whether the request's run will be in a root its relay keeps, so that it needs no layers:
        it keeps to its dir (:meth:`_keeps_to_its_dir`) and every one of its ``files`` is in it."""
        if self._kept_run_dirs is None or not self._keeps_to_its_dir(spec, request):
            return False
        # (The run's dir gets its name later: an absolute name cannot be known to be inside it.)
        return all(not os.path.isabs(name) and path_in_run_dir(".", name) for name in request.files)

    @staticmethod
    def _keeps_to_its_dir(spec: LanguageSpec, request: RunCodeRequest) -> bool:
        """Whether the request is one command with no ``fetch_files``: its run may have a root
        kept from run to run, unless it puts ``files`` outside the run's dir (which the workspace
        tells: ``LayeredWorkspace.next_command``)."""
        return spec.setup_command is None and spec.compile_command is None and not request.fetch_files

    def _note_missing_toolchain(self, spec: LanguageSpec, result: CommandRunResult | None) -> None:
        """A divergence note when the program could not run for want of its toolchain here
        (SandboxFusion's image has every language's)."""
        if result is None or result.return_code != 127 or "command not found" not in (result.stderr or ""):
            return
        binary = TOOLCHAIN_BINARIES.get(spec.name)
        if binary is None or shutil.which(binary, path=self._language_env[spec.name].get("PATH")) is not None:
            return
        divergence.note(
            divergence.TOOLCHAIN,
            f"{spec.name} has no {binary} here, so the program did not run; SandboxFusion's image runs it "
            f"(mocksandbox runtime install --languages {spec.name}, or replay a cassette recorded from it)",
        )

    def prove_isolation(self, confinement: Confinement | None = None) -> None:
        """Run one program in a world of its own and check what it saw; raises
        :class:`IsolationError` naming the cause if the world could not be made. The same run
        tries what the other protections refuse (``startup_proof``: a host file, a loopback port,
        a masked file, a refused system call, its own limits under ``confinement``), and
        :attr:`proofs` keeps what came of each."""
        workspace = self.new_workspace()
        # Its PID namespace, its pid there, and which host uid its root is (where runs join their
        # user namespace themselves, a file it makes says so too, read from here); then the tries.
        probe = StartupProbe(self.isolation, confinement, self.settings.python)
        command = "echo $(readlink /proc/self/ns/pid) $$ $(cat /proc/self/uid_map) world"
        owner = self.isolation.run_owner()
        if owner is not None:
            command = f": > {_OWNER_PROBE} && {command}"
        written: int | None = None
        with probe:
            try:
                workspace.hand_over()
                result = self.runner.run(
                    CommandSpec(
                        command=f"{command}; {probe.command()}",
                        cwd=workspace.cwd,
                        env=self._base_env,
                        stdin=None,
                        timeout=30.0,
                        world=workspace.next_command(last=True),
                    )
                )
                lines = (result.stdout or "").splitlines()
                # (While the canaries live: what the host's file and listener say is part of it.)
                tried = probe.results(lines[1:])
                if owner is not None:
                    try:
                        written = os.lstat(os.path.join(workspace.host_cwd, _OWNER_PROBE)).st_uid
                    except OSError:
                        pass
            finally:
                if owner is not None:
                    try:
                        os.unlink(os.path.join(workspace.host_cwd, _OWNER_PROBE))
                    except OSError:
                        pass
                workspace.close(None)
        words = lines[0].split() if lines else []
        if result.status != CommandRunStatus.Finished or result.return_code != 0 or words[-1:] != ["world"]:
            cause = (result.stderr or result.stdout or str(result.status)).strip().splitlines()
            raise IsolationError(cause[-1] if cause else "the start-up run failed")
        # Not the server's namespace (a server in a container may well be pid 2 itself, as the run
        # is in its own), and a new one: the run's pid is among its first.
        namespace, pid = words[0], words[1] if len(words) > 1 else ""
        if namespace == os.readlink("/proc/self/ns/pid") or not pid.isdigit() or int(pid) > 64:
            raise IsolationError(
                f"the start-up run was not in a PID namespace of its own ({namespace}, pid {pid})"
            )
        processes = tried.get("processes") or Proof(
            "refused", f"it was pid {pid} of a PID namespace of its own"
        )
        self.proofs = {**tried, "processes": processes}
        how = self._prove_run_uid(words, owner is not None, written)
        if how:
            self.proofs["non-root uid"] = Proof("refused", how)

    def _prove_run_uid(self, words: list[str], joined: bool, written: int | None) -> str:
        """How the start-up run (its first line: ``words``) was proven to be the runs' uid on the
        host (empty where runs are the host's root); raises :class:`IsolationError` where it was
        not. ``joined``: its program joined the runs' user namespace itself and wrote a file,
        owned on the host by ``written``."""
        run_uid = self.isolation.run_uid
        if run_uid is None:
            return ""
        # Its root is run_uid on the host: its uid map says so, but for a relay's own namespace
        # nested in the runs' (then it says "0 0", the runs' root), where the relay's own uid,
        # read from here, says so.
        host_root = words[2:4] if len(words) >= 5 else []
        users = (self.world or {}).get("userns", {})
        nested = bool(users.get("nested") or users.get("runs_tmpfs"))
        if host_root != ["0", str(run_uid)] and not (nested and host_root == ["0", "0"]):
            raise IsolationError(f"the start-up run's root was not uid {run_uid} on the host ({host_root})")
        if joined:
            # Its relay stays the host's root (the program joined the runs' user namespace): what
            # the program wrote is the kernel's word for who it was on the host.
            if written != run_uid:
                raise IsolationError(
                    f"the start-up run's file was not uid {run_uid}'s on the host (uid {written})"
                )
            return f"a file it made is uid {run_uid}'s on the host"
        relay_uids = self.runner.relay_uids() if isinstance(self.runner, ProcessRunner) else [run_uid]
        if run_uid not in relay_uids:
            raise IsolationError(f"the start-up run's relay was not uid {run_uid} on the host ({relay_uids})")
        return f"its uid map and its relay say uid {run_uid} on the host"

    def new_workspace(self, kept_root: bool = False) -> Workspace:
        """One request's files: a temp dir on the host, or (isolation lite) layers of its own, or
        (``kept_root``: a request whose run its relay may run in a root it keeps, see
        :meth:`_runs_in_a_kept_root`) its dir alone."""
        if self.runs_root is None:
            return HostWorkspace(self.workdirs.take(), self.workdirs)
        view_tmp_root = self.settings.tmp_root or tempfile.gettempdir()
        owner = self.isolation.run_owner()
        if kept_root and self._kept_run_dirs is not None:
            return KeptRootWorkspace(self._kept_run_dirs, self.runs_root, view_tmp_root, owner)
        workspace = LayeredWorkspace(
            self.runs_root,
            view_tmp_root,
            self.isolation.hidden_paths,
            self._skeleton,
            self.isolation.hidden_prefixed,
            owner=owner,
        )
        self._skeleton = workspace.skeleton_used
        return workspace

    def _command(
        self,
        template: str,
        placeholders: Mapping[str, str],
        cwd: str,
        env: Mapping[str, str],
        stdin: str | None,
        timeout: float,
        memory_limit_mb: int,
        python_file: str | None = None,
        world: Mapping[str, Any] | None = None,
        python_source: str | None = None,
    ) -> CommandRunResult:
        command = template.format_map(placeholders)
        if math.isnan(timeout):
            return nan_timeout_result(command)
        output_mode = divergence.requested_output_mode(self.settings.output_mode)
        result = self.runner.run(
            CommandSpec(
                command=command,
                cwd=cwd,
                env=env,
                # Lone surrogates (the only text UTF-8 cannot encode) are dropped, as SandboxFusion does.
                stdin=None if stdin is None else stdin.encode("utf-8", "ignore"),
                timeout=min(timeout, self.settings.max_timeout_s),
                memory_limit_mb=memory_limit_mb,
                python_file=python_file,
                python_source=python_source if python_file is not None else None,
                world=world,
                output_mode=output_mode,
            )
        )
        if output_mode == "complete":
            _note_output_past_the_reader(result)
        return result

    def _forks(self, spec: LanguageSpec, request: RunCodeRequest) -> bool:
        """Whether this run takes the warm fork path.

        Only plain Python, and under no memory limit or one of at least
        :data:`FORK_MIN_MEMORY_LIMIT_MB` (verl sends 1024 with every call): the launcher applies
        the same rlimits and sizes new threads' stacks as glibc does at a program's start. Smaller
        limits are spawned: what they do to a new interpreter (a 5 MB limit fails at load time,
        rc 127) a warm one cannot reproduce.
        """
        limit = request.memory_limit_MB
        return (
            self.settings.exec_mode == "fork"
            and spec.name == "python"
            and (limit <= 0 or limit >= FORK_MIN_MEMORY_LIMIT_MB)
            and self._interpreter_placeholders["python"] == "python"
        )

    @staticmethod
    def _write_code(workdir: str, spec: LanguageSpec, code: str) -> tuple[str, str]:
        """Write the program's file in ``workdir``; its path and the text it holds."""
        if spec.prepare_code is not None:
            code = spec.prepare_code(code)
        file_name = spec.file_name if spec.code_file_name is None else spec.code_file_name(code)
        if file_name is not None:
            path = os.path.join(workdir, file_name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        else:
            fd, path = make_temp_file(workdir, spec.suffix or "")
        try:
            data = memoryview(code.encode("utf-8"))
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
        return path, code

    def _detect_cpp_flags(self) -> list[str]:
        """Which of SandboxFusion's optional link flags work with this host's g++ (probed once)."""
        with self._cpp_flags_lock:
            if self._cpp_flags is None:
                flags: list[str] = []
                workdir = tempfile.mkdtemp(dir=self.settings.tmp_root)
                try:
                    source = os.path.join(workdir, "probe.cpp")
                    Path(source).write_text("int main() {return 0;}")
                    for flag in ("-lcrypto", "-lssl", "-lpthread"):
                        result = self.runner.run(
                            CommandSpec(f"g++ {source} -o test {flag}", workdir, self._base_env, None, 60.0)
                        )
                        if result.status == CommandRunStatus.Finished and result.return_code == 0:
                            flags.append(flag)
                finally:
                    shutil.rmtree(workdir, ignore_errors=True)
                self._cpp_flags = flags
            return self._cpp_flags


def _note_output_past_the_reader(result: CommandRunResult) -> None:
    """A divergence note for each stream SandboxFusion's reader would have cut (see
    :mod:`mocksandbox.divergence`)."""
    limit = divergence.SANDBOXFUSION_READER_PAUSE_BYTES
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        if text and len(text) * 4 > limit:  # (cheap first: no stream under 32 K characters is past it)
            size = len(text.encode("utf-8", "surrogateescape"))
            if size > limit:
                divergence.note(divergence.OUTPUT, divergence.output_note(name, size))


def restore_files(workspace: str | Workspace, files: Mapping[str, str | None]) -> None:
    """Write ``files`` as SandboxFusion does: relative to the run's dir (absolute paths honoured,
    in the run's view), parents created, ``null`` values and names containing ``IGNORE_THIS_FILE``
    skipped. Bad base64 raises ``binascii.Error``, which becomes a SandboxError."""
    if isinstance(workspace, str):
        workspace = HostWorkspace(workspace)
    for name, content in files.items():
        if not isinstance(content, str) or "IGNORE_THIS_FILE" in name:
            continue
        data = base64.b64decode(content)
        relative = path_in_run_dir(workspace.cwd, name)
        if relative is not None:
            # Inside the run's dir (most files): written straight into it.
            path = os.path.join(workspace.host_cwd, relative)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as handle:
                handle.write(data)
        else:
            workspace.write_file(os.path.join(workspace.cwd, name), data)


def fetch_files(workspace: str | Workspace, names: list[str]) -> dict[str, str]:
    """Regular files among ``names`` as the run saw them, base64-encoded and keyed by the exact
    string asked for."""
    if isinstance(workspace, str):
        workspace = HostWorkspace(workspace)
    fetched: dict[str, str] = {}
    for name in names:
        content = workspace.read_file(os.path.abspath(os.path.join(workspace.cwd, name)))
        if content is not None:
            fetched[name] = base64.b64encode(content).decode("ascii")
    return fetched


def create_engine(
    settings: Settings,
    process_budget: ProcessBudget | None = None,
    memory_budget: MemoryBudget | None = None,
) -> tuple[ExecutionEngine, Confinement, Launcher]:
    """The real engine: programs started by the launcher, confined as the host allows.
    ``process_budget``, ``memory_budget``: this server's share of the host's (by default read off
    the host)."""
    confinement = create_confinement(
        settings.confinement,
        settings.max_processes,
        settings.max_memory_mb,
        budget=process_budget,
        memory_budget=memory_budget,
    )
    env = program_environment(os.environ, settings.run_env_keep)
    env["PATH"] = f"{Path(settings.python).parent}:{env.get('PATH', os.defpath)}"
    try:
        return _start_engine(settings, confinement, env)
    except BaseException:
        confinement.close()
        raise


def _start_engine(
    settings: Settings, confinement: Confinement, env: dict[str, str]
) -> tuple[ExecutionEngine, Confinement, Launcher]:
    """The launcher and engine, with the isolation ``settings`` ask for where this host allows it;
    ``auto`` proves ``lite`` with one real run before choosing it, and ``run_as: auto`` an
    unprivileged uid for runs before settling for the host's root."""
    hidden_variables = tuple(
        sorted(k for k in os.environ if is_credential_variable(k) and k not in settings.run_env_keep)
    )
    reason = lite_unavailable_reason() if settings.isolation != "none" else "asked for"
    is_root = os.geteuid() == 0
    if reason is None and not is_root and settings.run_as == "root":
        reason = "runs as the host's root (run_as: root) need a server started as root"
    if settings.isolation == "lite" and reason is not None:
        raise IsolationError(f"isolation lite is not available here: {reason}")
    if settings.run_as == "user" and reason is not None:
        why = (
            "isolation none was asked for"
            if settings.isolation == "none"
            else f"isolation lite is not available here: {reason}"
        )
        raise IsolationError(f"runs cannot be an unprivileged user: {why}")
    if reason is None:
        run_as_reason = ""
        as_user = settings.run_as != "root"
        if as_user:
            unavailable = run_as_user_unavailable_reason()
            if unavailable is not None:
                if settings.run_as == "user":
                    raise IsolationError(f"runs cannot be an unprivileged user here: {unavailable}")
                as_user, run_as_reason = False, unavailable
        # A root server's runs are an unprivileged uid with idmapped mounts where the kernel takes
        # them (the host's files keep their owners in a run's view), else without (their programs
        # join the runs' user namespace; the host root's files are read-only to them).
        without_idmap = "" if settings.idmapped_mounts == "auto" else IDMAPPED_MOUNTS_OFF
        while True:
            try:
                engine, launcher = _start_lite(
                    settings, confinement, env, hidden_variables, as_user, run_as_reason, without_idmap
                )
                return engine, confinement, launcher
            except (OSError, IsolationError, LauncherError) as exc:
                if as_user and is_root and not without_idmap:
                    without_idmap = why_no_idmapped_mounts(exc)
                    continue
                if as_user and settings.run_as == "auto" and is_root:
                    # The world without a user namespace of its own may still be had.
                    as_user, run_as_reason = False, f"an unprivileged uid failed its start-up run: {exc}"
                    if without_idmap:
                        run_as_reason += f" (without idmapped mounts: {without_idmap})"
                    continue
                after = f" (after {run_as_reason})" if run_as_reason else ""
                if settings.isolation == "lite" or settings.run_as == "user":
                    raise IsolationError(f"isolation lite does not work here: {exc}{after}") from None
                reason = f"lite failed its start-up run: {exc}{after}"
                break
    launcher = Launcher(settings.python, env, pin_relays=settings.pin_workers)
    launcher.start()
    runner = ProcessRunner(confinement, launcher, settings.max_output_bytes, run_gate(settings))
    why_none = "" if settings.isolation == "none" else reason or ""
    isolation = Isolation("none", "host", why_none, (), hidden_variables)
    return ExecutionEngine(settings, runner, confinement.describe(), isolation), confinement, launcher


def run_gate(settings: Settings) -> RunGate | None:
    """The gate on runs starting at once that ``settings`` ask for (``starting_runs``: by default
    one place per core this process may use), or ``None`` for none."""
    places = settings.starting_runs if settings.starting_runs is not None else len(usable_cpus())
    return RunGate(places, settings.starting_run_ms / 1000) if places > 0 else None


def why_no_idmapped_mounts(exc: BaseException) -> str:
    """What a failed start of runs with idmapped mounts says of why, in short: the file system the
    kernel refused them for, as the launcher names it (``this kernel's tmpfs refuses them (...)``),
    or what failed."""
    said = str(exc).removesuffix(" | None")  # (the runner says a failed launch as SandboxFusion does)
    refused = re.search(r"this kernel's (.+?) refuses idmapped mounts \(([^()]*)\)", said)
    if refused is not None:
        return f"this kernel's {refused.group(1)} refuses them ({refused.group(2)})"
    return f"their start-up run failed: {said.split('mocksandbox launcher: ')[-1]}"


def _start_lite(
    settings: Settings,
    confinement: Confinement,
    env: dict[str, str],
    hidden_variables: tuple[str, ...],
    as_user: bool,
    run_as_reason: str,
    without_idmap: str = "",
) -> tuple[ExecutionEngine, Launcher]:
    """The launcher and engine of isolation ``lite``, proved by one real run; runs are an
    unprivileged host uid when ``as_user``, for a root server with idmapped mounts but where
    ``without_idmap`` says why not (their programs then join the runs' user namespace, and what
    the server writes for them is given to their uid). Raises (and leaves nothing behind) where
    it fails."""
    runs_root: RunsRoot | None = None
    launcher: Launcher | None = None
    try:
        tmp_root = settings.tmp_root or tempfile.gettempdir()
        # Only root may mount a tmpfs for them on the host; another user's runs keep theirs on disk.
        scratch_size = runs_tmpfs_size(settings.runs_scratch_mb)
        runs_root = RunsRoot(tmp_root, mount=os.geteuid() == 0, size=scratch_size)
        hidden = tuple(_hidden_paths(settings))
        hidden_prefixed = server_private_prefixes(settings.tmp_root)
        world: dict[str, Any] = {
            "scratch": runs_root.scratch,
            "network": settings.run_network,
            "hide": list(hidden),
            "hide_prefixed": [list(pair) for pair in hidden_prefixed],
            "keep_caps": list(KEPT_CAPABILITIES),
            "fresh": list(FRESH_DIRS),
            "kept_max_age_s": settings.kept_root_max_age_s,
            "tmpfs_user_xattrs": settings.tmpfs_user_xattrs,
            # /tmp and /run start empty for every run: these, if there, are bound read-only.
            "show": _runtime_dirs(settings),
        }
        filter_reason = ""
        try:
            world["syscall_filter"] = compile_run_filter().hex()  # (bytes.fromhex: no binascii there)
        except FilterUnavailable as exc:
            filter_reason = str(exc)
        run_uid: int | None = None
        if as_user and os.geteuid() != 0:
            # Root in a user namespace of each relay's own, the server's uid on the host.
            run_uid = os.geteuid()
            world["userns"] = {
                "uid": run_uid,
                "gid": os.getegid(),
                "count": 1,
                "self_mapped": True,
                # The runs' files in a sized tmpfs of the launcher's own (not on the host's disk).
                "runs_tmpfs": scratch_size,
            }
            world["runs_root"] = runs_root.path
            confinement.delegate_runs_to(run_uid, os.getegid())
        elif as_user:
            run_uid = reserve_run_uids()
            # Where no cgroup bounds a run, RLIMIT_NPROC must, and the kernel counts it per user
            # namespace: each relay (each program, where they join it) then nests one of its own.
            nested = confinement.name == "process-group"
            world["userns"] = {"uid": run_uid, "gid": run_uid, "count": RUN_UID_COUNT, "nested": nested}
            if without_idmap:
                world["userns"]["programs_join"] = True
                # (Its programs see the host root's files as nobody's: the way to these is theirs,
                # and the server user's home too, as with idmapped mounts: its files keep their
                # owners, its secrets stay hidden.)
                world["reach"] = [*_runtime_dirs(settings), os.path.expanduser("~")]
            else:
                world["mapped_roots"] = _mapped_roots(settings, runs_root.path, tmp_root)
            confinement.delegate_runs_to(run_uid, run_uid)
        launcher = Launcher(settings.python, env, world, pin_relays=settings.pin_workers)
        launcher.after_close.append(runs_root.close)
        launcher.after_relay_lost.append(runs_root.reclaim_dropped_kept_roots)
        if "runs_root" in world:
            launcher.after_start.append(runs_root.seen_through)
        launcher.start()
        isolation = Isolation(
            "lite",
            settings.run_network,
            "",
            hidden,
            hidden_variables,
            hidden_prefixed,
            run_uid,
            run_as_reason,
            syscall_filter="syscall_filter" in world,
            syscall_filter_reason=filter_reason,
            without_idmapped_mounts=without_idmap if run_uid is not None and os.geteuid() == 0 else "",
        )
        runner = ProcessRunner(confinement, launcher, settings.max_output_bytes, run_gate(settings))
        engine = ExecutionEngine(settings, runner, confinement.describe(), isolation, runs_root, world)
        engine.prove_isolation(confinement)
        return engine, launcher
    except BaseException:
        if launcher is not None:
            launcher.close()
        if runs_root is not None:
            runs_root.close()
        confinement.delegate_runs_to(None, None)
        raise


def _runtime_dirs(settings: Settings) -> list[str]:
    """The dirs of the user's Python (its venv, the interpreter it is made from) and of the runtime
    libraries: where a world leaves out the host's (every run starts with an empty /tmp and /run),
    a run must see these all the same; where the host root's dirs are nobody's to a run (a root
    server without idmapped mounts), it must reach them all the same."""
    python = Path(settings.python)
    dirs = {str(python.parent.parent), str(python.resolve().parent.parent), str(Path(settings.runtime_dir))}
    if os.path.realpath(python.parent.parent) == os.path.realpath(sys.prefix):
        # User code on the server's own environment (no runtime installed): an editable install
        # of the server there imports it from its checkout, outside the venv (a CI job's, or a
        # clone's under /tmp), which the run must see too.
        dirs.add(str(Path(mocksandbox.__file__).resolve().parent))
    return sorted(os.path.abspath(d) for d in dirs if d != "/")


def _mapped_roots(settings: Settings, runs_root: str, tmp_root: str) -> list[str]:
    """The host dirs runs in a user namespace of their own write in, each mapped to them whole
    (``_launcher_users.RunUsers``): the runs' layers, and where sessions keep theirs and their dirs.
    Outermost first: a relay mounts them over the host's in this order.

    Each with its top-level dir (``/tmp`` for ``/tmp/pytest-of-root/...``): a relay reaches a root
    through the dirs above it, which the host's root may keep to itself (mode 0700); mapped, they
    are the runs' root's too."""
    roots = {os.path.realpath(runs_root), os.path.realpath(tmp_root)}
    if settings.state_dir:
        state_dir = os.path.realpath(os.path.expanduser(settings.state_dir))
        if not any(state_dir == root or state_dir.startswith(root + "/") for root in roots):
            os.makedirs(state_dir, exist_ok=True)
            roots.add(state_dir)
    roots |= {"/" + root.split("/")[1] for root in roots if root.count("/") > 1}
    return sorted(roots, key=lambda root: (root.count("/"), root))


class IsolationError(RuntimeError):
    """The isolation asked for cannot be had on this host; the message says why."""


def _hidden_paths(settings: Settings) -> list[str]:
    """What a run must find empty: the server user's credentials and the server's own state."""
    paths = [*hidden_system_secrets(), *hidden_credential_paths()]
    for path in (settings.state_dir, settings.replay_file):
        if path:
            paths.append(os.path.abspath(path))
    return list(dict.fromkeys(paths))
