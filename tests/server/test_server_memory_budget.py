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
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_process import (
    ServeProcess,
    kill_and_remove,
    make_test_cgroup,
    start_serve,
    stop_serve_leaving_nothing,
)

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


def _limit_memory(group: Path) -> None:
    # Lowering from unlimited: the plain limit first, then swap (never below the plain one).
    (group / "memory.limit_in_bytes").write_text(str(SERVER_MEMORY_LIMIT))
    if (group / "memory.memsw.limit_in_bytes").exists():
        (group / "memory.memsw.limit_in_bytes").write_text(str(SERVER_MEMORY_LIMIT))


@pytest.fixture
def contained_server(tmp_path: Path) -> Iterator[ServeProcess]:
    """``mocksandbox serve`` inside a memory cgroup limited to :data:`SERVER_MEMORY_LIMIT` (swap
    included), its runs' temp dirs in ``tmp_path/runs``; the cgroup is removed afterwards with all
    it holds."""
    group = make_test_cgroup("memory", "memory", _limit_memory)
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    try:
        server = start_serve(cgroup=group, runs_dir=runs_dir)
        try:
            yield server
        finally:
            stop_serve_leaving_nothing(server)
    finally:
        kill_and_remove(group)


def _read(group: Path, name: str) -> int:
    return int((group / name).read_text())


def _own_oom_kills(server: ServeProcess) -> int:
    """Tasks of the server's own cgroup (the server, its launcher) the OOM killer took: the kernel
    counts a kill in the victim's cgroup, so kills of run processes are not among them."""
    assert server.cgroup is not None
    fields = (server.cgroup / "memory.oom_control").read_text().split()
    return int(fields[fields.index("oom_kill") + 1])


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


def test_banner_states_the_memory_budget(contained_server: ServeProcess) -> None:
    (line,) = [line for line in contained_server.banner if "memory budget:" in line]
    assert f"{SERVER_MEMORY_LIMIT // MIB} MiB (cgroup v1 memory.limit_in_bytes of /" in line, line
    assert contained_server.cgroup is not None and contained_server.cgroup.name in line, line
    runs_total = _read(contained_server.runs_parent(), "memory.limit_in_bytes")
    assert runs_total <= SERVER_MEMORY_LIMIT - 256 * MIB, "the server keeps a reserve for itself"
    (confinement,) = [line for line in contained_server.banner if "confinement:" in line]
    per_run_mib = int(confinement.split("memory=", 1)[1].split(" ", 1)[0])
    assert per_run_mib * MIB <= runs_total, confinement


def test_hogs_beside_ordinary_runs_are_killed_among_themselves(contained_server: ServeProcess) -> None:
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
    assert _read(parent, "memory.max_usage_in_bytes") == _read(parent, "memory.limit_in_bytes")
    # ...and the server's own cgroup never reached its limit, nor lost a task of its own.
    assert server.cgroup is not None
    assert _read(server.cgroup, "memory.max_usage_in_bytes") < SERVER_MEMORY_LIMIT
    assert _own_oom_kills(server) == 0
    # Nothing left behind, and the server still answers.
    deadline = time.monotonic() + 15  # returns once drained; a loaded machine reaps slowly
    while (parent / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    for group in [parent, *parent.glob("run-*")]:
        assert (group / "cgroup.procs").read_text().strip() == "", f"a run's process is left in {group}"
    assert server.runs_left() == []
    assert server.process.poll() is None, "the server was killed"
    _assert_ordinary(server.run("print(6*7)"), "42\n")
