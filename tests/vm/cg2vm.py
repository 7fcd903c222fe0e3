"""The cgroup v2 host as a test shape (issue 50): a pytest selection run in a QEMU guest that boots
Debian 12's kernel (6.1) with a pure cgroup v2 hierarchy and the cpu, memory and pids controllers
enabled at its root, as root, with the host's files; its results brought back as results of the
host's pytest run (``test_cgroup2_guest.py``).

The guest is made by ``run-in-cgroup2-vm.sh`` beside this file (a copy of the team's
``../shared/tools/run-in-cgroup2-vm.sh``; ``CG2VM_SCRIPT`` names another): read its header for
what it needs (as root on Debian 12: ``apt-get install -y --no-install-recommends qemu-system-x86
linux-image-amd64 busybox-static``, and ``e2fsprogs``) and its settings. Here:

- ``/`` is an ext4 image of the host's files (``CG2VM_ROOT=ext4``, the default here): idmapped
  mounts work on ext4 (with ``/`` over 9p, the idmapped mount of ``/`` is refused before anything a
  Debian 12 host would refuse). The image holds only what the guest needs (:func:`image_paths`:
  ``/etc``, ``/usr``, ``/var/lib``, the venv's base Python, the runtime dir and its Python; less
  :data:`IMAGE_EXCLUDE`), is kept at ``CG2VM_IMAGE`` (default
  ``~/.cache/mocksandbox-cg2vm/root.ext4``, in a dir only its owner may read: it holds
  ``/etc/shadow``), and is rebuilt when a package was installed or those Pythons changed (or with
  ``CG2VM_REBUILD=1``). The checkout comes live from the host (9p, read-only, with an overlay in
  guest memory).
- ``cg2vm_guest.py`` runs in the guest: ``doctor``, then pytest with ``cg2vm_report`` (a JSON line
  per report), then what was left behind; it all comes back through a dir shared read-write
  (``CG2VM_SHARE_RW``), removed afterwards (``CG2VM_ARTIFACTS=DIR`` keeps a copy per suite: JUnit,
  the guest's pytest log, ``summary.json``).

Settings (environment): ``CG2VM_MEM`` (default 4G), ``CG2VM_CPUS`` (2), ``CG2VM_KERNEL`` (default:
Debian 12's ``/boot/vmlinuz-6.1.*``), ``CG2VM_GUEST_TIMEOUT`` (seconds per suite, 2400),
``CG2VM_HOST_SHAPES`` (which of ``serve_process.HOST_SHAPES`` run in the guest; default ``root
ordinary-user``),
``CG2VM_ACCEL``, ``CG2VM_ROOT``, ``CG2VM_IMAGE``, ``CG2VM_ARTIFACTS``, ``CG2VM_SCRIPT``.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPT = Path(os.environ.get("CG2VM_SCRIPT", HERE / "run-in-cgroup2-vm.sh"))
#: What every skip reason of this harness starts with, where the guest cannot be made.
UNAVAILABLE = "cgroup v2 guest cannot be made here: "


@dataclass(frozen=True)
class Suite:
    """One guest boot: a shape of the host, and the tests run in it.

    ``cgroup``: where the guest's test runner is (``CG2VM_CGROUP``); ``unit_parent``: with it,
    each server (and ``doctor``) starts alone in a fresh ``<unit_parent>/mocksandbox-test-<n>.service``
    whose ancestors hand down the controllers: ``systemd``'s ``Delegate=yes``. ``files``: test files
    (or node ids) to collect; ``host_shapes``: the ``HOST_SHAPES`` params of test_host_shapes.py to
    keep (others are left out of the selection)."""

    name: str
    cgroup: str
    files: tuple[str, ...]
    unit_parent: str | None = None
    host_shapes_from_env: bool = True
    doctor: bool = True

    def host_shapes(self) -> tuple[str, ...]:
        if not self.host_shapes_from_env:
            return ("root",)
        return tuple(os.environ.get("CG2VM_HOST_SHAPES", "root ordinary-user").split())


#: The shapes this harness makes. ``v2-root``: the server in the root cgroup of a pure cgroup v2
#: host (a VM or bare metal without systemd's slices, or a container with its own cgroup
#: namespace); the engine's hostile suite and the v2 confinement's tests run here too.
#: ``v2-delegate``: the server as a systemd service with ``Delegate=yes``.
SUITES = (
    Suite(
        "v2-root",
        cgroup="/",
        files=(
            "tests/engine/test_hostile.py",
            "tests/engine/test_cgroup_v2.py",
            "tests/server/test_host_shapes.py",
        ),
    ),
    Suite(
        "v2-delegate",
        cgroup="/system.slice/cg2vm-tests.service",
        unit_parent="/sys/fs/cgroup/system.slice",
        files=("tests/server/test_host_shapes.py",),
        host_shapes_from_env=False,
    ),
)


def kernel() -> Path | None:
    """Debian 12's kernel (6.1), unless ``CG2VM_KERNEL`` names another."""
    if named := os.environ.get("CG2VM_KERNEL"):
        return Path(named)
    found = sorted(glob.glob("/boot/vmlinuz-6.1.*"))
    return Path(found[-1]) if found else None


def unavailable_reason(root_way: str = "ext4") -> str | None:
    """Why the guest cannot be made on this machine, and how to get what is missing (``None``: it
    can)."""
    apt = "apt-get install -y --no-install-recommends qemu-system-x86 linux-image-amd64 busybox-static"
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return f"{UNAVAILABLE}not an x86_64 Linux machine"
    if os.geteuid() != 0:
        return f"{UNAVAILABLE}needs root (to export the host's files to the guest and build its image)"
    if not SCRIPT.is_file():
        return f"{UNAVAILABLE}no {SCRIPT}"
    if shutil.which(os.environ.get("CG2VM_QEMU", "qemu-system-x86_64")) is None:
        return f"{UNAVAILABLE}no qemu-system-x86_64 ({apt})"
    image = kernel()
    if image is None or not image.is_file():
        return f"{UNAVAILABLE}no Debian 12 kernel /boot/vmlinuz-6.1.* ({apt}; or CG2VM_KERNEL=...)"
    version = image.name.removeprefix("vmlinuz-")
    if not Path(f"/lib/modules/{version}").is_dir():
        return f"{UNAVAILABLE}no /lib/modules/{version} for {image} ({apt})"
    busybox = shutil.which("busybox")
    ldd = subprocess.run(["ldd", busybox or "/nonexistent"], capture_output=True, text=True)
    if busybox is None or "not a dynamic" not in ldd.stdout + ldd.stderr:
        return f"{UNAVAILABLE}no static busybox ({apt})"
    if root_way == "ext4" and shutil.which("mke2fs") is None:
        return f"{UNAVAILABLE}no mke2fs for the guest's ext4 root (apt-get install e2fsprogs)"
    return None


# ---- the guest's root file system ----


def _relative(path: Path) -> str:
    return str(path.resolve()).lstrip("/")


def image_paths() -> list[str]:
    """What the guest's ext4 root is made of: the system (``etc usr var/lib``), the venv's base
    Python, the runtime dir (``mocksandbox runtime install``) and its Python; not the rest of root's
    home (credentials, caches), not the checkout (it comes live over 9p)."""
    paths = ["etc", "usr", "var/lib"]
    extra: list[Path] = [Path(sys.base_prefix)]
    try:
        from mocksandbox.settings import load_settings

        runtime = Path(load_settings().runtime_dir)
    except Exception:  # (a settings error: no runtime dir to bring)
        runtime = None
    if runtime is not None and runtime.exists():
        extra.append(runtime)
        for cfg in runtime.glob("*/venv/pyvenv.cfg"):
            for line in cfg.read_text().splitlines():
                if line.startswith("home"):
                    extra.append(Path(line.split("=", 1)[1].strip()).parent)
    live = _relative(REPO).split("/")[0]
    for path in extra:
        rel = _relative(path)
        if rel.split("/")[0] != live and not any(rel == p or rel.startswith(p + "/") for p in paths):
            paths.append(rel)
    return paths


#: Left out of the image beyond the script's own list (caches, credentials): what no test run in the
#: guest reads, and the bulk of a build's time (``CG2VM_IMAGE_EXCLUDE`` replaces the whole list).
IMAGE_EXCLUDE = (
    "root/.cache root/.rustup root/.m2 root/.npm root/.cargo var/lib/apt/lists usr/lib/google-cloud-sdk "
    "usr/share/doc usr/share/man usr/share/locale usr/share/icons usr/lib/jvm usr/lib/chromium "
    "var/lib/docker var/lib/containerd"
)


def _fingerprint(paths: Iterable[str]) -> dict[str, float]:
    """What says the image is stale: dpkg's status (a package installed or removed), and the
    newest modification time one level down each path outside the system's (a Python or a runtime
    re-made). Not /etc's or /usr's own files, which change for reasons no test sees."""
    marks = {}
    for rel in ["var/lib/dpkg/status", *(p for p in paths if p.split("/")[0] not in ("etc", "usr", "var"))]:
        top = Path("/") / rel
        newest = top.stat().st_mtime if top.exists() else 0.0
        for child in top.iterdir() if top.is_dir() else []:
            try:
                newest = max(newest, child.lstat().st_mtime)
            except OSError:
                pass
        marks[rel] = newest
    return marks


def image_file() -> Path:
    default = (
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mocksandbox-cg2vm" / "root.ext4"
    )
    return Path(os.environ.get("CG2VM_IMAGE", default))


def ensure_image(log: list[str]) -> tuple[Path, str, float]:
    """The guest's ext4 root, built (or rebuilt, if stale) under a lock: ``(image, paths, seconds
    spent building)``."""
    image = image_file()
    image.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(image.parent, 0o700)  # it holds a copy of /etc/shadow
    paths = " ".join(image_paths())
    stamp = image.with_suffix(".stamp")
    exclude = os.environ.get("CG2VM_IMAGE_EXCLUDE", IMAGE_EXCLUDE)
    wanted = json.dumps({"paths": paths, "exclude": exclude, "marks": _fingerprint(paths.split())})
    with open(image.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fresh = stamp.is_file() and stamp.read_text() == wanted and os.environ.get("CG2VM_REBUILD") != "1"
        if image.is_file() and fresh:
            return image, paths, 0.0
        start = time.monotonic()
        done = subprocess.run(
            [str(SCRIPT), "true"],
            cwd=REPO,
            env={
                **os.environ,
                "CG2VM_ROOT": "ext4",
                "CG2VM_IMAGE": str(image),
                "CG2VM_IMAGE_PATHS": paths,
                "CG2VM_IMAGE_EXCLUDE": exclude,
                "CG2VM_REBUILD": "1",
            },
            capture_output=True,
            text=True,
            timeout=3600,
        )
        log.append(done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"building the guest's image failed:\n{done.stderr[-4000:]}")
        stamp.write_text(wanted)
        return image, paths, time.monotonic() - start


# ---- a run in the guest ----


@dataclass
class GuestResult:
    """One guest test's result: its outcome (``passed``, ``failed``, ``error``, ``skipped``,
    ``xfailed``, ``xpassed``), the text to show, the seconds of its phases."""

    outcome: str = "passed"
    text: str = ""
    seconds: float = 0.0


@dataclass
class GuestRun:
    """What one boot of the guest gave."""

    suite: Suite
    selection: list[str]
    script_status: int | None = None
    host_seconds: float = 0.0
    image_build_seconds: float = 0.0
    results: dict[str, GuestResult] = field(default_factory=dict)
    collected: list[str] = field(default_factory=list)
    finished: bool = False
    summary: dict[str, Any] = field(default_factory=dict)
    console: str = ""
    error: str | None = None
    load: list[float] = field(default_factory=list)

    def facts(self) -> dict[str, Any]:
        """What the report says of this boot (timings, memory, shape)."""
        s = self.summary
        return {
            "suite": self.suite.name,
            "kernel": s.get("kernel"),
            "accel": "kvm" if "guest: kvm" in self.console else "tcg",
            "cgroup": s.get("cgroup"),
            "root subtree_control": s.get("root_subtree_control"),
            "root fs": s.get("root_fs"),
            "host seconds": round(self.host_seconds, 1),
            "image build seconds": round(self.image_build_seconds, 1),
            "boot seconds (uptime at start)": s.get("uptime_at_start"),
            "import seconds": s.get("import_s"),
            "doctor seconds": (s.get("doctor") or {}).get("seconds"),
            "pytest seconds": s.get("pytest_s"),
            "memory peak MiB": s.get("memory_peak_mib"),
            "memory MiB": s.get("memory_total_mib"),
            "tests": len(self.results),
            "host load average (before, after)": self.load,
        }

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.console.splitlines()[-lines:])


def _outcome(records: list[dict[str, Any]]) -> GuestResult:
    """One test's result from its reports (setup, call, teardown), as pytest counts it."""
    result = GuestResult()
    for record in records:
        result.seconds += record["duration"]
        when, outcome = record["when"], record["outcome"]
        if record.get("wasxfail") is not None:
            result.outcome = "xfailed" if outcome == "skipped" else "xpassed"
            result.text = str(record["wasxfail"])
        elif outcome == "skipped" and result.outcome == "passed":
            result.outcome, result.text = "skipped", record.get("skip_reason") or ""
        elif outcome == "failed":
            failed = "failed" if when == "call" else "error"
            text = f"({when} in the guest)\n{record['longrepr']}"
            if result.outcome in ("failed", "error"):
                result.text += "\n\n" + text
            else:
                result.outcome, result.text = failed, text
    return result


def collect(files: Iterable[str]) -> list[str]:
    """The node ids pytest collects from ``files`` here (the same code the guest collects)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    ids = [line.strip() for line in done.stdout.splitlines() if "::" in line]
    if done.returncode != 0 or not ids:
        raise RuntimeError(f"collecting {list(files)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return ids


#: The files whose contents decide what the suites collect, beside the suites' own.
COLLECTION_INPUTS = (
    "pyproject.toml",
    "tests/conftest.py",
    "tests/ci_skips.py",
    "tests/engine/conftest.py",
    "tests/server/conftest.py",
    "tests/server/serve_process.py",
)


def collect_cached(files: tuple[str, ...], cache: Any) -> list[str]:
    """:func:`collect`, kept in pytest's ``cache`` (``config.cache``, or ``None``) under a digest
    of the files that decide it."""
    digest = hashlib.sha256()
    for name in (*COLLECTION_INPUTS, *files):
        path = REPO / name.split("::", 1)[0]
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b""))
    key = f"cg2vm/collected/{digest.hexdigest()[:16]}"
    if cache is not None and (ids := cache.get(key, None)) is not None:
        return list(ids)
    ids = collect(files)
    if cache is not None:
        cache.set(key, ids)
    return ids


def select(suite: Suite, collected: Iterable[str]) -> list[str]:
    """The suite's node ids: test_host_shapes.py's only for the shapes asked for."""
    shapes = suite.host_shapes()
    chosen = []
    for nodeid in collected:
        if "test_host_shapes.py::" in nodeid:
            param = nodeid.rsplit("[", 1)[-1].rstrip("]") if nodeid.endswith("]") else None
            if param not in shapes:
                continue
        chosen.append(nodeid)
    return chosen


def _guest_environment() -> list[str]:
    """Variables of this run that the guest's pytest gets (the guest starts from an empty
    environment): the suite's settings, not CI's "every part is required", which is applied on
    this side (tests/ci_skips.py) to the guest's skips as to the host's."""
    keep = [
        f"{name}={value}"
        for name, value in os.environ.items()
        if name.startswith("MOCKSANDBOX_") and name != "MOCKSANDBOX_REQUIRE_ALL"
    ]
    return ["--env=NO_PROXY=127.0.0.1,localhost", *(f"--env={pair}" for pair in keep)]


#: Top-level dirs the guest has of its own (from the image, or made fresh: /tmp): a checkout or venv
#: under one comes live from the host by its own path instead (see :func:`live_dirs`).
GUEST_OWN_TOPS = frozenset(
    ("etc", "var", "root", "home", "opt", "srv", "usr", "tmp", "proc", "sys", "dev", "run", "boot")
)


def live_dirs(*paths: str) -> str:
    """``CG2VM_LIVE`` for ``paths`` (the checkout, the venv): the top-level dir of each, or the path
    itself where its top is one the guest has of its own (a clone under /tmp, where the script's
    default, the current directory's top, would bring nothing)."""
    dirs: list[str] = []
    for path in paths:
        parts = Path(os.path.abspath(path)).parts[1:]
        if not parts:
            continue
        live = "/".join(parts) if parts[0] in GUEST_OWN_TOPS else parts[0]
        if live not in dirs:
            dirs.append(live)
    return " ".join(dirs)


def run_suite(suite: Suite, selection: list[str]) -> GuestRun:
    """Boot the guest for ``suite``, run its files there (of test_host_shapes.py, only the shapes
    it asks for), and read back what it gave; ``selection``: what this side expects to run."""
    run = GuestRun(suite, selection)
    root_way = os.environ.get("CG2VM_ROOT", "ext4")
    env = {
        **os.environ,
        "CG2VM_ROOT": root_way,
        "CG2VM_CGROUP": suite.cgroup,
        "CG2VM_MEM": os.environ.get("CG2VM_MEM", "4G"),
        "CG2VM_TIMEOUT": os.environ.get("CG2VM_GUEST_TIMEOUT", "2400"),
    }
    if (image := kernel()) is not None:
        env["CG2VM_KERNEL"] = str(image)
    log: list[str] = []
    if root_way == "ext4":
        try:
            image_path, paths, run.image_build_seconds = ensure_image(log)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            run.error = str(error)
            return run
        env.update({"CG2VM_IMAGE": str(image_path), "CG2VM_IMAGE_PATHS": paths})
    share = Path(tempfile.mkdtemp(prefix="cg2vm-share-"))
    try:
        env["CG2VM_SHARE_RW"] = str(share)
        python = REPO / ".venv" / "bin" / "python"
        if not python.exists():
            python = Path(sys.executable)
        env.setdefault("CG2VM_LIVE", live_dirs(str(REPO), str(python.parent.parent)))
        guest = [str(python), "tests/vm/cg2vm_guest.py", f"--out={share}", *_guest_environment()]
        if suite.unit_parent:
            guest.append(f"--unit-parent={suite.unit_parent}")
        if suite.doctor:
            guest.append("--doctor")
        guest.append(f"--env=CG2VM_HOST_SHAPES={' '.join(suite.host_shapes())}")
        # The files, not the node ids: a test renamed since this side collected is then reported
        # as not run here and run there, instead of stopping the guest's pytest ("not found").
        guest += ["--", "-rfEs", *suite.files]
        command = f"cd {shlex.quote(str(REPO))} && exec {shlex.join(guest)}"
        start = time.monotonic()
        run.load.append(round(os.getloadavg()[0], 1))
        with open(share / "host-console.txt", "w+") as console:
            process = subprocess.Popen(
                [str(SCRIPT), command],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                run.script_status = process.wait(timeout=int(env["CG2VM_TIMEOUT"]) + 120)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                run.error = "the guest did not finish within CG2VM_GUEST_TIMEOUT"
            run.host_seconds = time.monotonic() - start
            run.load.append(round(os.getloadavg()[0], 1))
            console.seek(0)
            run.console = "".join(log) + console.read()
        _read_back(run, share)
        if artifacts := os.environ.get("CG2VM_ARTIFACTS"):
            keep = Path(artifacts) / suite.name
            shutil.rmtree(keep, ignore_errors=True)
            shutil.copytree(share, keep)
    finally:
        shutil.rmtree(share, ignore_errors=True)
    return run


def _read_back(run: GuestRun, share: Path) -> None:
    try:
        run.summary = json.loads((share / "summary.json").read_text())
    except (OSError, ValueError):
        run.error = run.error or "the guest wrote no summary (it did not start its tests)"
    records: dict[str, list[dict[str, Any]]] = {}
    try:
        lines = (share / "results.jsonl").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # (a line cut short by a guest that died)
        if record["event"] == "collected":
            run.collected = record["nodeids"]
        elif record["event"] == "report":
            records.setdefault(record["nodeid"], []).append(record)
        elif record["event"] == "finish":
            run.finished = True
    run.results = {nodeid: _outcome(reports) for nodeid, reports in records.items()}


def main(argv: list[str]) -> int:
    """``python tests/vm/cg2vm.py [SUITE ...]``: run suites by hand and print what they gave."""
    names = argv or [suite.name for suite in SUITES]
    if (reason := unavailable_reason(os.environ.get("CG2VM_ROOT", "ext4"))) is not None:
        print(reason, file=sys.stderr)
        return 2
    status = 0
    for suite in SUITES:
        if suite.name not in names:
            continue
        run = run_suite(suite, select(suite, collect(suite.files)))
        print(json.dumps(run.facts(), indent=1))
        for nodeid, result in run.results.items():
            print(f"{result.outcome:8} {result.seconds:7.1f}s {nodeid}")
            if result.outcome in ("failed", "error"):
                print("    " + "\n    ".join(result.text.splitlines()[-12:]))
            if result.outcome != "passed":
                status = 1
        if run.error or not run.finished:
            print(run.error or "the guest's pytest did not finish", run.tail(), sep="\n")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
