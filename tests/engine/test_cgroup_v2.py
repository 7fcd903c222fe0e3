"""Confinement on cgroup v2, in two halves.

* The limits (``pids``, ``memory``) against a fake cgroup tree of plain files that keeps the
  kernel's rules: a control file exists only once its controller is enabled above it, a cgroup
  that holds a process cannot enable controllers for its children, nor can a process be moved into
  one that has. A write to the wrong file, or in the wrong order, fails there as it would on v2.
  The machines this project is tested on have no v2 ``pids`` or ``memory`` controller.
* What v2 holds without them, for real, on this host's v2 hierarchy: the subtree, the server's move
  into its leaf, the leaf rule (with ``hugetlb`` or whatever controller the v2 root offers),
  ``cgroup.kill`` and the freeze-and-kill fallback on a whole tree (a double-forked daemon, a
  ``setsid`` child, a fork storm), ``cgroup.freeze``, ``cgroup.events``, removal, reclaiming a dead
  server's subtree, and joining as an unprivileged uid. These need root and a cgroup2 mount only.
  Programs that misbehave run in a PID namespace of their own (``unshare --pid --fork
  --kill-child``); the test signals nothing it did not start.
"""

from __future__ import annotations

import errno
import functools
import importlib.util
import os
import secrets
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import mocksandbox
from mocksandbox.core import MockSandbox
from mocksandbox.execution import cgroup_v2
from mocksandbox.execution import engine as engine_module
from mocksandbox.execution.budget import MIB, MemoryBudget, ProcessBudget
from mocksandbox.execution.cgroup_v2 import (
    CgroupFs,
    CgroupV2Confinement,
    enable_controllers,
    home_of,
    own_cgroup_v2_dir,
    reclaim_dead_subtrees,
    set_limits,
)
from mocksandbox.execution.confinement import CgroupConfinement, ProcessGroupConfinement, create_confinement
from mocksandbox.execution.world import lite_unavailable_reason
from mocksandbox.models import RunCodeRequest, RunStatus
from mocksandbox.settings import load_settings

#: One worker runs them all, one after another: the real-hierarchy tests share one home, where each
#: confinement made reclaims every dead subtree it finds, another test's included.
pytestmark = pytest.mark.xdist_group("cgroup-v2")

# -- a fake cgroup v2 tree ---------------------------------------------------------------------------

_CORE_FILES = ("cgroup.procs", "cgroup.subtree_control", "cgroup.events", "cgroup.kill", "cgroup.freeze")
_CONTROLLER_FILES = {
    "pids": {"pids.max": "max", "pids.current": "0"},
    "memory": {"memory.max": "max", "memory.swap.max": "max", "memory.current": "0"},
    "hugetlb": {"hugetlb.2MB.max": "max"},
}


class FakeCgroupFs(CgroupFs):
    """A cgroup v2 hierarchy of plain files under ``root``, holding every operation to v2's rules
    and recording it (as ``(op, path relative to root, value)``)."""

    def __init__(self, root: Path, offered: str = "pids memory hugetlb") -> None:
        self.root = root
        self.ops: list[tuple[str, str, str]] = []
        root.mkdir()
        for name in _CORE_FILES:
            (root / name).write_text("")
        (root / "cgroup.controllers").write_text(offered)

    def _rel(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    @staticmethod
    def _procs(group: Path) -> list[str]:
        return (group / "cgroup.procs").read_text().split()

    def _controller_files(self, group: Path, controller: str) -> None:
        for name, value in _CONTROLLER_FILES[controller].items():
            if not (group / name).exists():
                (group / name).write_text(value)

    def mkdir(self, path: Path) -> None:
        self.ops.append(("mkdir", self._rel(path), ""))
        os.mkdir(path)
        for name in _CORE_FILES:
            (path / name).write_text("")
        (path / "cgroup.events").write_text("populated 0\nfrozen 0\n")
        given = (path.parent / "cgroup.subtree_control").read_text().split()
        (path / "cgroup.controllers").write_text(" ".join(given))
        for controller in given:
            self._controller_files(path, controller)

    def rmdir(self, path: Path) -> None:
        self.ops.append(("rmdir", self._rel(path), ""))
        if not path.exists():
            raise FileNotFoundError(errno.ENOENT, "no such cgroup", str(path))
        if self._procs(path) or any(child.is_dir() for child in path.iterdir()):
            raise OSError(errno.EBUSY, "cgroup busy", str(path))
        shutil.rmtree(path)

    def chown(self, path: Path, uid: int, gid: int) -> None:
        self.ops.append(("chown", self._rel(path), f"{uid}:{gid}"))
        if not path.is_file():
            raise FileNotFoundError(errno.ENOENT, "no such control file", str(path))

    def write(self, path: Path, value: str) -> None:
        self.ops.append(("write", self._rel(path), value))
        if not path.is_file():
            raise FileNotFoundError(errno.ENOENT, "no such control file", str(path))
        group = path.parent
        if path.name == "cgroup.subtree_control":
            self._enable(group, value)
        elif path.name == "cgroup.procs":
            self._move(group, value)
        else:
            path.write_text(value)

    def _enable(self, group: Path, value: str) -> None:
        offered = (group / "cgroup.controllers").read_text().split()
        wanted = [token[1:] for token in value.split() if token.startswith("+")]
        unwanted = [token[1:] for token in value.split() if token.startswith("-")]
        if any(c not in offered for c in wanted):
            raise FileNotFoundError(errno.ENOENT, "controller not given to this cgroup")
        if wanted and group != self.root and self._procs(group):
            raise OSError(errno.EBUSY, "a cgroup holding processes cannot enable controllers")
        children = [c for c in group.iterdir() if c.is_dir()]
        if any(c in (child / "cgroup.subtree_control").read_text().split() for child in children for c in unwanted):
            raise OSError(errno.EBUSY, "a child has the controller enabled for its own children")
        enabled = (group / "cgroup.subtree_control").read_text().split()
        enabled = [c for c in enabled if c not in unwanted] + [c for c in wanted if c not in enabled]
        (group / "cgroup.subtree_control").write_text(" ".join(enabled))
        for child in children:
            (child / "cgroup.controllers").write_text(" ".join(enabled))
            for controller in enabled:
                self._controller_files(child, controller)
            for controller in unwanted:
                for name in _CONTROLLER_FILES[controller]:
                    (child / name).unlink(missing_ok=True)

    def _move(self, group: Path, pid: str) -> None:
        if group != self.root and (group / "cgroup.subtree_control").read_text().split():
            raise OSError(errno.EBUSY, "no process may join a cgroup with controllers enabled")
        for procs in self.root.rglob("cgroup.procs"):
            procs.write_text(" ".join(p for p in procs.read_text().split() if p != pid))
        procs = group / "cgroup.procs"
        procs.write_text(" ".join([*self._procs(group), pid]))


@pytest.fixture
def fake(tmp_path: Path) -> tuple[FakeCgroupFs, Path]:
    """A fake v2 hierarchy and, in it, a server's cgroup ``job`` (``pids`` and ``memory`` given to
    it) holding this process, as a systemd scope with ``Delegate=yes`` would."""
    fs = FakeCgroupFs(tmp_path / "cgroup")
    fs.write(fs.root / "cgroup.subtree_control", "+pids +memory")
    home = fs.root / "job"
    fs.mkdir(home)
    fs.write(home / "cgroup.procs", str(os.getpid()))
    fs.ops.clear()
    return fs, home


def _fake_confinement(fs: FakeCgroupFs, home: Path) -> CgroupV2Confinement:
    budget = ProcessBudget(binding=None, server_reserve=0, runs_total=256, per_run=32)
    memory = MemoryBudget(binding=None, server_reserve=0, runs_total=300 * MIB, per_run=200 * MIB)
    return CgroupV2Confinement(512, 4096, budget, memory, home=home, came_from=home, fs=fs)


def test_the_tree_is_built_in_the_order_v2_requires(fake: tuple[FakeCgroupFs, Path]) -> None:
    """The server leaves its cgroup before enabling controllers there, enables them top down, and
    writes each limit once its file exists; memory.swap.max 0 beside every memory.max."""
    fs, home = fake
    confinement = _fake_confinement(fs, home)
    sub = str(confinement.subtree.relative_to(fs.root))
    pid = str(os.getpid())
    assert fs.ops == [
        ("mkdir", sub, ""),
        ("mkdir", f"{sub}/server", ""),
        ("write", f"{sub}/server/cgroup.procs", pid),
        ("write", "job/cgroup.subtree_control", "+pids +memory"),
        ("write", f"{sub}/cgroup.subtree_control", "+pids +memory"),
        ("mkdir", f"{sub}/runs", ""),
        ("write", f"{sub}/runs/cgroup.subtree_control", "+pids +memory"),
        ("write", f"{sub}/runs/pids.max", "256"),
        ("write", f"{sub}/runs/memory.max", str(300 * MIB)),
        ("write", f"{sub}/runs/memory.swap.max", "0"),
        # The proof that a run's group can be made, configured and removed.
        ("mkdir", f"{sub}/runs/run-0", ""),
        ("write", f"{sub}/runs/run-0/pids.max", "32"),
        ("write", f"{sub}/runs/run-0/memory.max", str(200 * MIB)),
        ("write", f"{sub}/runs/run-0/memory.swap.max", "0"),
        ("rmdir", f"{sub}/runs/run-0", ""),
    ]
    assert (confinement.server_leaf / "cgroup.procs").read_text() == pid
    assert (home / "cgroup.procs").read_text() == ""
    assert confinement.describe() == "cgroup v2 per run (pids.max=32, memory=200 MiB, cgroup.kill)"
    jail = confinement.new_jail()
    assert jail.procs_files == [str(confinement.runs / "run-1" / "cgroup.procs")]
    assert jail.warm_procs_file == str(confinement.server_leaf / "cgroup.procs")
    jail.close()
    assert confinement.new_jail() is jail  # drained: reused
    jail.close()
    fs.ops.clear()
    confinement.close()
    # Undone in reverse: v2 lets no process back into a cgroup with controllers enabled for its
    # children, and refuses to disable one above a child that has it enabled.
    assert fs.ops == [
        ("rmdir", f"{sub}/runs/run-1", ""),
        ("rmdir", f"{sub}/runs", ""),
        ("write", f"{sub}/cgroup.subtree_control", "-pids -memory"),
        ("write", "job/cgroup.subtree_control", "-pids -memory"),
        ("write", "job/cgroup.procs", pid),
        ("rmdir", f"{sub}/server", ""),
        ("rmdir", sub, ""),
    ]
    assert (home / "cgroup.procs").read_text() == pid
    assert (home / "cgroup.subtree_control").read_text() == ""
    assert [p for p in home.iterdir() if p.is_dir()] == []


def test_closing_leaves_controllers_it_found_enabled_in_its_home(fake: tuple[FakeCgroupFs, Path]) -> None:
    """A home that had ``pids`` enabled for its children already (by whoever set it up) keeps it:
    only what this server enabled is given back. (A home with controllers enabled cannot have
    held the server, so the server came from elsewhere, here a leaf of its own beside.)"""
    fs, home = fake
    came_from = home / "elsewhere"
    fs.mkdir(came_from)
    fs.write(came_from / "cgroup.procs", str(os.getpid()))
    fs.write(home / "cgroup.subtree_control", "+pids")
    budget = ProcessBudget(binding=None, server_reserve=0, runs_total=256, per_run=32)
    memory = MemoryBudget(binding=None, server_reserve=0, runs_total=300 * MIB, per_run=200 * MIB)
    confinement = CgroupV2Confinement(512, 4096, budget, memory, home=home, came_from=came_from, fs=fs)
    assert ("write", "job/cgroup.subtree_control", "+memory") in fs.ops
    fs.ops.clear()
    confinement.close()
    assert ("write", "job/cgroup.subtree_control", "-memory") in fs.ops
    assert (home / "cgroup.subtree_control").read_text() == "pids"
    assert (came_from / "cgroup.procs").read_text() == str(os.getpid())
    assert not confinement.subtree.exists()


def test_controllers_another_server_beside_still_uses_stay_and_so_does_the_closing_one(
    fake: tuple[FakeCgroupFs, Path],
) -> None:
    """Two servers that left one home: the first enabled its controllers, the second found them.
    The first to close cannot take them (v2 refuses while the other's subtree uses them), so it
    stays in its leaf for the next server to reclaim once empty; the other is unharmed."""
    fs, home = fake
    first = _fake_confinement(fs, home)
    other = home / "beside"  # (the second server's subtree, once it has left home too)
    fs.mkdir(other)
    fs.write(other / "cgroup.subtree_control", "+pids +memory")
    first.close()
    assert (home / "cgroup.subtree_control").read_text().split() == ["pids", "memory"]
    assert (other / "cgroup.subtree_control").read_text().split() == ["pids", "memory"]
    assert (first.server_leaf / "cgroup.procs").read_text() == str(os.getpid())


def test_the_fake_tree_refuses_what_v2_refuses(fake: tuple[FakeCgroupFs, Path]) -> None:
    """The rules the test above relies on: enabling where a process sits, a limit before its
    controller, joining a cgroup that has controllers, a file that is not there."""
    fs, home = fake
    with pytest.raises(OSError) as busy:
        enable_controllers(fs, home, ["pids"])
    assert busy.value.errno == errno.EBUSY
    child = home / "child"
    fs.mkdir(child)
    with pytest.raises(FileNotFoundError):
        set_limits(fs, child, 16, None)  # pids is not enabled in home yet
    fs.write(child / "cgroup.procs", str(os.getpid()))
    enable_controllers(fs, home, ["pids"])
    set_limits(fs, child, 16, None)
    assert (child / "pids.max").read_text() == "16"
    with pytest.raises(OSError) as joining:
        fs.write(home / "cgroup.procs", str(os.getpid()))
    assert joining.value.errno == errno.EBUSY
    with pytest.raises(FileNotFoundError):
        fs.write(child / "memory.max", "1")  # memory was never enabled


def test_the_real_layer_never_creates_a_control_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        CgroupFs().write(tmp_path / "pids.max", "16")
    assert not (tmp_path / "pids.max").exists()


def test_limits_go_to_their_files_in_order_and_swap_only_where_accounted(tmp_path: Path) -> None:
    writes: list[tuple[str, str]] = []

    class Recording(CgroupFs):
        def write(self, path: Path, value: str) -> None:
            writes.append((path.name, value))
            super().write(path, value)

    for name in ("pids.max", "memory.max", "memory.swap.max"):
        (tmp_path / name).write_text("max")
    set_limits(Recording(), tmp_path, 16, 64 * MIB)
    assert writes == [("pids.max", "16"), ("memory.max", str(64 * MIB)), ("memory.swap.max", "0")]
    writes.clear()
    (tmp_path / "memory.swap.max").unlink()  # no swap accounting on this kernel
    set_limits(Recording(), tmp_path, None, 32 * MIB)
    assert writes == [("memory.max", str(32 * MIB))]
    writes.clear()
    set_limits(Recording(), tmp_path, None, None)
    assert writes == []


def test_a_home_shared_with_other_processes_is_refused_and_left_as_it_was(
    fake: tuple[FakeCgroupFs, Path],
) -> None:
    """v2 cannot enable controllers where another process sits, and the server moves none but
    itself: it says so, moves back, and leaves nothing behind."""
    fs, home = fake
    (home / "cgroup.procs").write_text(f"{os.getpid()} 4242")
    with pytest.raises(OSError) as refused:
        _fake_confinement(fs, home)
    assert refused.value.errno == errno.EBUSY
    assert "holds other processes (1, e.g. pid 4242)" in str(refused.value)
    assert "systemd-run --scope -p Delegate=yes" in str(refused.value)
    assert sorted((home / "cgroup.procs").read_text().split()) == sorted([str(os.getpid()), "4242"])
    assert [p.name for p in home.iterdir() if p.is_dir()] == []


@pytest.mark.parametrize(
    ("others", "said"),
    [
        ("0 0 0", "(3, of other PID namespaces)"),
        ("4242 0 0", "(3, e.g. pid 4242; 2 of other PID namespaces)"),
        ("4242 4243 4244 4245", "(4, e.g. pid 4242, 4243, 4244)"),
    ],
    ids=["all-hidden", "some-hidden", "none-hidden"],
)
def test_other_processes_of_the_home_are_counted_those_of_other_pid_namespaces_too(
    fake: tuple[FakeCgroupFs, Path], others: str, said: str
) -> None:
    """The kernel lists a process of another PID namespace as pid 0 (a server in a container
    beside the host's processes): it holds the home as much as one that is seen."""
    fs, home = fake
    (home / "cgroup.procs").write_text(f"{os.getpid()} {others}")
    with pytest.raises(OSError) as refused:
        _fake_confinement(fs, home)
    assert refused.value.errno == errno.EBUSY
    assert f"holds other processes {said}: v2 enables" in str(refused.value)


def test_a_home_without_the_limit_controllers_is_refused(tmp_path: Path) -> None:
    fs = FakeCgroupFs(tmp_path / "cgroup", offered="hugetlb")
    with pytest.raises(OSError) as refused:
        CgroupV2Confinement(512, 4096, home=fs.root, came_from=fs.root, fs=fs)
    assert "is given no pids or memory controller (its cgroup.controllers: hugetlb)" in str(refused.value)
    assert fs.ops == []


def test_runs_of_another_uid_get_their_procs_file_and_the_common_ancestors(
    fake: tuple[FakeCgroupFs, Path],
) -> None:
    fs, home = fake
    confinement = _fake_confinement(fs, home)
    idle = confinement.new_jail()
    idle.close()
    fs.ops.clear()
    confinement.delegate_runs_to(65534, 65534)
    jail = confinement.new_jail()
    assert jail is not idle  # made for the server's user: not reused
    sub = str(confinement.subtree.relative_to(fs.root))
    # Only these two: the limits, cgroup.kill and the server's leaf stay the server's.
    assert [op for op in fs.ops if op[0] == "chown"] == [
        ("chown", f"{sub}/cgroup.procs", "65534:65534"),
        ("chown", f"{sub}/runs/run-2/cgroup.procs", "65534:65534"),
    ]
    jail.close()
    fs.ops.clear()
    confinement.delegate_runs_to(None, None)
    assert fs.ops[0] == ("chown", f"{sub}/cgroup.procs", f"{os.geteuid()}:{os.getegid()}")
    assert confinement.new_jail() is not jail  # made for the runs' uid: not reused either
    confinement.close()


def test_the_home_of_a_process_already_in_a_servers_leaf_is_that_servers_home() -> None:
    """A second sandbox of one process, or a server started by one, sits in a leaf already."""
    assert home_of(Path("/sys/fs/cgroup/job/mocksandbox-1-ab12/server")) == Path("/sys/fs/cgroup/job")
    assert home_of(Path("/sys/fs/cgroup/job/server")) == Path("/sys/fs/cgroup/job/server")
    assert home_of(Path("/sys/fs/cgroup/job")) == Path("/sys/fs/cgroup/job")


@pytest.mark.parametrize(
    ("mountinfo", "cgroup", "expected"),
    [
        (
            "35 24 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate",
            "0::/user.slice/user-1000.slice/app.scope",
            "/sys/fs/cgroup/user.slice/user-1000.slice/app.scope",
        ),
        (
            "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw",
            "0::/",
            "/sys/fs/cgroup/unified",
        ),
        # The host's hierarchy mounted from a container's cgroup down (no cgroup namespace).
        (
            "50 40 0:30 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw",
            "0::/docker/abc/sub",
            "/sys/fs/cgroup/sub",
        ),
        ("50 40 0:30 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw", "0::/elsewhere", None),
        (r"50 40 0:30 / /mnt/cg\040two rw - cgroup2 cgroup2 rw", "0::/a", "/mnt/cg two/a"),
        ("22 1 0:20 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids", "12:pids:/", None),
    ],
)
def test_the_own_cgroup_is_read_off_proc(
    tmp_path: Path, mountinfo: str, cgroup: str, expected: str | None
) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "mountinfo").write_text(mountinfo + "\n")
    (tmp_path / "self" / "cgroup").write_text(cgroup + "\n")
    found = own_cgroup_v2_dir(tmp_path)
    assert (str(found) if found is not None else None) == expected


# -- this host's v2 hierarchy ---------------------------------------------------------------------

_OWN = own_cgroup_v2_dir()
needs_v2 = pytest.mark.skipif(
    _OWN is None or os.geteuid() != 0 or not os.access(home_of(_OWN), os.W_OK),
    reason="needs root and a writable cgroup v2 hierarchy holding this process",
)
UNSHARE = shutil.which("unshare")
needs_unshare = pytest.mark.skipif(UNSHARE is None, reason="needs util-linux unshare")


def _cgroup_of(pid: int | str) -> str:
    """The v2 path (``0::``) of a process."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise AssertionError(f"process {pid} is in no v2 cgroup")


def _v2_path(directory: Path) -> str:
    mount = cgroup_v2.cgroup2_mount()
    assert mount is not None
    relative = os.path.relpath(directory, mount[0])
    return "/" if relative == "." else "/" + relative


def _populated(group: Path) -> bool:
    return "populated 1" in (group / "cgroup.events").read_text()


def _wait_for(condition: object, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _wait_alone_in_leaf(confinement: CgroupV2Confinement) -> None:
    """Until what this test started (a namespace's PID 1, killed with its ``unshare``) has left
    the server's leaf, which holds this process alone again."""
    procs = confinement.server_leaf / "cgroup.procs"
    _wait_for(lambda: procs.read_text().split() == [str(os.getpid())])


@pytest.fixture
def confinement() -> Iterator[CgroupV2Confinement]:
    """A v2 confinement without limit controllers (this host's v2 has none): this process is moved
    into its leaf, and back afterwards."""
    assert _OWN is not None
    before = _cgroup_of("self")
    box = CgroupV2Confinement(64, 256, controllers=())
    yield box
    box.close()
    assert _cgroup_of("self") == before
    assert not box.subtree.exists()


@needs_v2
def test_the_server_moves_into_its_leaf_and_what_it_forks_starts_there(
    confinement: CgroupV2Confinement,
) -> None:
    assert _cgroup_of("self") == _v2_path(confinement.server_leaf)
    assert all(
        _cgroup_of(f"self/task/{tid}") == _v2_path(confinement.server_leaf)
        for tid in os.listdir("/proc/self/task")
    )
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert _cgroup_of(child.pid) == _v2_path(confinement.server_leaf)
    finally:
        child.kill()
        child.wait()
    assert (
        confinement.describe() == "cgroup v2 per run (no limit controllers: membership and cgroup.kill only)"
    )


@needs_v2
def test_a_group_is_populated_while_a_process_lives_in_it_and_drains_after(
    confinement: CgroupV2Confinement,
) -> None:
    jail = confinement.new_jail()
    group = Path(jail.procs_files[0]).parent
    assert not _populated(group)
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        Path(jail.procs_files[0]).write_text(str(child.pid))
        assert _cgroup_of(child.pid) == _v2_path(group) and _populated(group)
        assert not jail.wait_drained(0.05)
        assert child.stdin is not None
        child.stdin.close()
        assert child.wait() == 0
        assert jail.wait_drained(5) and not _populated(group)
    finally:
        child.kill()
        child.wait()
    jail.close()
    assert confinement.retired == 0 and confinement.new_jail() is jail


@needs_v2
def test_freezing_stops_a_group_and_thawing_resumes_it(
    confinement: CgroupV2Confinement, tmp_path: Path
) -> None:
    jail = confinement.new_jail()
    group = Path(jail.procs_files[0]).parent
    canary = tmp_path / "beats"
    counter = "import sys, time\nn = 0\nwhile True:\n    n += 1\n    open(sys.argv[1], 'w').write(str(n))\n    time.sleep(0.005)\n"
    child = subprocess.Popen([sys.executable, "-c", counter, str(canary)])
    try:
        Path(jail.procs_files[0]).write_text(str(child.pid))
        _wait_for(canary.exists)
        assert cgroup_v2.freeze(CgroupFs(), group, True)
        assert "frozen 1" in (group / "cgroup.events").read_text()
        frozen_at = canary.read_text()
        time.sleep(0.3)
        assert canary.read_text() == frozen_at
        assert cgroup_v2.freeze(CgroupFs(), group, False)
        _wait_for(lambda: canary.read_text() != frozen_at)
    finally:
        jail.close()  # kills it
        child.wait()
    assert child.returncode == -9


#: In a PID namespace of its own, PID 1 stays outside the run's group and reaps; the "run" joins the
#: group and starts a ``setsid`` child, a double-forked daemon (orphaned to PID 1, outside the group)
#: and a fork storm. Each writes its own heartbeat file while it lives.
_TREE = textwrap.dedent(
    """
    import os, signal, sys, time
    procs, canary = sys.argv[1], sys.argv[2]

    def beat(name):
        path = os.path.join(canary, name)
        while True:
            with open(path, "w") as f:
                f.write(repr(time.monotonic()))
            time.sleep(0.01)

    if os.fork() == 0:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
        if os.fork() == 0:
            os.setsid()
            beat("setsid")
        if os.fork() == 0:
            if os.fork() == 0:
                os.setsid()
                beat("daemon")
            os._exit(0)
        if os.fork() == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)
            while True:
                if os.fork() == 0:
                    time.sleep(0.01)
                    os._exit(0)
                time.sleep(0.001)
        beat("run")
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.05)
    """
)


def _start_tree(procs_file: str, canary: Path) -> subprocess.Popen[bytes]:
    assert UNSHARE is not None
    return subprocess.Popen(
        [UNSHARE, "--pid", "--fork", "--kill-child", sys.executable, "-c", _TREE, procs_file, str(canary)]
    )


@needs_v2
@needs_unshare
@pytest.mark.parametrize("use_kill", [True, False], ids=["cgroup.kill", "freeze-and-kill"])
def test_a_whole_tree_is_killed_daemons_and_setsid_children_included(
    confinement: CgroupV2Confinement, tmp_path: Path, use_kill: bool
) -> None:
    """Both ways of ending a run (``cgroup.kill``; before Linux 5.14, freeze, SIGKILL each pid,
    thaw) take every process of the group, and none outside it: the namespace's PID 1 lives on."""
    if not use_kill:
        confinement.use_kill = False
    elif not confinement.use_kill:
        pytest.skip("this kernel has no cgroup.kill (Linux < 5.14)")
    jail = confinement.new_jail()
    group = Path(jail.procs_files[0]).parent
    canary = tmp_path / "beats"
    canary.mkdir()
    outer = _start_tree(jail.procs_files[0], canary)
    try:
        _wait_for(lambda: {p.name for p in canary.iterdir()} == {"run", "setsid", "daemon"})
        assert len((group / "cgroup.procs").read_text().split()) >= 4  # run, setsid, daemon, storm
        jail.kill_all()
        assert not _populated(group)
        assert (group / "cgroup.procs").read_text() == ""
        beats = {p.name: p.read_text() for p in canary.iterdir()}
        time.sleep(0.2)
        assert {p.name: p.read_text() for p in canary.iterdir()} == beats
        assert outer.poll() is None, "the namespace's PID 1, outside the group, still lives"
        assert "frozen 0" in (group / "cgroup.events").read_text()
    finally:
        outer.kill()  # --kill-child: the namespace's PID 1, and with it the namespace, dies
        outer.wait()
    _wait_alone_in_leaf(confinement)
    jail.close()
    assert confinement.retired == 0


@pytest.fixture
def controller_home() -> Iterator[tuple[Path, str]]:
    """A cgroup of this test's own under the v2 root, which offers it one controller (``hugetlb``
    where it is the only one, as here): enabled in the root's subtree_control for the test if it
    was not, and disabled again after."""
    mount = cgroup_v2.cgroup2_mount()
    assert mount is not None
    root = mount[0]
    offered = (root / "cgroup.controllers").read_text().split()
    if not offered:
        pytest.skip("the cgroup v2 root offers no controller at all")
    controller = "hugetlb" if "hugetlb" in offered else offered[0]
    enabled_here = controller not in (root / "cgroup.subtree_control").read_text().split()
    if enabled_here:
        (root / "cgroup.subtree_control").write_text(f"+{controller}")
    home = root / f"cgv2-test-{secrets.token_hex(4)}"
    home.mkdir()
    before = _cgroup_of("self")
    try:
        yield home, controller
    finally:
        (root / before.lstrip("/") / "cgroup.procs").write_text(str(os.getpid()))
        for group in sorted(home.rglob("*"), key=lambda p: -len(p.parts)):
            if group.is_dir():
                group.rmdir()
        home.rmdir()
        if enabled_here:
            try:
                (root / "cgroup.subtree_control").write_text(f"-{controller}")
            except OSError:
                pass  # another cgroup enabled it below meanwhile: it stays


@needs_v2
def test_the_leaf_rule_a_cgroup_holding_a_process_enables_no_controller(
    controller_home: tuple[Path, str],
) -> None:
    home, controller = controller_home
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (home / "cgroup.procs").write_text(str(sleeper.pid))
        with pytest.raises(OSError) as busy:
            enable_controllers(CgroupFs(), home, [controller])
        assert busy.value.errno == errno.EBUSY
        leaf = home / "leaf"
        leaf.mkdir()
        (leaf / "cgroup.procs").write_text(str(sleeper.pid))
        enable_controllers(CgroupFs(), home, [controller])  # empty now
        assert controller in (home / "cgroup.subtree_control").read_text().split()
        assert controller in (leaf / "cgroup.controllers").read_text().split()
        with pytest.raises(OSError) as joining:
            CgroupFs().write(home / "cgroup.procs", str(sleeper.pid))
        assert joining.value.errno == errno.EBUSY
    finally:
        sleeper.kill()
        sleeper.wait()


@needs_v2
def test_the_server_leaves_its_cgroup_before_enabling_controllers_there(
    controller_home: tuple[Path, str],
) -> None:
    """The confinement's own handling of the rule, on the real kernel: this process alone in
    ``home`` moves into its leaf, then enables the controller in ``home``; closing disables it
    there again and moves back, leaving ``home`` as it was (a systemd unit with ``Delegate=yes``).
    Where a cgroup beside keeps the controller enabled (another server's subtree), v2 refuses
    both: the process stays in its leaf, unlocked, and the next server's reclaim removes the
    subtree once it is empty."""
    home, controller = controller_home
    (home / "cgroup.procs").write_text(str(os.getpid()))
    box = CgroupV2Confinement(64, 256, controllers=(controller,), home=home, came_from=home)
    assert _cgroup_of("self") == _v2_path(box.server_leaf)
    for group in (home, box.subtree, box.runs):
        assert controller in (group / "cgroup.subtree_control").read_text().split()
    jail = box.new_jail()
    assert controller in (Path(jail.procs_files[0]).parent / "cgroup.controllers").read_text().split()
    jail.close()
    box.close()
    assert _cgroup_of("self") == _v2_path(home)
    assert (home / "cgroup.subtree_control").read_text().split() == []
    assert [p for p in home.iterdir() if p.is_dir()] == []

    box = CgroupV2Confinement(64, 256, controllers=(controller,), home=home, came_from=home)
    beside = home / "beside"
    beside.mkdir()
    (beside / "cgroup.subtree_control").write_text(f"+{controller}")
    box.close()
    assert _cgroup_of("self") == _v2_path(box.server_leaf)
    beside.rmdir()
    assert reclaim_dead_subtrees(CgroupFs(), home) == []  # busy: this process is in it
    mount = cgroup_v2.cgroup2_mount()
    assert mount is not None
    (mount[0] / "cgroup.procs").write_text(str(os.getpid()))
    assert reclaim_dead_subtrees(CgroupFs(), home) == [box.subtree]


@needs_v2
def test_a_server_sharing_its_cgroup_is_refused_and_moved_back(controller_home: tuple[Path, str]) -> None:
    home, controller = controller_home
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (home / "cgroup.procs").write_text(str(sleeper.pid))
        (home / "cgroup.procs").write_text(str(os.getpid()))
        with pytest.raises(OSError) as refused:
            CgroupV2Confinement(64, 256, controllers=(controller,), home=home, came_from=home)
        assert refused.value.errno == errno.EBUSY and "holds other processes" in str(refused.value)
        assert _cgroup_of("self") == _v2_path(home) == _cgroup_of(sleeper.pid)
        assert [p for p in home.iterdir() if p.is_dir()] == []
        assert (home / "cgroup.subtree_control").read_text().split() == []
    finally:
        sleeper.kill()
        sleeper.wait()


#: A server that dies without cleaning up (SIGKILL), leaving a run's group with what the run left
#: running in it, and a process of its own in its leaf (each a ``sleep``, orphaned to the
#: namespace's PID 1).
_DEAD_SERVER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    if os.fork() == 0:
        from mocksandbox.execution.cgroup_v2 import CgroupV2Confinement
        box = CgroupV2Confinement(64, 256, controllers=())
        jail = box.new_jail()
        run = subprocess.Popen(["sleep", "600"])
        with open(jail.procs_files[0], "w") as procs:
            procs.write(str(run.pid))
        left = subprocess.Popen(["sleep", "600"])
        print(box.subtree, left.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.05)
    """
)


@needs_v2
@needs_unshare
@pytest.mark.parametrize("kill", ["cgroup.kill", "freeze and kill"])
def test_a_dead_servers_subtree_is_reclaimed_its_runs_killed_and_nothing_moved(
    confinement: CgroupV2Confinement, kill: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a dead server's run left running is killed (with ``cgroup.kill``, or frozen and
    killed where the kernel has none) and its groups go; its leaf's process is neither killed nor
    moved, and the leaf goes once it is empty."""
    if kill != "cgroup.kill":
        monkeypatch.setattr(
            cgroup_v2, "_end_dead_runs", functools.partial(cgroup_v2._end_dead_runs, use_kill=False)
        )
    assert UNSHARE is not None
    env = {**os.environ, "PYTHONPATH": str(Path(mocksandbox.__file__).parent.parent)}
    outer = subprocess.Popen(
        [UNSHARE, "--pid", "--fork", "--kill-child", sys.executable, "-c", _DEAD_SERVER],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert outer.stdout is not None
        subtree_text, _ = outer.stdout.readline().decode().split()
        dead = Path(subtree_text)
        assert dead.parent == confinement.home and list(dead.glob("runs/run-*"))
        server_leaf = dead / "server"
        _wait_for(lambda: len((server_leaf / "cgroup.procs").read_text().split()) == 1)  # the sleep
        left_behind = (server_leaf / "cgroup.procs").read_text()
        run_procs = next(dead.glob("runs/run-*")) / "cgroup.procs"
        assert len(run_procs.read_text().split()) == 1  # what its run left running
        # Its runs are killed and go; its leaf, still holding a process, stays, and the process is
        # not moved.
        assert reclaim_dead_subtrees(CgroupFs(), confinement.home) == []
        assert not (dead / "runs").exists()
        assert (server_leaf / "cgroup.procs").read_text() == left_behind
        assert confinement.subtree.exists()  # alive (locked): never touched
    finally:
        outer.kill()
        outer.wait()
    _wait_for(lambda: not _populated(server_leaf))
    _wait_alone_in_leaf(confinement)
    # The next server to start removes it.
    second = CgroupV2Confinement(64, 256, controllers=())
    try:
        assert not dead.exists()
        assert confinement.subtree.exists()
    finally:
        second.close()


def _join_as(uid: int, procs_file: str) -> tuple[int, str]:
    """A child of this process (so in the server's leaf, as a relay's program is) that becomes
    ``uid`` and writes its own pid into ``procs_file``: ``(0 or the errno, its v2 cgroup)``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            try:
                fd = os.open(procs_file, os.O_WRONLY)
                try:
                    os.write(fd, str(os.getpid()).encode())
                finally:
                    os.close(fd)
                code = 0
            except OSError as exc:
                code = exc.errno or 1
            os.write(write_end, _cgroup_of("self").encode())
            os._exit(code)
        finally:
            os._exit(99)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        where = reader.read().decode()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), where


@needs_v2
def test_an_unprivileged_uid_joins_its_group_once_delegated(confinement: CgroupV2Confinement) -> None:
    """v2 asks for write access to the destination's cgroup.procs and to the common ancestor's
    (the subtree's: the relays sit in the server leaf beside ``runs``): both are handed to the
    runs' uid, and neither alone is enough."""
    nobody = 65534
    jail = confinement.new_jail()
    assert _join_as(nobody, jail.procs_files[0])[0] == errno.EACCES  # not delegated: refused
    jail.close()
    confinement.delegate_runs_to(nobody, nobody)
    jail = confinement.new_jail()
    group = Path(jail.procs_files[0]).parent
    assert _join_as(nobody, jail.procs_files[0]) == (0, _v2_path(group))
    # Never into the server's leaf, whose cgroup.procs stays the server's.
    assert _join_as(nobody, str(confinement.server_leaf / "cgroup.procs"))[0] == errno.EACCES
    # Its own group's file alone is not enough: the common ancestor's is needed too.
    ancestor = confinement.subtree / "cgroup.procs"
    os.chown(ancestor, 0, 0)
    try:
        assert _join_as(nobody, jail.procs_files[0])[0] == errno.EACCES
    finally:
        os.chown(ancestor, nobody, nobody)
    jail.close()
    confinement.delegate_runs_to(None, None)
    assert stat.S_IMODE(ancestor.stat().st_mode) == 0o644 and ancestor.stat().st_uid == os.geteuid()


@needs_v2
@needs_unshare
def test_root_of_a_user_namespace_mapped_to_an_unprivileged_uid_joins_once_delegated(
    confinement: CgroupV2Confinement,
) -> None:
    """As a relay's program is: root in a user namespace of its own, uid 65534 on the host."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("needs util-linux setpriv")
    assert UNSHARE is not None
    confinement.delegate_runs_to(65534, 65534)
    jail = confinement.new_jail()
    script = f"echo $$ > {jail.procs_files[0]} && id -u && grep ^0:: /proc/self/cgroup"
    joined = subprocess.run(
        [
            setpriv,
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            UNSHARE,
            "--user",
            "--map-root-user",
            "sh",
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if joined.returncode != 0 and "unshare failed" in joined.stderr:
        pytest.skip(f"unprivileged user namespaces are not allowed here: {joined.stderr.strip()}")
    assert joined.returncode == 0, joined.stderr
    assert joined.stdout.split() == ["0", f"0::{_v2_path(Path(jail.procs_files[0]).parent)}"]
    jail.close()
    confinement.delegate_runs_to(None, None)


#: A run that prints its uid and v2 cgroup, and leaves a ``setsid`` child behind.
_REPORTS_AND_LEAVES = (
    "import os, time\n"
    "print(os.getuid())\n"
    "print([line for line in open('/proc/self/cgroup').read().splitlines() if line.startswith('0::')][0])\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    time.sleep(60)\n"
)


@needs_v2
@pytest.mark.parametrize("run_as", ["user", "root"])
def test_the_real_engine_runs_each_program_in_its_v2_group(
    monkeypatch: pytest.MonkeyPatch, run_as: str
) -> None:
    """The launcher's relays (in the server's leaf) fork each program, which joins its run's group
    itself: as the host's root, and as an unprivileged uid (root of a user namespace of its own),
    through the delegation above. What it leaves behind is killed before the answer."""
    if (reason := lite_unavailable_reason("cgroup")) is not None:
        pytest.skip(reason)
    made: list[CgroupV2Confinement] = []

    def v2_confinement(
        mode: str,
        max_processes: int,
        max_memory_mb: int,
        budget: ProcessBudget | None = None,
        memory_budget: MemoryBudget | None = None,
    ) -> CgroupV2Confinement:
        made.append(CgroupV2Confinement(max_processes, max_memory_mb, budget, memory_budget, controllers=()))
        return made[-1]

    monkeypatch.setattr(engine_module, "create_confinement", v2_confinement)
    # The system's temp dir (pytest's own is the server user's alone: a run's uid could not mount it).
    settings = load_settings(overrides={"isolation": "lite", "run_as": run_as})
    box = MockSandbox.create(settings)
    try:
        (confinement,) = made
        assert box.engine.confinement_name.startswith("cgroup v2 per run")
        answer = box.engine.run_code(RunCodeRequest(code=_REPORTS_AND_LEAVES, language="python"))
        assert answer.status == RunStatus.Success, answer
        assert answer.run_result is not None
        uid, cgroup = answer.run_result.stdout.split()
        assert uid == "0"  # root in its world either way
        assert cgroup.startswith(f"0::{_v2_path(confinement.runs)}/run-")
        group = confinement.runs / cgroup.rsplit("/", 1)[1]
        assert (group / "cgroup.procs").read_text() == "" and not _populated(group)
        owner = (confinement.subtree / "cgroup.procs").stat().st_uid
        assert (owner == box.engine.isolation.run_uid) if run_as == "user" else owner == 0
    finally:
        box.close()
    assert not confinement.subtree.exists()


# -- choosing a confinement ----------------------------------------------------------------------


def test_auto_never_takes_v2_without_the_pids_and_memory_controllers(monkeypatch: pytest.MonkeyPatch) -> None:
    """With v1 out of the way: v2 where this host's v2 gives pids and memory, else process groups
    saying why; ``cgroup-v2`` and ``cgroup`` then refuse, naming both versions."""
    monkeypatch.setattr(CgroupConfinement, "available", classmethod(lambda cls: False))
    why_not_v2 = cgroup_v2.unavailable_reason()
    chosen = create_confinement("auto", 64, 256)
    try:
        if why_not_v2 is not None:
            assert isinstance(chosen, ProcessGroupConfinement)
            assert f"cgroup v2: {why_not_v2}" in chosen.describe()
            assert "cgroup v1: pids/memory/freezer controllers are not writable here" in chosen.describe()
            for mode in ("cgroup", "cgroup-v2"):
                with pytest.raises(OSError) as refused:
                    create_confinement(mode, 64, 256)
                assert why_not_v2 in str(refused.value)
        elif isinstance(chosen, CgroupV2Confinement):
            assert chosen.controllers == ("pids", "memory")
        else:  # offered, but this process shares its cgroup (e.g. with pytest-xdist's workers)
            assert isinstance(chosen, ProcessGroupConfinement)
            assert "cgroup v2: " in chosen.describe() and "holds other processes" in chosen.describe()
    finally:
        chosen.close()
    assert (
        create_confinement("process-group", 64, 256)
        .describe()
        .startswith("process group per run, no cgroups")
    )


@needs_v2
def test_this_hosts_v2_is_offered_only_with_pids_and_memory() -> None:
    assert _OWN is not None
    offered = (home_of(_OWN) / "cgroup.controllers").read_text().split()
    has_both = {"pids", "memory"} <= set(offered)
    assert CgroupV2Confinement.available() == has_both
    if not has_both:
        with pytest.raises(OSError) as refused:
            CgroupV2Confinement(64, 256)
        assert refused.value.errno == errno.EOPNOTSUPP


def test_the_engines_cgroup_cases_take_v2_where_v1_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a pure cgroup v2 host (the tests/vm guest) the engine's ``cgroup`` cases run under v2,
    as ``create_confinement`` would choose it, instead of skipping for want of v1; they skip only
    where neither can be had, with why v2 cannot. (tests/engine/conftest.py, loaded by path: a
    plain ``import conftest`` gets whichever directory's conftest was loaded last.)"""
    spec = importlib.util.spec_from_file_location("engine_conftest", Path(__file__).with_name("conftest.py"))
    assert spec is not None and spec.loader is not None
    engine_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine_conftest)
    monkeypatch.setattr(CgroupConfinement, "available", classmethod(lambda cls: False))
    monkeypatch.setattr(cgroup_v2, "unavailable_reason", lambda *args, **kwargs: None)
    assert engine_conftest.cgroup_unavailable_reason() is None
    why = "the cgroup v2 /sys/fs/cgroup/x is given no pids or memory controller"
    monkeypatch.setattr(cgroup_v2, "unavailable_reason", lambda *args, **kwargs: why)
    reason = engine_conftest.cgroup_unavailable_reason()
    assert reason is not None and "cgroup v1 controllers are not writable" in reason and reason.endswith(why)


def test_v1_stays_first_where_it_is_writable() -> None:
    if not any(Path("/sys/fs/cgroup", c).is_dir() for c in ("pids", "memory", "freezer")):
        pytest.skip("a cgroup v1 test on a host without cgroup v1 (pure cgroup v2)")
    if not CgroupConfinement.available():
        pytest.skip("cgroup v1 pids/memory/freezer controllers are not writable here")
    chosen = create_confinement("cgroup", 64, 256)
    try:
        assert isinstance(chosen, CgroupConfinement)
    finally:
        chosen.close()


@needs_v2
def test_a_server_starting_beside_another_never_takes_its_new_subtree_for_a_dead_servers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another server reclaims dead subtrees between our subtree's mkdir and its lock: it must
    wait for the lock rather than remove the subtree (and fail our start)."""
    lock_parent = cgroup_v2._lock_parent
    others: list[subprocess.Popen[bytes]] = []
    judge = "import sys; from pathlib import Path; from mocksandbox.execution import cgroup_v2 as c; "
    judge += "c.reclaim_dead_subtrees(c.CgroupFs(), Path(sys.argv[1]))"
    env = {**os.environ, "PYTHONPATH": str(Path(mocksandbox.__file__).parent.parent)}

    def lock_while_another_server_starts(subtree: Path) -> int:
        if not others:
            others.append(subprocess.Popen([sys.executable, "-c", judge, str(subtree.parent)], env=env))
            deadline = time.monotonic() + 3  # (an empty subtree goes in milliseconds)
            while others[0].poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
        return lock_parent(subtree)

    monkeypatch.setattr(cgroup_v2, "_lock_parent", lock_while_another_server_starts)
    before = _cgroup_of("self")
    box = CgroupV2Confinement(64, 256, controllers=())
    try:
        assert others and box.subtree.is_dir()
        assert others[0].wait(timeout=60) == 0  # it looked once we held our lock, and left ours alone
        assert box.subtree.is_dir()
    finally:
        box.close()
        for other in others:
            other.kill()
            other.wait()
    assert _cgroup_of("self") == before
