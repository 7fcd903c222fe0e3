"""``mocksandbox serve`` as a user starts it, for the server tests: a real process, optionally placed
in a cgroup before it starts (as a container or a CI job would place it), and stopped with Ctrl-C.

A plain module beside the tests (pytest puts this directory on ``sys.path``), so that the tests
and fixtures that start servers share one way of doing it.
"""

from __future__ import annotations

import itertools
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from mocksandbox.execution.confinement import CgroupConfinement, own_cgroup_dir
from mocksandbox.execution.world import holds_no_layers

NO_PROXY = {"http": "", "https": ""}


@dataclass
class ServeProcess:
    """A running ``mocksandbox serve``: its URL, its process, the banner it printed, the cgroup it
    was started in and the dir of its runs' temp dirs (if given)."""

    url: str
    process: subprocess.Popen[str]
    banner: list[str]
    cgroup: Path | None = None
    runs_dir: Path | None = None

    def run(self, code: str, language: str = "python", **fields: object) -> dict[str, object]:
        """POST /run_code; the answer's JSON (it must be a 200)."""
        response = requests.post(
            f"{self.url}/run_code",
            json={"code": code, "language": language, **fields},
            timeout=60,
            proxies=NO_PROXY,
        )
        assert response.status_code == 200, response.text
        answer: dict[str, object] = response.json()
        return answer

    def runs_left(self) -> list[Path]:
        """What the runs left in :attr:`runs_dir` beyond the empty dirs (mode 0700) that the server
        keeps for its next runs (see ``mocksandbox.execution.workdirs``): it should be nothing."""
        assert self.runs_dir is not None, "the server was not given a runs dir"
        # (A relay let go at a run's deadline drops its kept root a moment after the answer.)
        deadline = time.monotonic() + 15
        while (
            left := [p for p in self.runs_dir.iterdir() if not _kept_empty(p)]
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left

    def runs_parent(self, cgroup: Path | None = None) -> Path:
        """The cgroup holding every run's cgroup (``mocksandbox-<server pid>-<n>``) under ``cgroup``
        (the one the server was started in, by default)."""
        home = cgroup or self.cgroup
        assert home is not None, "the server was not started in a cgroup"
        (parent,) = home.glob(f"mocksandbox-{self.process.pid}-*")
        return parent


#: The hosts a server may find itself on, as this machine can make them for a test (issue 34):
#: ``root`` (root with this machine's cgroups), ``root-without-cgroups`` (root, no cgroup writable:
#: what a cgroup v2 host without delegation gives), ``ordinary-user`` (``nobody``, with unprivileged
#: user namespaces), ``pid-namespace-child`` (root, pid 3 of a PID namespace, as in a container
#: under tini or ``sh -c``), ``root-without-idmap`` (root on a kernel whose tmpfs refuses idmapped
#: mounts, before 6.3: Debian 12, Ubuntu 22.04, RHEL 9; made so by ``idmapped_mounts: off``). Each
#: runs in a PID namespace of its own. ``ordinary-user`` runs as on a kernel whose tmpfs refuses
#: user extended attributes (before 6.6: its relays keep their masks on the runs' dir, made so by
#: ``tmpfs_user_xattrs: off``): the way a server that is not root takes there, which only this
#: shape takes; the tmpfs's way, relays in a user namespace take in the ``root`` shape.
HOST_SHAPES = ("root", "root-without-cgroups", "ordinary-user", "pid-namespace-child", "root-without-idmap")
#: The uid an ``ordinary-user`` server runs as.
ORDINARY_UID = 65534


def stdout_of(answer: dict[str, object]) -> str:
    """A /run_code answer's stdout (it must have a run result)."""
    result = answer["run_result"]
    assert isinstance(result, dict), answer
    return str(result["stdout"])


def run_uid_of(server: ServeProcess) -> int:
    """The host uid the banner says runs are."""
    match = re.search(r"runs are uid (\d+) on the host", "".join(server.banner))
    assert match is not None, "".join(server.banner)
    return int(match.group(1))


def a_runs_ids_on_the_host(server: ServeProcess) -> tuple[Any, Any]:
    """``(uids, gids)`` of a run's process as the kernel has them, read from this side (psutil):
    a run that sleeps under a marker name is found here, read, and killed."""
    marker = f"mocksandbox-uid-probe-{uuid.uuid4().hex}"
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(server.run, f"exec -a {marker} sleep 30", language="bash", run_timeout=40)
        deadline = time.monotonic() + 20
        found: list[psutil.Process] = []
        while not found and time.monotonic() < deadline:
            found = [
                p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])
            ]
            time.sleep(0.05)
        assert found, "the run's process was not seen from the host"
        ids = found[0].uids(), found[0].gids()
        found[0].kill()
        answer.result(timeout=30)
    return ids


#: What a run prints of its /tmp and /run: the entries of each that are not its own (its dir's
#: top, and the dirs of the Python it runs on where they live under /tmp, as in a clone there),
#: whether the host's canaries and what earlier runs left are in its view, and its own dir's path.
LOOK_AROUND = """\
import os, sys
ours = {{p.split('/')[2] for p in (os.getcwd(), sys.prefix, sys.base_prefix, os.path.realpath(sys.executable))
        if p.startswith('/tmp/')}}
print(sorted(set(os.listdir('/tmp')) - ours), os.listdir('/run'))
print([os.path.lexists(p) for p in {seen!r}])
print(os.listdir(os.path.dirname(os.getcwd())) == [os.path.basename(os.getcwd())])
print(os.getcwd())
"""


def assert_runs_start_apart(server: ServeProcess) -> None:
    """The host's files in /tmp and /run (readable by anyone) are not in a run's view, nor anything
    of an earlier run: a file it left in /tmp, its dir (which it gave a mode, an extended attribute
    and files), whether its root was kept for the next runs or not. /tmp holds the run's own dir
    and the dirs of the Python it runs on (when they live under /tmp, as in a clone there), /run
    nothing; the dir holding the run's dir holds nothing else."""
    canaries = [Path(tempfile.mkdtemp(prefix="host-canary-", dir=top)) for top in ("/tmp", "/run")]
    try:
        for canary in canaries:
            canary.chmod(0o755)
            (canary / "secret.txt").write_text("host\n")
            (canary / "secret.txt").chmod(0o644)
        secrets = [str(c / "secret.txt") for c in canaries]
        first = stdout_of(server.run(LOOK_AROUND.format(seen=secrets))).splitlines()
        assert first[:3] == ["[] []", "[False, False]", "True"], first
        # A run that marks its dir (in a root kept for later runs: it touches nothing else) ...
        mark = (
            "import os\n"
            "os.chmod('.', 0o751)\n"
            "try:\n"
            "    os.setxattr('.', 'user.mark', b'earlier')\n"
            "except OSError:\n"
            "    pass  # (a file system without user xattrs: tmpfs before Linux 6.6)\n"
            "os.mkdir('sub')\n"
            "open('sub/left.txt', 'w').write('x')\n"
            "open('left.txt', 'w').write('x')\n"
            "print(os.getcwd())\n"
        )
        marked = stdout_of(server.run(mark)).strip()
        # ... and one that leaves a file in /tmp (its root goes).
        assert stdout_of(server.run("open('/tmp/left-by-a-run', 'w').write('x')\nprint('ok')")) == "ok\n"
        seen = [*secrets, marked, f"{marked}/left.txt", "/tmp/left-by-a-run"]
        for _ in range(3):  # (later runs, in a kept root or a fresh one, whichever their relay has)
            later = stdout_of(server.run(LOOK_AROUND.format(seen=seen))).splitlines()
            assert later[:3] == ["[] []", f"{[False] * len(seen)}", "True"], (marked, later)
            assert later[3] != marked
    finally:
        for canary in canaries:
            shutil.rmtree(canary, ignore_errors=True)


def shape_command(shape: str, command: list[str], home: Path | None = None) -> list[str]:
    """``command`` started as a server on a host of ``shape`` (see :data:`HOST_SHAPES`), always
    as PID 1 or 3 of a PID namespace of its own, so that nothing it does reaches this machine's
    other processes, and with a mount namespace of its own where the shape needs one; with its
    :data:`NEIGHBOUR` beside it."""
    if shutil.which("unshare") is None or shutil.which("setpriv") is None:
        pytest.skip("unshare(1) and setpriv(1) (util-linux) are needed for a host-shape server")
    # Beside the server, as its user: the neighbour (see NEIGHBOUR), started just before it.
    neighbour = f"{{ sleep {NEIGHBOUR} & }}"
    script = f'{neighbour} && exec "$@"'
    if shape == "root-without-cgroups":
        # The cgroup hierarchies hidden behind an empty read-only tmpfs, in this mount namespace only.
        script = f'mount -t tmpfs -o ro,mode=0555 none /sys/fs/cgroup && {neighbour} && exec "$@"'
    elif shape == "pid-namespace-child":
        script = f'sleep {NEIGHBOUR} & "$@" & wait $!'  # the server is pid 3; sh stays PID 1
    elif shape == "root-without-idmap":
        script = f'{neighbour} && MOCKSANDBOX_IDMAPPED_MOUNTS=off exec "$@"'
    elif shape == "ordinary-user":
        assert home is not None, "an ordinary user's server needs a home of its own"
        script = _reachable_for(
            ORDINARY_UID, [Path(sys.base_prefix), Path(sys.prefix), Path(__file__).parents[2]]
        )
        setpriv = f"setpriv --reuid={ORDINARY_UID} --regid={ORDINARY_UID} --clear-groups --inh-caps=-all"
        # Its temp dir: ``/tmp/<home's name>`` where the test made one (a home outside /tmp, which
        # runs see), else the home.
        tmp_dir = Path("/tmp") / home.name
        tmp_dir = tmp_dir if tmp_dir.is_dir() else home
        # (Where the kernel's tmpfs refuses them, as it would: auto's own way there.)
        xattrs = "MOCKSANDBOX_TMPFS_USER_XATTRS=off " if tmpfs_takes_user_xattrs() else ""
        script += f" && {{ {setpriv} sleep {NEIGHBOUR} & }}"
        script += f' && exec {setpriv} env HOME={home} TMPDIR={tmp_dir} {xattrs}"$@"'
    elif shape != "root":
        raise ValueError(f"no such host shape: {shape}")
    unshare = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--mount"]
    return [*unshare, "/bin/sh", "-c", script, "sh", *command]


#: How long the neighbour sleeps, which names it in a process list: a process of the server's user
#: in the server's PID namespace, started beside it, that runs must neither see nor signal. (The
#: server itself cannot prove that where it is the namespace's PID 1: the kernel drops a SIGKILL
#: sent to PID 1 from inside its namespace, and a run would see only a handful of processes there
#: even with no world of its own.)
NEIGHBOUR = "86399.25"


def neighbour_of(server: subprocess.Popen[str]) -> psutil.Process:
    """The neighbour started beside ``server`` (a process of :func:`shape_command`'s)."""
    found = [
        child
        for child in psutil.Process(server.pid).children(recursive=True)
        if child.cmdline() == ["sleep", NEIGHBOUR]
    ]
    assert len(found) == 1, found
    return found[0]


def is_alive(process: psutil.Process) -> bool:
    """Whether ``process`` runs still (a zombie has ended)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def tmpfs_takes_user_xattrs() -> bool:
    """Whether this kernel's tmpfs takes ``user.*`` extended attributes (Linux 6.6 and later)."""
    version = tuple(int(part) for part in re.findall(r"\d+", platform.release())[:2])
    return version >= (6, 6)


def _reachable_for(uid: int, targets: list[Path]) -> str:
    """Shell lines that make each of ``targets`` reachable to ``uid`` in this mount namespace only:
    a dir on the way that it may not search (root's 0700 home, where pyenv keeps Python) is covered
    by a tmpfs holding only the way on, bound from the original."""
    blocked: dict[Path, set[str]] = {}
    for target in targets:
        target = target.resolve()
        chain = [*reversed(target.parents), target]
        for parent, child in itertools.pairwise(chain):
            if not os.stat(parent).st_mode & 0o001 and os.stat(parent).st_uid != uid:
                blocked.setdefault(parent, set()).add(child.name)
                break
    lines = ["true"]
    for index, (parent, children) in enumerate(blocked.items()):
        # A name of its own: "$$" is 1 in every shape's PID namespace, and these dirs are made in
        # the host's /tmp, which servers started at once (xdist workers) share.
        lines.append(f"stage{index}=$(mktemp -d /tmp/.mocksandbox-stage-XXXXXXXX)")
        stage = f"$stage{index}"
        lines.append(f"mount --bind {parent} {stage}")
        lines.append(f"mount -t tmpfs -o mode=0755 none {parent}")
        for child in sorted(children):
            lines += [f"mkdir -p {parent}/{child}", f"mount --rbind {stage}/{child} {parent}/{child}"]
        lines += [f"umount -l {stage}", f"rmdir {stage}"]
    return " && ".join(lines)


def start_serve(
    *args: str,
    cgroup: Path | None = None,
    runs_dir: Path | None = None,
    pid_namespace: bool = False,
    shape: str | None = None,
    home: Path | None = None,
    verbose: bool = True,
) -> ServeProcess:
    """``mocksandbox serve --port 0 ARGS``, ready (its banner read up to "press Ctrl-C"), in
    ``cgroup`` and with its runs' temp dirs in ``runs_dir`` if given. ``verbose`` (the default
    here): ``serve --verbose``, whose banner says everything the tests read (budgets, the uid runs
    are, hidden paths); without it, the banner that fits a screen.

    With ``pid_namespace``, the server is PID 1 of a PID namespace of its own (``unshare --pid``):
    for tests of hostile programs, so that one that escaped its run could signal nothing but the
    server and its own kind, never this machine's other processes. Stop it with :func:`stop_serve`
    (the signal goes to the whole session, the server included). ``shape``: a server on a host of
    that shape (:func:`shape_command`), ``home`` its user's home."""
    verbosity = ["--verbose"] if verbose else []
    command = [sys.executable, "-m", "mocksandbox.cli", "serve", "--port", "0", *verbosity, *args]
    if shape is not None:
        command = shape_command(shape, command, home)
        pid_namespace = True
    elif pid_namespace:
        if shutil.which("unshare") is None:
            pytest.skip("unshare(1) is not installed: no PID namespace for a hostile-program server")
        command = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *command]
    if cgroup is not None:
        # The shell moves itself into the cgroup, then becomes the server: everything it starts
        # (launcher, relays, runs) is charged there from the first instruction.
        command = ["/bin/sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *command]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=pid_namespace,
        env={
            **os.environ,
            "NO_PROXY": "127.0.0.1",
            **({"MOCKSANDBOX_TMP_ROOT": str(runs_dir)} if runs_dir is not None else {}),
        },
    )
    assert process.stdout is not None
    banner: list[str] = []
    while not banner or not banner[-1].startswith("  press Ctrl-C"):
        line = process.stdout.readline()
        if not line:
            stop_serve(process)
            pytest.fail("the server did not start:\n" + "".join(banner))
        banner.append(line)
    match = re.search(r"serving on (http://\S+)", banner[0])
    assert match, banner[0]
    return ServeProcess(match.group(1), process, banner, cgroup, runs_dir)


def is_server_process(process: psutil.Process) -> bool:
    """Whether ``process`` is a ``mocksandbox serve`` server itself: not a shell whose arguments
    name it (the PID-namespace child shape's PID 1, which would die of a Ctrl-C meant for the
    server and end the namespace)."""
    try:
        return process.cmdline()[1:3] == ["-m", "mocksandbox.cli"]
    except psutil.Error:
        return False


def stop_serve(process: subprocess.Popen[str], timeout: float = 60) -> None:
    """Ctrl-C, as a user stops it; killed if it does not stop within ``timeout``."""
    if process.poll() is None:
        if process.args[0] == "unshare":  # type: ignore[index]
            # Ctrl-C to the server alone: unshare(1) would die of it at once and, with
            # --kill-child, SIGKILL the server before it cleaned up (its runs' dir left behind).
            # The server's namespace ends when it does.
            # (Not to a shell between them either: as PID 1 of the namespace, its end is the end of
            # every process there.)
            for child in psutil.Process(process.pid).children(recursive=True):
                if is_server_process(child):
                    try:
                        child.send_signal(signal.SIGINT)
                    except psutil.Error:
                        pass
        else:
            process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def make_test_cgroup(controller: str, purpose: str, configure: Callable[[Path], None]) -> Path:
    """A new v1 cgroup under this process's own in ``controller``, set up by ``configure``; the test
    is skipped, with the reason, where one cannot be made. Remove it with :func:`kill_and_remove`."""
    if not CgroupConfinement.available():
        pytest.skip(f"cgroup v1 pids/memory/freezer controllers are not writable here: no {purpose} cgroup")
    # Not "mocksandbox-*": a server starting meanwhile (another xdist worker's) takes an unlocked
    # group of that name for a dead server's, and removes it.
    group = own_cgroup_dir(controller) / f"test-of-mocksandbox-{purpose}-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        configure(group)
    except OSError as exc:
        kill_and_remove(group)
        pytest.skip(f"cannot make a {controller} cgroup here: {exc}")
    return group


def kill_and_remove(group: Path) -> None:
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


def _kept_empty(path: Path) -> bool:
    """An empty real dir, mode 0700, that the server keeps for a later run; or the tmpfs of an
    isolation-lite server holding no request's layers (only its lock file, the relays' mount
    point and the roots relays keep from run to run, ``kept-*``), and the lock file beside it."""
    if path.name.startswith("mocksandbox-") and os.path.ismount(path):
        return holds_no_layers(path)
    if path.name.startswith("mocksandbox-") and path.suffix == ".lock":  # the lock beside that tmpfs
        return path.with_suffix("").exists() and _kept_empty(path.with_suffix(""))
    if path.is_symlink() or not path.is_dir() or path.stat().st_mode & 0o777 != 0o700:
        return False
    return next(path.iterdir(), None) is None


def stop_serve_leaving_nothing(server: ServeProcess) -> None:
    """:func:`stop_serve`, then check the server removed every dir it kept for later runs."""
    stop_serve(server.process)
    if server.runs_dir is not None:
        assert list(server.runs_dir.iterdir()) == [], "the stopped server left temp dirs behind"
