"""The launcher's own protocol, below the engine: runs, the environment it fills in, lock warming."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mocksandbox.execution.engine import program_environment
from mocksandbox.execution.launcher import Launcher


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    started = Launcher(sys.executable, program_environment(os.environ))
    started.start()
    try:
        yield started
    finally:
        started.close()


def _launch(launcher: Launcher, request: dict[str, object]) -> tuple[socket.socket, int, int, int]:
    """Send one run (no stdin): its relay's socket, and the read ends of its stdout, stderr and
    status pipes."""
    pipes = [os.pipe() for _ in range(4)]
    (stdin_r, stdin_w), (stdout_r, stdout_w), (stderr_r, stderr_w), (status_r, status_w) = pipes
    try:
        relay = launcher.launch(request, [stdin_r, stdout_w, stderr_w, status_w])
    finally:
        for fd in (stdin_r, stdout_w, stderr_w, status_w, stdin_w):
            os.close(fd)
    return relay, stdout_r, stderr_r, status_r


def _run(launcher: Launcher, request: dict[str, object]) -> tuple[bytes, int]:
    """Send one run; its stdout and the wait status the relay reported."""
    relay, stdout_r, stderr_r, status_r = _launch(launcher, request)
    status = b""
    while chunk := os.read(status_r, 64):  # ends when the relay has said how the run ended
        status += chunk
    launcher.release(relay, True)  # (held until then: a relay whose socket closes ends its run)
    stdout = b""
    while chunk := os.read(stdout_r, 65536):
        stdout += chunk
    for fd in (status_r, stdout_r, stderr_r):
        os.close(fd)
    assert status[:1] == b"P" and status[9:10] == b"S", status
    return stdout, int.from_bytes(status[10:18], "little", signed=True)


def _whole_run(launcher: Launcher, request: dict[str, object]) -> tuple[bytes, bytes, bytes]:
    """Send one run and read it to its end: what its status pipe said, its stdout and stderr (a
    small output's, read once the run is over)."""
    relay, stdout_r, stderr_r, status_r = _launch(launcher, request)
    try:
        status = b""
        while chunk := os.read(status_r, 64):
            status += chunk
        stdout = os.read(stdout_r, 65536)
        stderr = os.read(stderr_r, 65536)
    finally:
        for fd in (status_r, stdout_r, stderr_r):
            os.close(fd)
    launcher.release(relay, True)
    return status, stdout, stderr


def _request(tmp_path: Path, command: str, **extra: object) -> dict[str, object]:
    return {
        "mode": "exec",
        "argv": ["/bin/bash", "-c", command],
        "file": None,
        "cwd": str(tmp_path),
        "env": None,
        "cgroup_procs": [],
        "memory_limit_mb": -1,
        **extra,
    }


def test_no_env_means_the_launchers_own_environment(launcher: Launcher, tmp_path: Path) -> None:
    own, _ = _run(launcher, _request(tmp_path, 'printf %s "$PATH"'))
    given, _ = _run(launcher, _request(tmp_path, 'printf %s "$PATH"', env={"PATH": "/only/this"}))
    assert own.decode() == launcher.env["PATH"]
    assert given == b"/only/this"


def test_launcher_rewrites_its_pid_into_the_warm_file_after_a_run(launcher: Launcher, tmp_path: Path) -> None:
    """The cgroup lock warmer: here aimed at a plain file, where its writes can be seen."""
    warm_file = tmp_path / "cgroup.procs"
    warm_file.write_bytes(b"")
    _, wait_status = _run(launcher, _request(tmp_path, "exit 3", warm_procs_file=str(warm_file)))
    assert os.waitstatus_to_exitcode(wait_status) == 3
    deadline = time.monotonic() + 30
    while warm_file.read_bytes() != str(launcher.pid).encode() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert warm_file.read_bytes() == str(launcher.pid).encode()


def test_a_server_started_without_stderr_still_runs_programs(tmp_path: Path) -> None:
    """``mocksandbox serve 2>&-``: the launcher inherits no descriptor 2 and a Python with no
    ``sys.__stderr__``; programs still get three streams, stderr with CPython's error handler."""
    script = tmp_path / "serve_without_stderr.py"
    script.write_text(
        "import json, os\n"
        "from mocksandbox.settings import Settings\n"
        "from mocksandbox.execution.engine import create_engine\n"
        "from mocksandbox.models import RunCodeRequest\n"
        "engine, confinement, launcher = create_engine(Settings(exec_mode='fork'))\n"
        "answers = []\n"
        "for code, language in (\n"
        "    ('import sys; print(sys.stderr.errors); print(2, file=sys.stderr)', 'python'),\n"
        "    ('echo 1; echo 2 >&2', 'bash'),\n"
        "):\n"
        "    result = engine.run_code(RunCodeRequest(code=code, language=language)).run_result\n"
        "    answers.append([result.stdout, result.stderr, result.return_code])\n"
        "launcher.close()\n"
        "confinement.close()\n"
        "os.write(1, json.dumps(answers).encode())\n"
    )
    done = subprocess.run(
        ["/bin/bash", "-c", f'exec 2>&-; exec "$0" {script}', sys.executable],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert json.loads(done.stdout) == [["backslashreplace\n", "2\n", 0], ["1\n", "2\n", 0]]


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("mode", ["exec", "python"])
def test_a_host_relay_the_server_lets_go_mid_run_kills_its_program(
    launcher: Launcher, tmp_path: Path, mode: str
) -> None:
    """The server closes a relay's socket where it gave a run up without killing it (its deadline
    passed before it learnt the program's pid; or the server died): the relay, parent of a run on
    the host, kills the program and what it started, says it did (``K``), and leaves."""
    pid_file = tmp_path / "started"
    script = tmp_path / "program.py"
    script.write_text(
        "import os, subprocess, time\n"
        "child = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    argv = [sys.executable, str(script)] if mode == "exec" else None
    relay, stdout_r, stderr_r, status_r = _launch(
        launcher, _request(tmp_path, "", mode=mode, argv=argv, file=str(script))
    )
    try:
        status = os.read(status_r, 9)
        assert status[:1] == b"P", status
        program = int.from_bytes(status[1:9], "little")
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.02)
        child = int(pid_file.read_text())
        assert _alive(program) and _alive(child)

        launcher.release(relay, False)  # closes our end: the relay's SIGIO

        said = b""
        while chunk := os.read(status_r, 64):  # ends when the relay exits
            said += chunk
        assert said[:1] == b"K", said
        deadline = time.monotonic() + 30
        while (_alive(program) or _alive(child)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(program) and not _alive(child)
    finally:
        for fd in (status_r, stdout_r, stderr_r):
            os.close(fd)


@pytest.mark.parametrize("mode", ["exec", "python"])
def test_the_linker_setting_is_the_launchers_alone(launcher: Launcher, tmp_path: Path, mode: str) -> None:
    """The launcher binds its symbols at its start (``LD_BIND_NOW``: ``launcher_env``); a program's
    environment is the server's, without it or its marker."""
    script = tmp_path / "env.py"
    script.write_text(
        "import os\nprint([os.environ.get(n, 'unset') for n in ('LD_BIND_NOW', 'MOCKSANDBOX_LAUNCHER_BIND_NOW')])\n"
    )
    shown, status = _run(
        launcher, _request(tmp_path, "", mode=mode, argv=[sys.executable, str(script)], file=str(script))
    )
    assert os.waitstatus_to_exitcode(status) == 0
    assert shown == b"['unset', 'unset']\n"
    assert "LD_BIND_NOW" not in launcher.env


def test_a_servers_own_linker_setting_reaches_its_programs(tmp_path: Path) -> None:
    """Where the server itself runs with ``LD_BIND_NOW``, its programs see it, as before."""
    started = Launcher(sys.executable, {**program_environment(os.environ), "LD_BIND_NOW": "yes"})
    started.start()
    try:
        shown, _ = _run(started, _request(tmp_path, 'printf %s "${LD_BIND_NOW-unset}"'))
    finally:
        started.close()
    assert shown == b"yes"


@pytest.mark.parametrize("mode", ["exec", "python"])
def test_a_program_joins_its_cgroups_by_files_its_relay_opened(
    launcher: Launcher, tmp_path: Path, mode: str
) -> None:
    """The relay opens the run's ``cgroup.procs`` files before its fork; the program writes ``0``
    (itself) to each, first thing (here plain files, where the writes can be seen)."""
    procs = [tmp_path / "a.procs", tmp_path / "b.procs"]
    for path in procs:
        path.write_bytes(b"")
    script = tmp_path / "program.py"
    script.write_text("print('ran')\n")
    shown, status = _run(
        launcher,
        _request(
            tmp_path, "", mode=mode, argv=[sys.executable, str(script)], file=str(script),
            cgroup_procs=[str(path) for path in procs],
        ),
    )  # fmt: skip
    assert (shown, os.waitstatus_to_exitcode(status)) == (b"ran\n", 0)
    assert [path.read_bytes() for path in procs] == [b"0", b"0"]


@pytest.mark.parametrize("mode", ["exec", "python"])
def test_a_cgroup_that_cannot_be_joined_is_a_launch_error_and_the_relay_serves_on(
    launcher: Launcher, tmp_path: Path, mode: str
) -> None:
    """A ``cgroup.procs`` the relay cannot open: the run never starts; why is on its stderr, and
    its status pipe says ``E`` with the errno (the server retries or reports it), never an exit.
    The relay takes the next run."""
    script = tmp_path / "program.py"
    script.write_text("print('ran')\n")
    request = _request(
        tmp_path, "", mode=mode, argv=[sys.executable, str(script)], file=str(script),
        cgroup_procs=[str(tmp_path / "gone" / "cgroup.procs")],
    )  # fmt: skip
    status, stdout, stderr = _whole_run(launcher, request)
    assert status == b"E" + (2).to_bytes(8, "little", signed=True)  # ENOENT
    assert stdout == b""
    assert stderr.startswith(b"mocksandbox launcher: cannot start the run: [Errno 2]"), stderr
    shown, exit_status = _run(launcher, {**request, "cgroup_procs": []})
    assert (shown, os.waitstatus_to_exitcode(exit_status)) == (b"ran\n", 0)


def _python_run(
    launcher: Launcher, tmp_path: Path, file_text: str, source: str | None
) -> tuple[bytes, bytes, int]:
    """A warm Python run of a file holding ``file_text``, sent with ``source``: its stdout, stderr
    and exit code."""
    script = tmp_path / "program.py"
    script.write_text(file_text)
    status, stdout, stderr = _whole_run(
        launcher, _request(tmp_path, "", mode="python", argv=None, file=str(script), source=source)
    )
    assert status[:1] == b"P" and status[9:10] == b"S", status
    return stdout, stderr, os.waitstatus_to_exitcode(int.from_bytes(status[10:18], "little", signed=True))


def test_a_source_sent_with_the_run_is_compiled_by_its_relay(launcher: Launcher, tmp_path: Path) -> None:
    """The relay compiles the source the run brought, before its fork: the program runs that code
    (here not what its file holds, to tell the two apart), under the file's name."""
    stdout, stderr, code = _python_run(
        launcher,
        tmp_path,
        "print('from the file')\n",
        "import sys\nprint('from the source', __file__ == sys.argv[0])\n",
    )
    assert (stdout, stderr, code) == (b"from the source True\n", b"", 0)


def test_a_source_that_does_not_compile_or_warns_is_left_to_the_program(
    launcher: Launcher, tmp_path: Path
) -> None:
    """A source that fails to compile, or warns as it compiles, is the program's to compile from
    its file: its SyntaxWarning is on the program's stderr, as ``python <file>`` shows it (not on
    the relay's), and the next runs' warnings too (the relay's warning filters are as they were)."""
    stdout, _, code = _python_run(launcher, tmp_path, "print('from the file')\n", "print(")
    assert (stdout, code) == (b"from the file\n", 0)
    warns = "x = 1\nprint(x is 1)\n"
    for _ in range(2):
        stdout, stderr, code = _python_run(launcher, tmp_path, warns, warns)
        assert (stdout, code) == (b"True\n", 0)
        assert b'program.py:2: SyntaxWarning: "is" with a literal' in stderr, stderr
    stdout, stderr, code = _python_run(launcher, tmp_path, "print(\n", "print(\n")
    assert (stdout, code) == (b"", 1)
    assert stderr.rstrip().endswith(b"SyntaxError: '(' was never closed"), stderr


def test_a_source_run_again_runs_under_its_own_file_name(launcher: Launcher, tmp_path: Path) -> None:
    """The same source sent with runs of other files (verl's test cases of one program), which
    its relay compiles once: each run's code, its functions', methods', lambdas' and
    comprehensions' too, carries that run's file name, in what it sees and in its traceback."""
    source = (
        "import sys\n"
        "def inner():\n"
        "    return [f() for f in (lambda: sys._getframe(0).f_code.co_filename,)][0]\n"
        "class Probe:\n"
        "    def where(self):\n"
        "        return sys._getframe(0).f_code.co_filename\n"
        "print(__file__, sys._getframe(0).f_code.co_filename, inner(), Probe().where())\n"
        "Probe().missing()\n"
    )
    for run in range(3):
        script = tmp_path / f"run{run}" / "program.py"
        script.parent.mkdir()
        script.write_text("print('from the file')\n")
        status, stdout, stderr = _whole_run(
            launcher, _request(tmp_path, "", mode="python", argv=None, file=str(script), source=source)
        )
        assert status[:1] == b"P" and status[9:10] == b"S", status
        assert stdout.decode().split() == [str(script)] * 4
        assert f'File "{script}", line 8, in <module>' in stderr.decode(), stderr


#: A program that looks for a marker (built, so that its own source does not hold it) in every
#: object it can reach two steps from the collector's: dicts' keys and values, strings and code.
_FINDS_MARKER = """\
import gc
marker = "".join(["MARKER_", "OF_RUN_A"])  # (not folded into one constant by the compiler)
def holds(thing):
    if isinstance(thing, str):
        return thing is not marker and marker in thing
    return type(thing).__name__ == "code" and marker in repr(thing.co_consts)
found = False
for outer in gc.get_objects():
    for inner in gc.get_referents(outer):
        near = [inner, *inner.keys(), *inner.values()] if isinstance(inner, dict) else [inner]
        found = found or any(holds(thing) for thing in near)
print(found)
"""


def test_a_run_finds_no_code_of_another_run_in_its_relay(launcher: Launcher, tmp_path: Path) -> None:
    """The relay keeps the code of the last source it compiled, for the next run of the same
    source; a run of another source finds none of it (nor the source) in what it can reach."""
    for run, source in enumerate(("print('MARKER_OF_RUN_A')\n", _FINDS_MARKER)):
        script = tmp_path / f"run{run}" / "program.py"
        script.parent.mkdir()
        script.write_text(source)
        status, stdout, stderr = _whole_run(
            launcher, _request(tmp_path, "", mode="python", argv=None, file=str(script), source=source)
        )
        assert status[:1] == b"P" and status[9:10] == b"S", status
    assert (stdout, stderr) == (b"False\n", b"")


def test_a_large_source_is_not_sent_and_its_program_still_runs(launcher: Launcher, tmp_path: Path) -> None:
    """A run message must fit the socket's buffer: past ``SOURCE_MESSAGE_LIMIT`` the source stays
    behind and the program compiles its file."""
    from mocksandbox.execution.launcher import SOURCE_MESSAGE_LIMIT

    text = "# " + "\u00e9" * SOURCE_MESSAGE_LIMIT + "\nprint('big')\n"  # (its JSON is six bytes a character)
    stdout, stderr, code = _python_run(launcher, tmp_path, text, text)
    assert (stdout, stderr, code) == (b"big\n", b"", 0)


#: A command's end that waits until the test makes ``go`` in the run's dir (:func:`_let_go`).
_WAIT_FOR_GO = "while [ ! -e go ]; do sleep 0.01; done"


def _let_go(launcher: Launcher, launched: tuple[socket.socket, int, int, int], run_dir: Path) -> bytes:
    """Let a run that waits with :data:`_WAIT_FOR_GO` (as :func:`_launch` sent it) end; its stdout,
    read once its relay has said so (the relay given back)."""
    (run_dir / "go").touch()
    relay, stdout_r, stderr_r, status_r = launched
    try:
        while os.read(status_r, 64):
            pass
        said = os.read(stdout_r, 65536)
    finally:
        for fd in (status_r, stdout_r, stderr_r):
            os.close(fd)
    launcher.release(relay, True)
    return said


def _cores(listed: str) -> set[int]:
    """``Cpus_allowed_list`` (``0-2,5``) as a set."""
    cores: set[int] = set()
    for part in listed.strip().split(","):
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return cores


def test_relays_keep_to_a_core_each_in_turn_and_their_programs_to_none(
    launcher: Launcher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each relay is kept to one core, the next relay to the next core (where the server does not
    say which: see the next test); a program starts on its relay's core but may use every core
    the launcher may (as a spawned one may)."""
    everything = os.sched_getaffinity(0)
    if len(everything) < 2:
        pytest.skip("one core: relays are left where they are")
    monkeypatch.setattr(launcher, "_core_now", None)
    say = "grep Cpus_allowed_list: /proc/$PPID/status /proc/self/status | cut -f2"
    # The first run waits, so that the second needs a relay of its own.
    first = _launch(launcher, _request(tmp_path, f"{say}; {_WAIT_FOR_GO}"))
    second, _ = _run(launcher, _request(tmp_path, say))
    said_first = _let_go(launcher, first, tmp_path)
    relays, programs = [], []
    for said in (said_first, second):
        relay_cores, program_cores = said.decode().split()
        relays.append(_cores(relay_cores))
        programs.append(_cores(program_cores))
    assert all(len(cores) == 1 for cores in relays), relays
    assert relays[0] != relays[1], "both relays were kept to one core"
    assert relays[0] | relays[1] <= everything
    assert programs == [everything, everything]


def test_relays_told_to_roam_keep_to_no_core(tmp_path: Path) -> None:
    """``pin_workers: false`` reaches the launcher: its relays may use every core."""
    roaming = Launcher(sys.executable, program_environment(os.environ), pin_relays=False)
    roaming.start()
    try:
        said, _ = _run(roaming, _request(tmp_path, "grep Cpus_allowed_list: /proc/$PPID/status | cut -f2"))
    finally:
        roaming.close()
    assert _cores(said.decode()) == os.sched_getaffinity(0)


@contextmanager
def _pinned(core: int) -> Iterator[None]:
    """This thread kept to ``core`` (its own affinity only), then to every core again."""
    everything = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, everything)


def test_a_run_goes_to_a_relay_on_the_core_of_the_thread_that_sends_it(
    launcher: Launcher, tmp_path: Path
) -> None:
    """A relay is made on the sending thread's core, and an idle one there is taken before the
    last one idle."""
    everything = sorted(os.sched_getaffinity(0))
    if len(everything) < 2:
        pytest.skip("one core: relays are left where they are")
    say = "grep -h Cpus_allowed_list: /proc/$PPID/status | cut -f2; echo $PPID"
    one, other = everything[-1], everything[0]  # (not the order relays take cores in by turns)
    with _pinned(one):  # (its relay kept busy, so that the next run needs one of its own)
        busy = _launch(launcher, _request(tmp_path, f"{say}; {_WAIT_FOR_GO}"))
    with _pinned(other):
        said_other, _ = _run(launcher, _request(tmp_path, say))
    said_one = _let_go(launcher, busy, tmp_path)  # (now the last relay idle: the first core's)
    with _pinned(other):
        said_again, _ = _run(launcher, _request(tmp_path, say))
    relays = []
    for said in (said_one, said_other, said_again):
        cores, pid = said.decode().split()
        relays.append((_cores(cores), int(pid)))
    assert [cores for cores, _ in relays] == [{one}, {other}, {other}]
    assert relays[2][1] == relays[1][1] != relays[0][1]


def test_a_run_goes_to_the_core_with_fewest_runs_under_way(launcher: Launcher, tmp_path: Path) -> None:
    """A run sent from a core that has one under way goes to a relay on a core that has none, and
    back to the sender's core once the runs there are over."""
    everything = sorted(os.sched_getaffinity(0))
    if len(everything) < 2:
        pytest.skip("one core: relays are left where they are")
    say = "grep -h Cpus_allowed_list: /proc/$PPID/status | cut -f2"
    one = everything[-1]
    with _pinned(one):
        busy = _launch(launcher, _request(tmp_path, f"{say}; {_WAIT_FOR_GO}"))
        said_while_busy, _ = _run(launcher, _request(tmp_path, say))
    said_busy = _let_go(launcher, busy, tmp_path)
    with _pinned(one):
        said_after, _ = _run(launcher, _request(tmp_path, say))
    assert _cores(said_busy.decode()) == {one}
    moved = _cores(said_while_busy.decode())
    assert len(moved) == 1 and one not in moved, moved
    assert _cores(said_after.decode()) == {one}
