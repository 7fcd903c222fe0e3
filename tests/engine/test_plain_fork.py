"""A relay's fork of its program without CPython's work around ``os.fork`` (``Syscalls.fork``):
taken where it is safe (CPython 3.8 to 3.10: production's 3.10 among them), and the program is a
whole interpreter all the same; a signal the relay had pending at the fork does nothing in it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_launcher import _whole_run
from test_launcher_pythons import find_cpython

import mocksandbox.execution.launcher as launcher_package
from mocksandbox.execution.engine import program_environment
from mocksandbox.execution.launcher import Launcher

LAUNCHER_DIR = str(Path(launcher_package.__file__).parent)

#: What the program checks of itself: threads, its own fork (with a hook it registered, and a
#: thread in the child), its main thread, SIGINT as KeyboardInterrupt, its pid.
_WHOLE_INTERPRETER = """\
import os, signal, sys, threading, time
said = []
worker = threading.Thread(target=said.append, args=("thread",))
worker.start()
worker.join()
said.append(threading.main_thread() is threading.current_thread())
hook_r, hook_w = os.pipe()
os.register_at_fork(after_in_child=lambda: os.write(hook_w, b"hook"))
child = os.fork()
if child == 0:
    inner = threading.Thread(target=lambda: None)
    inner.start()
    inner.join()
    os._exit(7)
said.append(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
said.append(os.read(hook_r, 16).decode())
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
except KeyboardInterrupt:
    said.append("interrupted")
said.append(os.getpid() == int(open("/proc/self/stat").read().split()[0]))
print(said)
"""


@pytest.fixture
def python_310(require_or_skip: Callable[[str | None], None]) -> str:
    """Production's CPython 3.10, which relays fork plainly."""
    return find_cpython("3.10", require_or_skip)


@pytest.fixture
def launcher_310(python_310: str) -> Iterator[Launcher]:
    started = Launcher(python_310, program_environment(os.environ))
    started.start()
    try:
        yield started
    finally:
        started.close()


def _plain_fork_taken(python: str) -> bool:
    """Whether the launcher's ``Syscalls`` on ``python`` forks programs plainly."""
    code = (
        f"import sys; sys.path.insert(0, {LAUNCHER_DIR!r}); import _launcher_syscalls as calls; "
        "print(calls.Syscalls().plain_fork is not None)"
    )
    said = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return said.stdout.strip() == "True"


def test_relays_fork_plainly_on_3_10_and_with_os_fork_after_it(python_310: str) -> None:
    assert _plain_fork_taken(python_310)
    # (The suite's own interpreter is a later one: its children need CPython's after-fork work.)
    assert sys.version_info[:2] > (3, 10)
    assert not _plain_fork_taken(sys.executable)


def test_a_plainly_forked_program_is_a_whole_interpreter(launcher_310: Launcher, tmp_path: Path) -> None:
    script = tmp_path / "program.py"
    script.write_text(_WHOLE_INTERPRETER)
    request = {
        "mode": "python",
        "argv": None,
        "file": str(script),
        "source": _WHOLE_INTERPRETER,
        "cwd": str(tmp_path),
        "env": None,
        "cgroup_procs": [],
        "memory_limit_mb": -1,
    }
    status, stdout, stderr = _whole_run(launcher_310, request)
    assert status[:1] == b"P" and status[9:10] == b"S", (status, stderr)
    assert stdout == b"['thread', True, 7, 'hook', 'interrupted', True]\n", stderr
    assert os.waitstatus_to_exitcode(int.from_bytes(status[10:18], "little", signed=True)) == 0


#: ``end_the_run`` called in a process that is not the relay (a program forked with the relay's
#: SIGIO pending), then in the relay: the server has left, the run on the host is a canary process
#: that echoes a line while it lives.
_PENDING_SIGIO = """\
import os, signal, socket, subprocess, sys
sys.path.insert(0, {launcher_dir!r})
import _launcher_state as state
from _launcher_watch import end_the_run
canary = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
ours, servers = socket.socketpair()
servers.close()
state.RELAY_SOCKET = ours
state.WATCHED_PID = canary.pid
state.RELAY_PID = os.getpid() + 1
end_the_run(signal.SIGIO, None)
canary.stdin.write(b"alive\\n")
canary.stdin.flush()
spared = canary.stdout.readline() == b"alive\\n"  # (a killed canary says nothing: EOF)
state.RELAY_PID = os.getpid()
end_the_run(signal.SIGIO, None)
print(spared, canary.wait(timeout=30))
"""


def test_a_sigio_pending_at_the_fork_does_nothing_in_the_program() -> None:
    """A program forked plainly runs the relay's SIGIO handler for a signal the relay had caught
    and not yet handled (``os.fork`` would have dropped it): there it must not end the run (here
    by killing the run on the host), which the relay still does."""
    said = subprocess.run(
        [sys.executable, "-c", _PENDING_SIGIO.format(launcher_dir=LAUNCHER_DIR)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert said.stdout.split() == ["True", "-9"], said.stdout + said.stderr
