"""A relay's root kept from run to run (``_launcher_kept.KeptRoot``): reused while runs touch nothing
but their own dir, dropped as soon as one does, and never showing a later run what an earlier one
wrote, deleted or changed.

Real engines (isolation lite, both exec modes), real runs. Which root a run had is read on the
host: a kept root's upper layer is a ``kept-*`` dir of the runs' tmpfs, named at random when it is
made, so the same name before and after a run means the same root.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from mocksandbox import divergence
from mocksandbox.core import MockSandbox
from mocksandbox.execution import launcher
from mocksandbox.execution.confinement import CgroupConfinement
from mocksandbox.execution.world import RUN_DIRS, holds_no_layers, lite_unavailable_reason
from mocksandbox.models import RunCodeRequest
from mocksandbox.settings import load_settings


@pytest.fixture(scope="module")
def sandbox(lite_sandbox: MockSandbox) -> MockSandbox:
    return lite_sandbox


def run(box: MockSandbox, code: str, **fields: object) -> str:
    answer = box.engine.run_code(RunCodeRequest(code=code, language="python", **fields))  # type: ignore[arg-type]
    assert answer.run_result is not None, answer
    assert answer.run_result.return_code == 0, answer.run_result
    return answer.run_result.stdout or ""


def kept_roots(box: MockSandbox) -> list[str]:
    assert box.engine.runs_root is not None
    return sorted(p.name for p in Path(box.engine.runs_root.path).glob("kept-*"))


def test_a_root_left_untouched_is_kept(sandbox: MockSandbox) -> None:
    run(sandbox, "print(1)")
    kept = kept_roots(sandbox)
    assert len(kept) == 1
    for _ in range(5):
        # Reading the image (the dirs a change would show in too: /, /tmp and its runs' dirs,
        # /dev/shm) and writing in its own dir leaves the root as it was.
        run(
            sandbox,
            "import os\nopen('here.txt', 'w').write(str(os.listdir('/etc')))\n"
            "for d in ('/', '/tmp', '/dev/shm'):\n"
            "    os.listdir(d), os.stat(d), os.listxattr(d)\n"
            "    for e in os.scandir(d):\n"
            "        e.is_dir(), os.path.lexists(e.path)\n"
            "print(open('here.txt').read()[:1])",
        )
        assert kept_roots(sandbox) == kept


@pytest.mark.parametrize(
    "change",
    [
        "open('/tmp/left', 'w').write('x')",
        "open('/etc/left', 'w').write('x')",
        "os.remove('/etc/hostname')",
        "os.chmod('/tmp', 0o700)",
        "os.setxattr('/tmp', 'user.left', b'x')",
        "open('/dev/shm/left', 'w').write('x')",
        "os.chmod('/dev/shm', 0o700)",
        "os.setxattr('/', 'user.left', b'x')",
        "os.chmod('/', 0o700)",
        # The overlay's own names: kept apart from its own (escaped) since Linux 6.7, refused
        # before. Either way no run changes the value of one the root had: the check compares
        # names only.
        "try:\n    os.setxattr('/', 'user.overlay.impure', b'n')\nexcept OSError:\n    pass",
        "try:\n    os.setxattr('/tmp', 'user.overlay.origin', b'x')\nexcept OSError:\n    pass",
        "os.mkdir('/tmp/left')",
        "os.symlink('/etc', '/tmp/left')",
        # Times too (a change no dir's entries, mode, owner or xattrs show).
        "os.utime('/tmp', (0, 0))",
        "os.utime('/dev/shm', (0, 0))",
        "os.utime('/', (0, 0))",
    ],
)
def test_a_root_a_run_changed_goes_and_the_next_run_sees_nothing_of_it(
    sandbox: MockSandbox, change: str
) -> None:
    if "/etc/" in change and sandbox.engine.isolation.without_idmapped_mounts:
        # Without idmapped mounts the host root's files are nobody's to a run: read-only to it.
        answer = sandbox.engine.run_code(RunCodeRequest(code=f"import os\n{change}", language="python"))
        assert answer.run_result is not None and "PermissionError" in (answer.run_result.stderr or "")
        return
    look = (
        "import os\n"
        "print(os.path.lexists('/tmp/left'), os.path.exists('/etc/left'), os.path.exists('/etc/hostname'),\n"
        "      oct(os.stat('/tmp').st_mode), os.listxattr('/tmp'), os.listdir('/dev/shm'),\n"
        "      oct(os.stat('/dev/shm').st_mode), os.listxattr('/'), oct(os.stat('/').st_mode),\n"
        "      [os.stat(d).st_mtime > 1 for d in ('/tmp', '/dev/shm', '/')])\n"
    )
    assert_the_change_drops_the_root(sandbox, change, look)


def assert_the_change_drops_the_root(box: MockSandbox, change: str, look: str) -> None:
    """A run that makes ``change`` has its root dropped: the run after it has a new one, in which
    ``look`` prints what it printed before the change."""
    fresh = run(box, look)
    before = kept_roots(box)
    assert len(before) == 1
    run(box, f"import os\n{change}\nprint('changed')")
    # The relay drops that root once it has answered, before it takes its next run: the next run
    # has a new one, and sees nothing of the change.
    assert run(box, look) == fresh
    after = kept_roots(box)
    assert len(after) == 1 and after != before


@pytest.mark.parametrize(
    "change",
    [
        "open('../left', 'w').write('x')",
        "os.mkdir('../left')",
        "os.symlink('/etc', '../left')",
        "os.chmod('..', 0o700)",
        "os.setxattr('..', 'user.left', b'x')",
        "os.utime('..', (0, 0))",
        "here = os.getcwd()\nos.rename(here, os.path.join(os.path.dirname(here), 'left'))",
    ],
)
def test_a_run_that_changed_the_dir_its_dir_is_in_leaves_nothing_of_it(
    sandbox: MockSandbox, change: str
) -> None:
    """The runs' parent dir (the server's temp dir, as runs see it) is the kept root's own dir,
    into which each run's dir is moved: a run that changes it (beside its own dir, or the dir
    itself) has its root dropped, and the next run finds the dir as the first run found it."""
    look = (
        "import os\nhere = os.path.basename(os.getcwd())\n"
        "print(sorted(n for n in os.listdir('..') if n != here), oct(os.stat('..').st_mode),\n"
        "      os.listxattr('..'), os.stat('..').st_mtime > 1, os.stat('..').st_uid)\n"
    )
    assert_the_change_drops_the_root(sandbox, change, look)


def test_requests_with_files_outside_their_dir_or_fetch_files_have_roots_of_their_own(
    sandbox: MockSandbox,
) -> None:
    data = base64.b64encode(b"abs").decode()
    assert run(sandbox, "print(open('/data/in.txt').read())", files={"/data/in.txt": data}) == "abs\n"
    assert run(sandbox, "import os\nprint(os.path.exists('/data'))") == "False\n"
    answer = sandbox.engine.run_code(
        RunCodeRequest(
            code="open('/tmp/out.txt', 'w').write('o')\nopen('out.txt', 'w').write('i')",
            language="python",
            fetch_files=["/tmp/out.txt", "out.txt"],
        )
    )
    assert answer.files == {
        "/tmp/out.txt": base64.b64encode(b"o").decode(),
        "out.txt": base64.b64encode(b"i").decode(),
    }
    assert run(sandbox, "import os\nprint(os.path.exists('/tmp/out.txt'))") == "False\n"


def test_files_in_the_run_dir_come_and_go_with_each_request(sandbox: MockSandbox) -> None:
    first = base64.b64encode(b"one").decode()
    assert run(sandbox, "print(open('in.txt').read())", files={"in.txt": first}) == "one\n"
    assert (
        run(sandbox, "import os\nprint(sorted(os.listdir('.'))[:0], os.path.exists('in.txt'))")
        == "[] False\n"
    )


def run_dirs(box: MockSandbox) -> list[Path]:
    """The dirs of runs in kept roots on the runs' tmpfs (``KeptRootWorkspace``): none between
    requests (each run's relay removes its dir before it answers)."""
    assert box.engine.runs_root is not None
    return sorted((Path(box.engine.runs_root.path) / RUN_DIRS).iterdir())


def test_a_run_in_a_kept_root_has_a_dir_with_a_new_name_each_time_and_no_layers(sandbox: MockSandbox) -> None:
    look = "import os\nprint(os.getcwd(), sorted(os.listdir('.')), oct(os.stat('.').st_mode))"
    with_files = run(sandbox, look, files={"in.txt": base64.b64encode(b"x").decode()}).split()
    seen = [with_files] + [run(sandbox, look).split() for _ in range(3)]
    cwds = [words[0] for words in seen]
    view_tmp_root = sandbox.engine.settings.tmp_root or tempfile.gettempdir()
    assert len(set(cwds)) == 4 and all(os.path.dirname(c) == view_tmp_root for c in cwds)
    # Its files and its code file, in a dir of its own, mode 0700.
    assert with_files[1] == "['in.txt'," and with_files[2].startswith("'tmp") and with_files[3] == "0o40700"
    assert all(words[-1] == "0o40700" and words[1].startswith("['tmp") for words in seen[1:])
    # Each run's dir was gone by its answer; nothing else of them is left.
    assert run_dirs(sandbox) == []
    assert sandbox.engine.runs_root is not None
    assert holds_no_layers(Path(sandbox.engine.runs_root.path))


@pytest.mark.parametrize(
    "change",
    [
        "open('left', 'w').write('x')",
        "os.mkdir('left')",
        "os.makedirs('a/b/c')\nopen('a/b/c/f', 'w').write('x')\nos.chmod('a/b', 0)",
        "os.symlink('/etc', 'left')",
        "os.chmod('.', 0o755)",
        "os.setxattr('.', 'user.left', b'x')",
        "os.chown('.', 1000, 1000)",
    ],
)
def test_a_run_dir_is_gone_by_its_answer_whatever_the_run_did_in_it(
    sandbox: MockSandbox, change: str
) -> None:
    look = "import os\nprint(sorted(os.listdir('.'))[1:], oct(os.stat('.').st_mode), os.listxattr('.'), os.stat('.').st_uid)"
    fresh = run(sandbox, look)
    assert fresh == "[] 0o40700 [] 0\n"
    # What a run does in its own dir leaves its root as it was: kept.
    in_one_root(sandbox, lambda: run(sandbox, f"import os\n{change}\nprint('changed')"))
    assert run_dirs(sandbox) == []
    assert run(sandbox, look) == fresh


def in_one_root(box: MockSandbox, runs: Callable[[], Any]) -> Any:
    """What ``runs`` gave in an attempt whose runs all had one kept root. A root serves one
    second at most, which may end between two runs: a few attempts, and the root a run changed
    (dropped every time) fails them all."""
    for _ in range(5):
        before = kept_roots(box)
        given = runs()
        if len(before) == 1 and kept_roots(box) == before:
            return given
    raise AssertionError("no attempt had its runs in one kept root")


def test_a_later_run_in_the_root_finds_nothing_of_an_earlier_runs_dir(sandbox: MockSandbox) -> None:
    """An earlier run marks its dir (mode, a user xattr, a file); a later run of the same root
    finds nothing of it: not its path, not its name in its parent dir, not its mount."""

    def earlier_then_later() -> str:
        earlier = run(
            sandbox,
            "import os\nopen('secret', 'w').write('s')\nos.chmod('.', 0o751)\n"
            "os.setxattr('.', 'user.mark', b'run-1')\nprint(os.getcwd())",
        ).strip()
        probe = f"""
import os
old = {earlier!r}
name = os.path.basename(old)
with open('/proc/self/mountinfo') as table:
    mounted = [line.split()[4] for line in table]
print(os.getcwd() != old, os.path.lexists(old), name in os.listdir(os.path.dirname(old)),
      any(point == old for point in mounted),
      sorted(n for n in os.listdir(os.path.dirname(old)) if n.startswith('tmp') and n != os.path.basename(os.getcwd())))
"""
        return run(sandbox, probe)

    # (Both runs in one root, which the later one's looks left as it was.)
    assert in_one_root(sandbox, earlier_then_later) == "True False False False []\n"


def test_no_run_counts_the_runs_before_it(sandbox: MockSandbox) -> None:
    """Runs of one root, one after the other: each finds no other run's dir beside its own, and
    no mount of a run's dir in the mount table (its own is a plain dir of its root's)."""
    look = (
        "import os\nhere = os.path.basename(os.getcwd())\n"
        "others = [n for n in os.listdir('..') if n.startswith('tmp') and n != here]\n"
        "with open('/proc/self/mountinfo') as table:\n"
        "    runs = [l.split()[4] for l in table if os.path.basename(l.split()[4]).startswith('tmp')]\n"
        "print(len(others), len(runs))"
    )
    seen = in_one_root(sandbox, lambda: [run(sandbox, look) for _ in range(8)])
    assert seen == ["0 0\n"] * 8


def test_a_root_kept_no_longer_than_the_setting_says(tmp_path: Path) -> None:
    """``kept_root_max_age_s: 0``: every run gets a root made for it (a kept root serves no run past
    its age), though each run leaves its root as it found it."""
    if (reason := lite_unavailable_reason()) is not None:
        pytest.skip(reason)
    overrides = {"tmp_root": str(tmp_path), "isolation": "lite", "kept_root_max_age_s": 0}
    box = MockSandbox.create(load_settings(overrides=overrides))
    try:
        seen = []
        for _ in range(3):
            run(box, "print(1)")
            seen.append(kept_roots(box))
    finally:
        box.close()
    assert all(len(roots) == 1 for roots in seen), seen
    assert len({roots[0] for roots in seen}) == 3, seen


def test_a_kept_root_goes_with_its_server(tmp_path: Path) -> None:
    if (reason := lite_unavailable_reason()) is not None:
        pytest.skip(reason)
    box = MockSandbox.create(load_settings(overrides={"tmp_root": str(tmp_path), "isolation": "lite"}))
    try:
        run(box, "print(1)")
        assert kept_roots(box)
    finally:
        box.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "confinement", ["process-group", "cgroup", *(["process-group-noidmap"] if os.geteuid() == 0 else [])]
)
def test_a_timed_out_run_leaves_nothing_of_what_it_wrote_outside_its_dir(
    confinement: str, tmp_path: Path
) -> None:
    """Where no cgroup kills a timed-out run, the server lets its relay go, and the relay ends the
    run and itself: its kept root goes with it, with what the run wrote outside its dir (which
    would else stay on the runs' tmpfs, run after run, until the server stops)."""
    if (reason := lite_unavailable_reason()) is not None:
        pytest.skip(reason)
    if confinement == "cgroup" and not CgroupConfinement.available():
        pytest.skip("cgroup v1 pids/memory/freezer controllers are not writable here")
    overrides = {
        "tmp_root": str(tmp_path),
        "isolation": "lite",
        "confinement": confinement.removesuffix("-noidmap"),
        "idmapped_mounts": "off" if confinement.endswith("-noidmap") else "auto",
    }
    box = MockSandbox.create(load_settings(overrides=overrides))
    try:
        run(box, "print(1)")
        assert kept_roots(box)
        # (In its root: the run's own there on every path, where the image's /var may not be.)
        code = (
            "import time\nopen('/hog', 'wb').write(b'x' * (4 << 20))\n"
            "print('wrote', flush=True)\ntime.sleep(60)"
        )
        answer = box.engine.run_code(RunCodeRequest(code=code, language="python", run_timeout=3))
        assert answer.run_result is not None and answer.run_result.status.value == "TimeLimitExceeded"
        assert answer.run_result.stdout == "wrote\n"
        runs_root = Path(box.engine.runs_root.path)  # type: ignore[union-attr]
        # (The relay drops the root once every process of the run is dead: a moment after the answer.)
        deadline = time.monotonic() + 15
        while not holds_no_layers(runs_root) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert holds_no_layers(runs_root), sorted(str(p) for p in runs_root.rglob("*"))
        assert not list(runs_root.glob("kept-*/u/hog"))
    finally:
        box.close()
    assert list(tmp_path.iterdir()) == []


def test_the_root_of_a_relay_killed_from_outside_goes_at_the_next_run(sandbox: MockSandbox) -> None:
    """A relay drops its kept root when it leaves; one killed from outside (SIGKILL: the OOM
    killer, an operator) cannot. The server finds such a relay gone when it hands it the next
    run, and removes every ``kept-*`` whose lock nobody holds any more, and no other."""
    run(sandbox, "print(1)")
    (before,) = kept_roots(sandbox)
    relays = relays_of(sandbox)
    assert relays
    for relay in relays:
        relay.kill()
    psutil.wait_procs(relays, timeout=10)
    assert kept_roots(sandbox) == [before]  # nobody dropped it
    assert run(sandbox, "print(2)") == "2\n"
    after = kept_roots(sandbox)
    assert before not in after
    assert len(after) == 1  # the next run's relay's own, locked: left alone


def test_a_sigio_that_does_not_come_from_the_server_leaving_ends_nothing(sandbox: MockSandbox) -> None:
    """The relay watches its socket with the server for SIGIO while a program runs, and ends the
    run when the server closed its end. The kernel also raises that signal late, for a message the
    relay took already (a sender delayed between queueing it and waking the socket's owner: the
    wake-up lands in the run the message started), and a program can send it to its PID 1. Neither
    may end the run: it answers as its program did, and its relay serves the next run. (Before
    this held, 1 run in 2000-4000 at concurrency 1 answered -9 for ``print(1)``.)"""
    run(sandbox, "print(0)")
    relays = [relay.pid for relay in relays_of(sandbox)]
    # (Where the run joined its user namespace itself and its relay is the host's root, the kernel
    # refuses a program's signal to it outright.)
    code = (
        "import os, signal, time\n"
        "for _ in range(3):\n"
        "    try:\n        os.kill(1, signal.SIGIO)\n    except PermissionError:\n        pass\n"
        "    time.sleep(0.05)\n"
        "print('still here')"
    )
    with divergence.collecting() as notes:
        assert run(sandbox, code, run_timeout=20) == "still here\n"
    assert not [n for n in notes if divergence.kind_of(n) == divergence.RELAY], notes
    assert [relay.pid for relay in relays_of(sandbox)] == relays  # the same relay, still serving
    assert run(sandbox, "print('next')") == "next\n"


def test_a_run_whose_server_end_closed_mid_run_is_ended_and_says_so(sandbox: MockSandbox) -> None:
    """When the server's end of the relay's socket closes while a program runs (the server let
    the run go, or is gone), the relay ends the run itself and says so first: if the server still
    waits for that run, its answer carries the note, and a -9 the program did not ask for is never
    passed off as its own. The next run gets a new relay."""
    launcher = sandbox.engine.runner.launcher  # type: ignore[attr-defined]
    run(sandbox, "print(0)")
    answers: list[Any] = []
    notes: list[str] = []

    def sleeper() -> None:
        with divergence.collecting() as said:
            answers.append(
                sandbox.engine.run_code(
                    RunCodeRequest(code="import time\ntime.sleep(30)", language="python", run_timeout=60)
                )
            )
        notes.extend(said)

    thread = threading.Thread(target=sleeper)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        busy: list[socket.socket] = []
        while not busy and time.monotonic() < deadline:
            with launcher._lock:
                busy = [r for r in launcher._world_relays if r not in launcher._idle_world_relays]
            time.sleep(0.05)
        assert len(busy) == 1, "the sleeper's relay was not found busy"
        # Once its program runs (the relay watches its socket from then on; a socket closed
        # before that is found as the run begins, and said so).
        while not any(relay.children() for relay in relays_of(sandbox)):
            assert time.monotonic() < deadline, "the sleeper's program never started"
            time.sleep(0.05)
        time.sleep(0.2)
        busy[0].shutdown(socket.SHUT_RDWR)  # our end reads as closed to the relay
    finally:
        thread.join(timeout=30)
    (answer,) = answers
    assert answer.run_result is not None
    assert answer.run_result.return_code == -9 and answer.run_result.execution_time < 20, answer.run_result
    said = [n for n in notes if divergence.kind_of(n) == divergence.RELAY]
    assert len(said) == 1 and "its socket with the server read as closed (" in said[0], notes
    assert run(sandbox, "print('next')") == "next\n"  # a new relay serves the next run


def relays_of(box: MockSandbox) -> list[psutil.Process]:
    """The relays of ``box``'s launcher (its children), by pid."""
    launcher = box.engine.runner.launcher  # type: ignore[attr-defined]
    return sorted(psutil.Process(launcher.pid).children(), key=lambda relay: relay.pid)


def test_where_no_watch_can_be_had_each_root_serves_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relay that cannot watch a root's dirs (inotify's limits, or no inotify) cannot tell whether
    a run left them as it found them: each root then serves one run, as every root once did. The
    launcher here is the real one with its watch failing as at the limit (EMFILE)."""
    if (reason := lite_unavailable_reason()) is not None:
        pytest.skip(reason)
    copy = tmp_path / "launcher"
    shutil.copytree(launcher.LAUNCHER_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    syscalls = copy / "_launcher_syscalls.py"
    source = syscalls.read_text()
    assert source.count("\nclass Syscalls:\n") == 1
    failing = (
        "\n\ndef _no_watch(self, dirs):\n"
        "    raise OSError(24, 'inotify_init1: Too many open files')\n\n\n"
        "Syscalls.watch_changes = _no_watch\n"
    )
    syscalls.write_text(source + failing)
    monkeypatch.setattr(launcher, "LAUNCHER_MAIN", copy / "__main__.py")
    settings = load_settings(overrides={"tmp_root": str(tmp_path / "runs"), "isolation": "lite"})
    os.mkdir(tmp_path / "runs")
    box = MockSandbox.create(settings)
    try:
        # The run's root names its upper layer (kept-<random>) in the run's own mount table.
        which = "print(next(l for l in open('/proc/self/mountinfo') if ' / / ' in l).split('/kept-')[1][:12])"
        roots = [run(box, which).strip() for _ in range(4)]
    finally:
        box.close()
    assert all(len(name) == 12 for name in roots), roots
    assert len(set(roots)) == len(roots), roots


@pytest.mark.parametrize("idmapped_mounts", ["auto", "off"])
def test_a_python_under_the_runs_temp_dir_is_seen_in_a_kept_root(
    tmp_path: Path, idmapped_mounts: str
) -> None:
    """The runs' Python in a venv under their temp dir (a checkout's or a CI clone's under /tmp):
    the kept root's own dir of runs shows it as the host has it (bound again inside), read-only,
    root after root; a run that writes on the way to it has its root dropped, and the next run
    finds nothing of what it wrote."""
    if (reason := lite_unavailable_reason()) is not None:
        pytest.skip(reason)
    runs_dir = tmp_path / "tmp"
    venv = runs_dir / "nest" / "venv"
    subprocess.run(
        [load_settings().python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    overrides = {
        "tmp_root": str(runs_dir),
        "isolation": "lite",
        "python": str(venv / "bin" / "python"),
        "idmapped_mounts": idmapped_mounts,
        "kept_root_max_age_s": 3600,
    }
    box = MockSandbox.create(load_settings(overrides=overrides))
    look = (
        "import os, sys\nparent = os.path.dirname(os.getcwd())\nhere = os.path.basename(os.getcwd())\n"
        "print(sys.prefix, sorted(n for n in os.listdir(parent) if n != here),"
        " sorted(os.listdir(os.path.join(parent, 'nest'))))\n"
        "try:\n    open(os.path.join(sys.prefix, 'left'), 'w')\nexcept OSError as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    try:
        first = run(box, look)
        assert first.split("\n")[0] == f"{venv} ['nest'] ['venv']", first
        assert first.split("\n")[1] in ("PermissionError", "OSError"), first
        root = kept_roots(box)
        assert run(box, look) == first and kept_roots(box) == root
        wrote = run(
            box,
            "import os\ntry:\n    open(os.path.join(os.path.dirname(os.getcwd()), 'nest', 'left'), 'w')\n"
            "except PermissionError:\n    print('refused')\nelse:\n    print('wrote')",
        )
        # (Where the host root's files are nobody's to a run, the way to a shown dir is too.)
        assert wrote == ("refused\n" if box.engine.isolation.without_idmapped_mounts else "wrote\n")
        assert run(box, look) == first
        assert len(kept_roots(box)) == 1 and (kept_roots(box) != root) == (wrote == "wrote\n")
    finally:
        box.close()
