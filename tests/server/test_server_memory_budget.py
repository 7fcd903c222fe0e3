"""A server that lives under a memory budget (a container's memory limit) survives runs that together
outgrow it: the OOM they cause happens among the runs, never in the server's own cgroup.

The server runs as ``mocksandbox serve`` in a memory cgroup of its own limited to 1.5 GiB, as a
container would place it. A run forks 30 children that each touch 60 MB and sleep: each is smaller
than the server, all together larger than its whole cgroup. Before the runs were capped together
below the server's limit, such a run drove the server's cgroup to its limit, where the kernel's OOM
killer takes the largest task of the whole cgroup: the server itself, its launcher or a kernel as
readily as the hog.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from mocksandbox.execution.confinement import CgroupConfinement

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
#: The server's memory limit: a small container's.
SERVER_MEMORY_LIMIT = 1536 * MIB
#: 30 children of 60 MB each: 1.8 GB in all, more than the server's whole cgroup.
HOG = (
    "import os, time\n"
    "for _ in range(30):\n"
    "    if os.fork() == 0:\n"
    "        data = b'\\x01' * (60 << 20)\n"
    "        time.sleep(60)\n"
    "        os._exit(0)\n"
    "time.sleep(60)\n"
)


def _own_memory_cgroup() -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    raise FileNotFoundError("no v1 memory controller")


def _kill_and_remove(group: Path) -> None:
    """Kill every task in ``group`` and the groups below it, then remove them all."""
    groups = [group, *sorted((d for d in group.rglob("*") if d.is_dir()), reverse=True)]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = [int(p) for g in groups if g.exists() for p in (g / "cgroup.procs").read_text().split()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    for child in [*groups[1:], group]:
        try:
            child.rmdir()
        except OSError:
            pass


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A memory cgroup limited to :data:`SERVER_MEMORY_LIMIT` (swap included), removed afterwards
    with all it holds."""
    if not CgroupConfinement.available():
        pytest.skip("cgroup v1 pids/memory/freezer controllers are not writable here: no memory cgroup")
    group = _own_memory_cgroup() / f"mocksandbox-test-memory-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        # Lowering from unlimited: the plain limit first, then swap (never below the plain one).
        (group / "memory.limit_in_bytes").write_text(str(SERVER_MEMORY_LIMIT))
        if (group / "memory.memsw.limit_in_bytes").exists():
            (group / "memory.memsw.limit_in_bytes").write_text(str(SERVER_MEMORY_LIMIT))
    except OSError as exc:
        _kill_and_remove(group)
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    try:
        yield group
    finally:
        _kill_and_remove(group)


@dataclass
class ContainedServer:
    url: str
    process: subprocess.Popen[str]
    cgroup: Path
    runs_dir: Path
    banner: list[str]

    def run(self, code: str, language: str = "python", **fields: object) -> dict[str, object]:
        response = requests.post(
            f"{self.url}/run_code",
            json={"code": code, "language": language, **fields},
            timeout=60,
            proxies={"http": "", "https": ""},
        )
        assert response.status_code == 200, response.text
        answer: dict[str, object] = response.json()
        return answer

    def runs_parent(self) -> Path:
        """The memory cgroup that holds every run's cgroup (``mocksandbox-<server pid>-<n>``)."""
        (parent,) = self.cgroup.glob(f"mocksandbox-{self.process.pid}-*")
        return parent

    def read(self, name: str, group: Path | None = None) -> int:
        return int(((group or self.cgroup) / name).read_text())

    def own_oom_kills(self) -> int:
        """Tasks of the server's own cgroup (the server, its launcher) the OOM killer took: the
        kernel counts a kill in the victim's cgroup, so kills of run processes are not among them."""
        fields = (self.cgroup / "memory.oom_control").read_text().split()
        return int(fields[fields.index("oom_kill") + 1])


@pytest.fixture
def contained_server(
    memory_cgroup: Path, tmp_path: Path, serve_in_cgroup: Callable[[Path, Path], Any]
) -> ContainedServer:
    """``mocksandbox serve`` started inside the memory cgroup (it joins before it execs)."""
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    served = serve_in_cgroup(memory_cgroup, runs_dir)
    return ContainedServer(served.url, served.process, memory_cgroup, runs_dir, served.banner)


def _assert_ordinary(answer: dict[str, object], expected: str) -> None:
    run_result = answer["run_result"]
    assert answer["status"] == "Success", answer
    assert isinstance(run_result, dict) and run_result["stdout"] == expected, answer


def _assert_hog_ended(answer: dict[str, object]) -> None:
    """Killed: by the OOM killer (rc -9) or at its timeout; never answered as a success."""
    run_result = answer["run_result"]
    assert answer["status"] == "Failed", answer
    assert isinstance(run_result, dict)
    assert run_result["status"] == "TimeLimitExceeded" or run_result["return_code"] == -9, answer


def test_banner_states_the_memory_budget(contained_server: ContainedServer) -> None:
    (line,) = [line for line in contained_server.banner if "memory budget:" in line]
    assert f"{SERVER_MEMORY_LIMIT // MIB} MiB (cgroup v1 memory.limit_in_bytes of /" in line, line
    assert contained_server.cgroup.name in line, line
    runs_total = contained_server.read("memory.limit_in_bytes", contained_server.runs_parent())
    assert runs_total <= SERVER_MEMORY_LIMIT - 256 * MIB, "the server keeps a reserve for itself"
    (confinement,) = [line for line in contained_server.banner if "confinement:" in line]
    per_run_mib = int(confinement.split("memory=", 1)[1].split(" ", 1)[0])
    assert per_run_mib * MIB <= runs_total, confinement


def test_hogs_beside_ordinary_runs_are_killed_among_themselves(contained_server: ContainedServer) -> None:
    """A hog alone, then three at once while twelve ordinary runs go on: the server stays up, every
    ordinary run is right, the hogs end, and the server's own cgroup never reaches its limit."""
    server = contained_server
    _assert_hog_ended(server.run(HOG, run_timeout=4))
    assert server.process.poll() is None, "the server was killed"
    _assert_ordinary(server.run("print(6*7)"), "42\n")
    with concurrent.futures.ThreadPoolExecutor(max_workers=15) as pool:
        hogs = [pool.submit(server.run, HOG, run_timeout=4) for _ in range(3)]
        time.sleep(1.0)  # the hogs are at their budget before the ordinary runs arrive
        ordinary = [pool.submit(server.run, f"print({i} + 1000)") for i in range(12)]
        for i, future in enumerate(ordinary):
            _assert_ordinary(future.result(), f"{i + 1000}\n")
        for future in hogs:
            _assert_hog_ended(future.result())
    # What the change guarantees: the OOMs happened in the runs' parent, which reached its cap...
    parent = server.runs_parent()
    assert server.read("memory.max_usage_in_bytes", parent) == server.read("memory.limit_in_bytes", parent)
    # ...and the server's own cgroup never reached its limit, nor lost a task of its own.
    assert server.read("memory.max_usage_in_bytes") < SERVER_MEMORY_LIMIT
    assert server.own_oom_kills() == 0
    # Nothing left behind, and the server still answers.
    deadline = time.monotonic() + 5
    while (parent / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    for group in [parent, *parent.glob("run-*")]:
        assert (group / "cgroup.procs").read_text().strip() == "", f"a run's process is left in {group}"
    assert list(server.runs_dir.iterdir()) == []
    assert server.process.poll() is None, "the server was killed"
    _assert_ordinary(server.run("print(6*7)"), "42\n")
