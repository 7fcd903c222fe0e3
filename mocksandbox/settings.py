"""One frozen settings object, read from arguments, a config file and ``MOCKSANDBOX_*`` variables.

Precedence, lowest first: defaults, the config file, the environment, explicit overrides (the CLI).
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mocksandbox.runtime.interpreters import parse_minor
from mocksandbox.runtime.layout import RuntimeDir, default_runtime_dir

ENV_PREFIX = "MOCKSANDBOX_"


class SettingsError(ValueError):
    """A config file, variable or option that cannot be used; the message says which and why."""


class Settings(BaseModel):
    """Everything the server can be told. Frozen: build a new one with :meth:`replace`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    #: Interpreter for user Python code (``python`` and ``pytest``): by default the runtime dir's
    #: (``mocksandbox runtime install --languages python``) if it has one, else the server's own.
    python: str = Field(default_factory=lambda: sys.executable)
    #: The CPython version (``major.minor``) production runs user code on: SandboxFusion's image
    #: runs 3.10. ``runtime install`` builds the Python runtime on it, and answers produced by user
    #: Python of another version carry a divergence note (say so here for a deployment on another).
    production_python: str = "3.10"
    #: SandboxFusion's runtime libraries and toolchain shims (``mocksandbox runtime install``); see
    #: :mod:`mocksandbox.runtime`. A dir that does not exist means none: runs go without them.
    runtime_dir: str = Field(default_factory=default_runtime_dir)
    #: Where per-request temp dirs are made; the system temp dir (``/tmp``) by default, as in SandboxFusion.
    tmp_root: str | None = None
    #: Cap per output stream (output mode ``complete``): streams are drained while the program
    #: runs and this much of each is kept.
    max_output_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    #: ``complete``: drain every stream, keep up to ``max_output_bytes`` (the better sandbox);
    #: answers that SandboxFusion would have cut carry a divergence note. ``sandboxfusion``:
    #: SandboxFusion's reader, emulated: a stream past 128 KiB is no longer read, so a program that
    #: writes more blocks and ends at ``run_timeout`` as TimeLimitExceeded with the output
    #: SandboxFusion would have kept (``--output-mode``; per request: a fault rule's ``output_mode``).
    output_mode: Literal["complete", "sandboxfusion"] = "complete"
    #: Upper bound on any run or compile timeout, in seconds (SandboxFusion has none; an infinite
    #: timeout there means "no limit", which a shared server cannot afford).
    max_timeout_s: float = Field(3600.0, gt=0)
    #: ``fork``: Python programs run in a forked warm interpreter (no start-up cost); ``spawn``:
    #: every program is a new process, as in SandboxFusion. Fork falls back to spawn where it must.
    exec_mode: Literal["fork", "spawn"] = "fork"
    #: How runs are confined: a cgroup per run where the host allows it (``auto``: cgroup v1, else
    #: v2, else process groups and rlimits); ``cgroup``: v1 or v2, ``cgroup-v2``: v2 only.
    confinement: Literal["auto", "cgroup", "cgroup-v2", "process-group"] = "auto"
    #: What a run can see and touch (see ``mocksandbox.execution.world``): ``lite`` gives every run
    #: a world of its own (copy-on-write files, own PID, network, IPC and UTS namespaces, secrets
    #: hidden, fewer capabilities); ``none`` runs programs in the host's, as SandboxFusion's
    #: ``isolation: none``; ``auto``: ``lite`` where this host allows it (root, cgroups, overlayfs).
    isolation: Literal["auto", "lite", "none"] = "auto"
    #: The network of a ``lite`` run: ``private`` (its own loopback only: nothing of the host, this
    #: server included, nor beyond) or ``host`` (the host's network, for programs that must reach it).
    run_network: Literal["private", "host"] = "private"
    #: Who a ``lite`` run is on the host. ``user``: an unprivileged uid of a range reserved for this
    #: server, root only inside a user namespace of its own (``id`` says 0 there; the host's files
    #: keep their owners in its view), so that the kernel's own permission checks stand behind every
    #: namespace and mask; the server does not start where that cannot be had. ``root``: the host's
    #: root with fewer capabilities (what ``lite`` was before). ``auto``: ``user`` where this host
    #: allows it, else ``root`` with a warning at start-up and a note beside every answer.
    run_as: Literal["auto", "user", "root"] = "auto"
    #: How a root server's runs are an unprivileged uid (``run_as: auto`` or ``user``). ``auto``:
    #: through idmapped mounts where the kernel takes them (the host's files keep their owners in a
    #: run's view: the host root's are its root's), else without them (each program joins the
    #: runs' user namespace itself; the host's files keep their host owners there, the host root's
    #: read-only to it, as for a server that is not root). ``off``: always without them (what a
    #: kernel before 6.3, whose tmpfs refuses them, gives; for tests of that path).
    idmapped_mounts: Literal["auto", "off"] = "auto"
    #: Whether the relays of a server that is not root (each root in a user namespace of its own)
    #: keep their mask layers (the empty copies that hide secrets, an empty /dev) on their own
    #: tmpfs. Overlayfs there keeps its marks in ``user.*`` extended attributes, which tmpfs takes
    #: from Linux 6.6 only. ``auto``: on the tmpfs where it takes them, else on the runs' dir (a
    #: disk's file system, which does). ``off``: always on the runs' dir (what a kernel before 6.6
    #: gives; for tests of that path).
    tmpfs_user_xattrs: Literal["auto", "off"] = "auto"
    #: Environment variables passed to runs although their names look like credentials (names
    #: with TOKEN, SECRET, PASSWORD, API_KEY, ... and cloud prefixes are left out otherwise; in the
    #: environment, ``,``-separated).
    run_env_keep: list[str] = Field(default_factory=list)
    #: Upper bound on processes (threads included) one run may have at once (cgroup ``pids.max``).
    max_processes: int = Field(512, ge=8)
    #: Upper bound on one run's memory in MiB, whatever ``memory_limit_MB`` says (cgroup mode only).
    max_memory_mb: int = Field(4096, ge=16)
    #: Size in MiB of the tmpfs holding every run's files (isolation lite): what bounds all runs'
    #: files together, and a run's where no cgroup counts them against its memory. Default: a
    #: quarter of the host's memory.
    runs_scratch_mb: int | None = Field(None, ge=64)
    #: How long in seconds a relay keeps one root for runs that touch nothing but their own dir
    #: (isolation lite): a file the host adds under a dir runs see shows in runs within this time.
    #: Longer saves a mount per run where runs are slow; ``0`` mounts a root for every run.
    kept_root_max_age_s: float = Field(1.0, ge=0, le=3600)
    #: ``executor_pod_name`` in answers; SandboxFusion reads ``MY_POD_NAME``.
    pod_name: str | None = Field(default_factory=lambda: os.environ.get("MY_POD_NAME"))
    #: Version named in the ``url`` of 422 items (SandboxFusion runs pydantic 2.6).
    pydantic_docs_version: str = "2.6"
    #: Log every request line to stderr.
    access_log: bool = False
    #: Host names (or addresses) answered beside loopback ones and ``host`` (``--allow-host``,
    #: repeatable; ``*.example.com`` for every name under one; in the environment, ``,``-separated).
    #: Any other ``Host`` or ``Origin`` gets 403: a web page cannot make this server run code.
    allowed_hosts: list[str] = Field(default_factory=list)
    #: Answer requests for any host and from any page (only behind a proxy that checks them).
    allow_any_host: bool = False
    #: Server processes answering from one address over one control state (``auto``: one per
    #: usable core). Each has its own launcher and confinement; see ``mocksandbox.serving.workers``.
    workers: int | Literal["auto"] = 1
    #: With several workers, keep each worker (its launcher and relays too) to its share of the
    #: usable cores; and each relay to one core, a run going to a relay on the core of the server
    #: thread that sends it (its program then starts where its relay's pages are). User programs
    #: still get every core. Less CPU per request (no wake-ups bounced between cores); turn it off
    #: when other busy processes share these cores.
    pin_workers: bool = True
    #: Runs that may be starting at once (in their first ``starting_run_ms``); the others wait their
    #: turn, first come first (``mocksandbox.execution.run_gate``). Short runs then start a few at a
    #: time on warm caches: less CPU a run (7% at concurrency 16 on 2 cores). Default: one per core
    #: this server process may use; ``0``: no limit, every run starts at once.
    starting_runs: int | None = Field(None, ge=0)
    #: How long a run counts as starting, in milliseconds: one that sleeps or computes longer gives
    #: its place up then, and is never waited for past it.
    starting_run_ms: float = Field(20.0, gt=0, le=10_000)

    # -- the fixture framework's extras --------------------------------------------------------
    #: Serve the control endpoints under ``/_mock/`` (faults, journal, stats, reset).
    control_api: bool = True
    #: Requests served at once beyond which the server answers 429 (or queues): a FaaS gateway's cap.
    max_in_flight: int | None = Field(None, ge=1)
    #: What happens to a request over ``max_in_flight``: ``reject`` (429) or ``queue`` (wait for a slot).
    overload: Literal["reject", "queue"] = "reject"
    #: With ``overload = "queue"``: give up after this many seconds and answer 429 (``None``: wait).
    queue_timeout_s: float | None = Field(None, ge=0)
    #: ``Retry-After`` seconds sent with a 429 from the cap.
    retry_after_s: float = Field(1.0, ge=0)
    #: Fault rules applied from start-up and after every reset (see ``mocksandbox.faults``).
    faults: list[dict[str, Any]] = Field(default_factory=list)
    #: A file of fault rules (``.json``, ``.yaml`` or ``.toml``), added to ``faults``.
    faults_file: str | None = None
    #: How many requests the journal keeps (counts and stats cover all of them).
    journal_limit: int = Field(10_000, ge=1)

    # -- swedev sessions (see mocksandbox.sessions) --------------------------------------------
    #: Instance directories or JSONL files of SWE-bench rows, added to the shipped ``fixtures/swedev``
    #: (``--instances DIR``, repeatable; in the environment, separated by ``:``).
    instances_dirs: list[str] = Field(default_factory=list)
    #: Where session records (SQLite) and work dirs live. ``None``: a temporary dir, removed when
    #: the server stops; give one to keep sessions and rewards across restarts.
    state_dir: str | None = None
    #: SandboxFusion URL to run every session command and test on (``/run_code`` with the repository
    #: as ``files``) instead of locally: the adapter of the design document.
    swedev_backend: str | None = None
    #: Interpreter for tests on the ``swedev_backend`` (an absolute path also goes first on PATH there).
    swedev_backend_python: str = "python3"
    #: Seconds a live session may sit idle before it is reclaimed (state ``leaked``, patch kept).
    session_ttl_s: float = Field(3600.0, gt=0)
    #: Live sessions at once; ``/start_instance`` beyond that answers 503.
    max_sessions: int = Field(1024, ge=1)
    #: ``reward`` of ``/compute_reward``: ``f2p`` (fraction of FAIL_TO_PASS passing) or ``resolved`` (0/1).
    reward_mode: Literal["f2p", "resolved"] = "f2p"
    #: Default timeout of one ``execute_bash`` call, in seconds (OpenHands' default is 120).
    session_command_timeout_s: float = Field(120.0, gt=0)
    #: Timeout of the test run that scores a session, in seconds.
    reward_timeout_s: float = Field(600.0, gt=0)
    #: How a session sees its repository at ``/workspace/...``: ``world`` (a world of its own, as
    #: /run_code's under isolation ``lite``, with a files layer kept for the session), ``namespace``
    #: (a private mount namespace per command; root only), ``paths`` (path translation), ``auto``
    #: (world, else namespace, else paths: the first this server can give).
    session_isolation: Literal["auto", "world", "namespace", "paths"] = "auto"

    # -- datasets and Jupyter (see mocksandbox.datasets, mocksandbox.jupyter) -------------------
    #: Directories of dataset files (``code_eval_<id>.jsonl`` or ``<id>.jsonl``) for the dataset
    #: endpoints, after the samples (``--datasets DIR``, repeatable; in the environment, ``:``-separated).
    datasets_dirs: list[str] = Field(default_factory=list)
    #: Also serve the sample datasets (``fixtures/datasets``, shipped in the package).
    sample_datasets: bool = True
    #: Online-judge cases of one ``/submit`` run at once (SandboxFusion's ``max_runner_concurrency``;
    #: 0: all at once).
    max_runner_concurrency: int = Field(3, ge=0)
    #: SandboxFusion's ``assets/`` directory (``tokenizer/gpt2`` for RepoBench-P prompts,
    #: ``cruxeval_x_utils/examples.json`` for CRUXEval-X ones); unset: ``assets`` in the working
    #: directory, where SandboxFusion looks (``--dataset-assets DIR``).
    dataset_assets_dir: str | None = None
    #: Kernels kept started for /run_jupyter (each serves one request, then is killed); 0: every
    #: request starts its own, as SandboxFusion does.
    jupyter_pool_size: int = Field(2, ge=0)
    #: Fill the kernel pool at start-up (in the background) instead of at the first /run_jupyter.
    jupyter_prewarm: bool = False
    #: ``fork``: kernels are forked from a helper that imported ipykernel once (~0.2 s each);
    #: ``spawn``: ``python -m ipykernel_launcher`` per kernel (~1.2 s), as SandboxFusion.
    jupyter_launcher: Literal["fork", "spawn"] = "fork"
    #: Seconds a kernel may take to start before the request fails.
    jupyter_startup_timeout_s: float = Field(60.0, gt=0)

    # -- cassettes (see mocksandbox.recording) -------------------------------------------------
    #: A cassette (JSON Lines, written by ``mocksandbox record``) whose recordings answer the
    #: requests they match (``--replay FILE``).
    replay_file: str | None = None
    #: What happens to requests no recording matches: ``strict`` (a 404 naming the nearest recorded
    #: request), ``fallback`` (run here); ``prefer-local``: run here whatever this host has a
    #: toolchain for, replay the other languages.
    replay_mode: Literal["strict", "fallback", "prefer-local"] = "strict"
    #: Hold each replayed answer until its recorded duration has passed.
    replay_timing: bool = False

    @model_validator(mode="before")
    @classmethod
    def _runtime_python(cls, data: Any) -> Any:
        # Only when no interpreter was named: an explicit --python (or MOCKSANDBOX_PYTHON) wins.
        if isinstance(data, dict) and data.get("python") is None:
            runtime_python = RuntimeDir(data.get("runtime_dir") or default_runtime_dir()).python()
            if runtime_python is not None:
                data = {**data, "python": runtime_python}
        return data

    @field_validator("production_python")
    @classmethod
    def _python_version(cls, value: str) -> str:
        major, minor = parse_minor(value)
        return f"{major}.{minor}"

    @field_validator("allowed_hosts", "run_env_keep", mode="before")
    @classmethod
    def _split_names(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("instances_dirs", "datasets_dirs", mode="before")
    @classmethod
    def _split_paths(cls, value: Any) -> Any:
        # From the environment or a config file, a single string of paths separated by ':'.
        if isinstance(value, str):
            return [part for part in value.split(os.pathsep) if part]
        return value

    @field_validator("workers", mode="before")
    @classmethod
    def _worker_count(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ValueError("workers must be at least 1 (or auto)")
        return value

    def worker_count(self) -> int:
        """How many server processes ``workers`` means on this machine."""
        if self.workers == "auto":
            return max(1, len(os.sched_getaffinity(0)))
        return self.workers

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied and validated."""
        try:
            return Settings(**{**self.model_dump(), **changes})
        except ValidationError as exc:
            raise SettingsError(_describe(exc)) from None


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        if path.suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            raise SettingsError(f"config file {path}: use .toml, .yaml, .yml or .json")
    except (tomllib.TOMLDecodeError, yaml.YAMLError, json.JSONDecodeError) as exc:
        raise SettingsError(f"config file {path} is not valid: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path} must hold a table/mapping of settings")
    # A [server] table (or the top level) holds the settings; other tables belong to other parts.
    section = data.get("server", data)
    values = {str(k).replace("-", "_"): v for k, v in section.items() if not isinstance(v, dict)}
    if "faults" in data and "faults" not in values:
        values["faults"] = data["faults"]
    return values


def _read_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    known = set(Settings.model_fields)
    values: dict[str, Any] = {}
    for name, value in environ.items():
        if name.startswith(ENV_PREFIX):
            key = name[len(ENV_PREFIX) :].lower()
            if key in known:
                values[key] = value
    return values


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build :class:`Settings` from a config file, the environment and explicit overrides."""
    merged: dict[str, Any] = {}
    if config_file is not None:
        merged.update(_read_config_file(Path(config_file)))
    merged.update(_read_environment(os.environ if environ is None else environ))
    merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return Settings(**merged)
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    return f"invalid settings: {problems}"
