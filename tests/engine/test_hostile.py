"""Hostile programs: each gets its right status, the server stays up, nothing is left behind."""

from __future__ import annotations

import ast
import os
import time
import uuid
from pathlib import Path

import psutil
import pytest

from mocksandbox import divergence
from mocksandbox.core import MockSandbox
from mocksandbox.execution.launcher import Launcher
from mocksandbox.execution.workdirs import IDLE_WORKDIRS
from mocksandbox.execution.world import holds_no_layers
from mocksandbox.models import CommandRunStatus, RunCodeRequest, RunCodeResponse, RunStatus


def is_runs_root(path: Path) -> bool:
    """The tmpfs an isolation-lite server keeps its requests' layers on."""
    return path.name.startswith("mocksandbox-") and os.path.ismount(path)


def is_runs_root_lock(path: Path) -> bool:
    """The lock a live server holds beside its runs' tmpfs (``<dir>.lock``)."""
    return path.suffix == ".lock" and is_runs_root(path.with_suffix(""))


def run(sandbox: MockSandbox, code: str, language: str = "python", **fields: object) -> RunCodeResponse:
    return sandbox.engine.run_code(RunCodeRequest(code=code, language=language, **fields))  # type: ignore[arg-type]


def needs_cgroup(sandbox: MockSandbox, why: str) -> None:
    """Skip a case that only per-run cgroups, or a world of its own (whose PID 1 ends every process
    of it, and whose uid rlimits bind), can handle: e.g. fork bombs run as the host's root."""
    in_world = sandbox.engine.isolation.mode == "lite" and sandbox.engine.isolation.run_uid is not None
    if sandbox.confinement.name != "cgroup" and not in_world:
        pytest.skip(f"process-group confinement cannot {why}, as the host's root with no world; cgroups can")


def processes_with(marker: str) -> list[psutil.Process]:
    """Processes whose command line carries ``marker``, but for launchers and their idle relays
    (whose ``--world`` option names the runs' tmpfs)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any(part.endswith("/launcher/__main__.py") for part in cmdline[1:2]):
            continue
        if any(marker in part for part in cmdline):
            found.append(proc)
    return found


#: Seconds the kernel gets to reap what a run left: they return as soon as nothing is left, and 15 s,
#: not 5, keep a loaded machine's slow reaping (after a fork bomb) from reading as a leak.
REAP_WITHIN_S = 15.0


def wait_leftovers(launcher: Launcher, within: float = REAP_WITHIN_S) -> list[psutil.Process]:
    """Processes under the launcher still there after ``within`` seconds, but for its idle
    relays: nothing below a relay (a program), and no more children than relays that wait for a
    run (an orphan handed to the launcher, or a relay let go that has not left yet)."""
    assert launcher.pid is not None
    deadline = time.monotonic() + within
    while True:
        try:
            children = psutil.Process(launcher.pid).children()
            below = [p for child in children for p in child.children(recursive=True)]
        except psutil.NoSuchProcess:  # (one left between the two looks: look again)
            time.sleep(0.02)
            continue
        extra = children[launcher.idle_relays :] if len(children) > launcher.idle_relays else []
        if not (below or extra) or time.monotonic() >= deadline:
            return below + extra
        time.sleep(0.02)


def wait_programs_in(runs_dir: Path, within: float = REAP_WITHIN_S) -> list[psutil.Process]:
    """Processes below this one that still work in a dir under ``runs_dir`` (a run's program or
    what it started) after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        found = []
        for process in psutil.Process().children(recursive=True):
            try:
                if process.cwd().startswith(str(runs_dir)):
                    found.append(process)
            except psutil.Error:
                pass  # gone meanwhile, or a zombie: not working anywhere
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def fresh_marker() -> str:
    """Six random digits, never fewer: a test's ``sleep 0.<marker>`` must be its own. (Unpadded,
    ``0.6099`` was found in another process's command line: a browser's ``120.0.6099.224``.)"""
    return f"{uuid.uuid4().int % 10**6:06d}"


def wait_gone(marker: str, within: float = REAP_WITHIN_S) -> list[psutil.Process]:
    """Processes still carrying ``marker`` after the kernel had ``within`` seconds to reap them."""
    deadline = time.monotonic() + within
    while (alive := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


@pytest.fixture(autouse=True)
def nothing_left(sandbox: MockSandbox, runs_dir: Path):
    yield
    # The server still answers, and every temp dir of the test's runs is gone.
    assert run(sandbox, "print('alive')").run_result.stdout == "alive\n"  # type: ignore[union-attr]
    # What is left in runs_dir is empty dirs kept for the next runs, no more than the pool keeps
    # (and, with isolation lite, the runs' tmpfs with no request's layers left in it).
    left = [d for d in runs_dir.iterdir() if not is_runs_root(d) and not is_runs_root_lock(d)]
    for root in (d for d in runs_dir.iterdir() if is_runs_root(d)):
        # (A relay let go at a run's deadline drops its kept root a moment after the answer.)
        deadline = time.monotonic() + 15
        while not holds_no_layers(root) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert holds_no_layers(root), sorted(str(p) for p in root.rglob("*"))
    assert all(d.is_dir() and not d.is_symlink() and not any(d.iterdir()) for d in left), left
    assert len(left) <= IDLE_WORKDIRS
    # No program is left anywhere below this process (whatever else other tests' fixtures keep
    # running here: a browser, a kernel pool, a Ray worker), and our launcher has only relays
    # waiting for the next run.
    assert wait_programs_in(runs_dir) == []
    assert wait_leftovers(sandbox.engine.runner.launcher) == []  # type: ignore[attr-defined]
    # Python programs carry their code file's path (inside runs_dir) on their command line.
    assert wait_gone(str(runs_dir)) == []


def test_fork_bomb_is_contained(sandbox: MockSandbox) -> None:
    needs_cgroup(sandbox, "bound the process count of a program running as root")
    code = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n"
    result = run(sandbox, code, run_timeout=2)
    assert result.status == RunStatus.Failed
    assert result.run_result is not None
    assert result.run_result.status == CommandRunStatus.TimeLimitExceeded


def test_shell_fork_bomb_dies_with_its_run(sandbox: MockSandbox) -> None:
    needs_cgroup(sandbox, "bound the process count of a program running as root")
    marker = fresh_marker()
    # The run ends when its shell has slept (up to 1 s) and echoed: 10 s leave room for that on a
    # loaded machine, where 2 s was thin (the bomb in the background does not wait it out).
    result = run(
        sandbox, f"b(){{ sleep 0.{marker}; b|b& }}; b; echo launched", language="bash", run_timeout=10
    )
    assert result.run_result is not None
    assert result.run_result.stdout == "launched\n"
    assert wait_gone(f"0.{marker}") == []


def test_memory_hog_is_killed(sandbox: MockSandbox) -> None:
    needs_cgroup(sandbox, "bound memory without a memory_limit_MB")
    code = "x = []\nwhile True:\n    x.append(bytearray(64 * 1024 * 1024))\n"
    result = run(sandbox, code, run_timeout=60)
    assert result.status == RunStatus.Failed
    assert result.run_result is not None
    # Confined by cgroup: the kernel's OOM killer (-9); by rlimits only: a MemoryError (rc 1).
    assert result.run_result.return_code in (-9, 1)


def test_memory_limit_mb_gives_memory_error(sandbox: MockSandbox) -> None:
    result = run(sandbox, "x = bytearray(300 * 1024 * 1024)", memory_limit_MB=200)
    assert result.run_result is not None
    assert result.run_result.return_code == 1
    assert "MemoryError" in (result.run_result.stderr or "")


def test_output_flood_is_capped_and_times_out(sandbox: MockSandbox) -> None:
    # A MiB a write, for 3 s: well past the cap (8 MiB) even where a run starts slowly and writes
    # at a few MB/s (a spawned interpreter in the software-emulated guest of tests/vm wrote 6.6 MB
    # in 1 s of 64 KiB writes).
    cap = sandbox.settings.max_output_bytes
    result = run(sandbox, "import sys\nwhile True:\n    sys.stdout.write('x' * (1 << 20))\n", run_timeout=3)
    assert result.run_result is not None
    assert result.run_result.status == CommandRunStatus.TimeLimitExceeded
    assert result.run_result.stdout == "x" * cap


def test_large_output_comes_back_complete(sandbox: MockSandbox) -> None:
    # SandboxFusion blocks on a full pipe from ~480 KB on; we drain while the program runs.
    size = 3 * 1024 * 1024
    result = run(sandbox, f"import sys\nsys.stdout.write('y' * {size})\nsys.stderr.write('z' * {size})")
    assert result.status == RunStatus.Success
    assert result.run_result is not None
    assert result.run_result.stdout == "y" * size
    assert result.run_result.stderr == "z" * size


def test_output_cap_does_not_split_a_character(sandbox: MockSandbox) -> None:
    cap = sandbox.settings.max_output_bytes
    # One ASCII byte first so that the cap falls inside a 3-byte character.
    result = run(sandbox, f"import sys\nsys.stdout.write('a' + '€' * {cap // 3 + 10})")
    assert result.run_result is not None
    stdout = result.run_result.stdout or ""
    assert not stdout.startswith("[DecodeError]")
    assert stdout == "a" + "€" * ((cap - 1) // 3)


def test_child_holding_the_pipe_does_not_hold_the_answer(sandbox: MockSandbox) -> None:
    marker = fresh_marker()
    code = f"import subprocess\nsubprocess.Popen(['sleep', '30.{marker}'])\nprint('parent done')"
    result = run(sandbox, code)
    assert result.status == RunStatus.Success
    assert result.run_result is not None
    assert result.run_result.stdout == "parent done\n"
    assert wait_gone(f"30.{marker}") == []


def test_orphan_that_left_the_session_is_killed(sandbox: MockSandbox) -> None:
    needs_cgroup(sandbox, "find a process that left the session after its parent exited")
    marker = fresh_marker()
    # The run ends once the orphan's sleep has started (it says so on a pipe): a fixed pause could
    # end it first on a loaded machine, and the test would then prove nothing.
    code = (
        "import os, subprocess\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        subprocess.Popen(['sleep', '40.{marker}'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "        os.write(w, b'x')\n"
        "    os._exit(0)\n"
        "os.close(w)\n"
        "os.read(r, 1)\n"
        "print('bye')\n"
    )
    result = run(sandbox, code)
    assert result.run_result is not None
    assert result.run_result.stdout == "bye\n"
    assert wait_gone(f"40.{marker}") == []


def test_background_job_in_bash_is_killed(sandbox: MockSandbox) -> None:
    marker = fresh_marker()
    result = run(sandbox, f"sleep 31.{marker} &\necho started", language="bash")
    assert result.status == RunStatus.Success
    assert wait_gone(f"31.{marker}") == []


def test_program_that_kills_its_parent(sandbox: MockSandbox) -> None:
    # (Where the run joined its user namespace itself and its relay is the host's root, the kernel
    # refuses the signal outright: the program goes on all the same.)
    code = (
        "import os, signal, time\n"
        "try:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept PermissionError:\n    pass\n"
        "time.sleep(1)\nprint('reached')"
    )
    with divergence.collecting() as notes:
        result = run(sandbox, code)
    assert result.run_result is not None
    if sandbox.engine.isolation.mode == "lite":
        # Its parent is the relay, PID 1 of the run's PID namespace: no signal from inside reaches it.
        assert result.status == RunStatus.Success
        assert result.run_result.stdout == "reached\n"
        assert not [n for n in notes if divergence.kind_of(n) == divergence.RELAY]
    else:
        assert result.status == RunStatus.Failed
        assert result.run_result.return_code == -9
        # The relay could not say how the program ended: the answer says that -9 is a guess.
        assert [divergence.kind_of(n) for n in notes if "relay ended" in n] == [divergence.RELAY]
    assert os.getpid() > 0  # we are still here to say so


def test_program_that_kills_its_process_group(sandbox: MockSandbox) -> None:
    result = run(sandbox, "import os, signal\nos.killpg(0, signal.SIGKILL)")
    assert result.run_result is not None
    assert result.run_result.return_code == -9


def test_program_that_closes_its_output(sandbox: MockSandbox) -> None:
    code = "import os, time\nprint('early', flush=True)\nos.close(1)\nos.close(2)\ntime.sleep(0.2)\n"
    result = run(sandbox, code)
    assert result.status == RunStatus.Success
    assert result.run_result is not None
    assert result.run_result.stdout == "early\n"


def test_program_that_never_reads_a_large_stdin(sandbox: MockSandbox) -> None:
    result = run(sandbox, "print('ignored stdin')", stdin="z" * 5_000_000)
    assert result.status == RunStatus.Success
    assert result.run_result is not None
    assert result.run_result.stdout == "ignored stdin\n"


def test_large_stdin_is_delivered_whole(sandbox: MockSandbox) -> None:
    result = run(sandbox, "import sys\nprint(len(sys.stdin.read()))", stdin="z" * 5_000_000)
    assert result.run_result is not None
    assert result.run_result.stdout == "5000000\n"


def test_timeout_kills_the_whole_tree(sandbox: MockSandbox) -> None:
    marker = fresh_marker()
    code = f"import subprocess, time\nsubprocess.Popen(['sleep', '50.{marker}'])\ntime.sleep(30)"
    result = run(sandbox, code, run_timeout=0.5)
    assert result.run_result is not None
    assert result.run_result.status == CommandRunStatus.TimeLimitExceeded
    assert result.run_result.return_code is None
    assert wait_gone(f"50.{marker}") == []


def test_a_run_timed_out_before_its_program_started_leaves_nothing(sandbox: MockSandbox) -> None:
    """A deadline that passes before the relay has even said the program's pid (a loaded machine:
    here a deadline of a millisecond makes it so): the server waits for the pid and kills the
    program by it, and what that started with it, rather than leave them to run to their end.
    (Where the pid comes later still, the relay kills them once the server lets it go:
    ``test_launcher.py::test_a_host_relay_the_server_lets_go_mid_run_kills_its_program``.)"""
    marker = fresh_marker()
    code = f"import subprocess, time\nsubprocess.Popen(['sleep', '50.{marker}'])\ntime.sleep(30)"
    result = run(sandbox, code, run_timeout=0.001)
    assert result.run_result is not None
    assert result.run_result.status == CommandRunStatus.TimeLimitExceeded
    assert wait_gone(f"50.{marker}") == []


def test_a_program_sees_the_command_line_sandboxfusion_gives_it(sandbox: MockSandbox) -> None:
    """``python <file>``, as SandboxFusion's spawned interpreter has it: not the launcher's command
    line, which a forked program would otherwise show (in ``ps`` and ``/proc/self/cmdline``)."""
    answer = run(sandbox, "import sys\nprint(repr(open('/proc/self/cmdline').read()), repr(sys.argv[0]))")
    assert answer.run_result is not None
    cmdline, argv0 = map(ast.literal_eval, answer.run_result.stdout.split())
    assert cmdline == f"python\0{argv0}\0"
    assert "launcher" not in cmdline
