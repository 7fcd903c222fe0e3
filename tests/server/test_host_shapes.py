"""The hostile suite on every host shape this machine can make (issue 34): a real ``mocksandbox
serve`` with its default settings started as root, as root with no writable cgroup, as an ordinary
user (``nobody``), as pid 3 of a PID namespace (a container's shape), and as root on a kernel
that refuses idmapped mounts (``idmapped_mounts: off``), each with hostile programs sent over HTTP.

Every server runs in a PID namespace of the test's own (:func:`serve_process.shape_command`), and
every canary (files, a home with credentials, a loopback listener) is the test's own, so that a
failure can hurt nothing of this machine. None of these tests skips where a protection is missing:
a protection a shape cannot give fails here, as it would fail a user there.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests
from serve_process import (
    HOST_SHAPES,
    NEIGHBOUR,
    NO_PROXY,
    ORDINARY_UID,
    ServeProcess,
    a_runs_ids_on_the_host,
    assert_runs_start_apart,
    is_alive,
    is_server_process,
    neighbour_of,
    run_uid_of,
    shape_command,
    start_serve,
    stdout_of,
    stop_serve,
)

# One worker runs the whole module, in its order: each shape's server is started once, and
# test_doctor_tells_the_truth runs after the hostile tests of its shape, in the process that noted
# what they found (FOUND).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("host_shapes")]


@pytest.fixture(scope="module", params=HOST_SHAPES)
def shape(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def home(shape: str) -> Iterator[Path]:
    """The server user's home, with credential canaries; somewhere that user can reach, and that
    runs see (not in ``/tmp``, which starts empty for them): a check that a run cannot change or
    read a canary can only fail if the canary is in its view. The key is readable by anyone, so
    that only the mask (not its mode) keeps it from a run."""
    home = Path(tempfile.mkdtemp(prefix="shape-home-", dir="/var/tmp"))
    home.chmod(0o755)
    (home / ".ssh").mkdir(mode=0o755)
    (home / ".ssh" / "id_ed25519").write_text("CANARY-SSH-KEY\n")
    (home / ".ssh" / "id_ed25519").chmod(0o644)
    (home / "notes.txt").write_text("keep me\n")
    # Its temp dir (TMPDIR, where its runs' files go): in /tmp, as most users' (shape_command).
    tmp_dir = Path("/tmp") / home.name
    tmp_dir.mkdir(mode=0o700)
    if shape == "ordinary-user":
        for path in [home, tmp_dir, *home.rglob("*")]:
            os.chown(path, ORDINARY_UID, ORDINARY_UID)
    yield home
    shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(tmp_dir, ignore_errors=True)


#: A run's memory bound and the runs' tmpfs (all runs' files) on these servers, in MiB: smaller
#: than the defaults (4096, a quarter of the host's memory) so that the tests that reach them stay
#: quick.
MEMORY_BOUND_MB = 1024
SCRATCH_BOUND_MB = 2048

#: What ``mocksandbox doctor`` must say on each shape: every protection the tests below prove holds,
#: and the bounds that only cgroups give per run said to hold partly where there are none.
PROVED = ("files", "processes", "network", "secrets", "non-root uid", "seccomp", "process bound")
WITHOUT_CGROUPS = ("root-without-cgroups", "ordinary-user")

#: What the hostile tests below tried (``tried``) and found to hold (``held``) on each shape, by
#: protection: what ``mocksandbox doctor``'s table is held to (test_doctor_tells_the_truth).
FOUND: dict[str, dict[str, set[str]]] = {}


def trying(shape: str, *names: str) -> set[str]:
    """Note that a test tries ``names`` on ``shape``; the set returned is where it notes them held
    (``.update(names)`` once its checks have passed)."""
    found = FOUND.setdefault(shape, {"tried": set(), "held": set()})
    found["tried"].update(names)
    return found["held"]


#: The server's environment beyond the default settings: its user's home, and the bounds above.
def server_environment(home: Path) -> dict[str, str]:
    return {
        "HOME": str(home),
        "MOCKSANDBOX_MAX_MEMORY_MB": str(MEMORY_BOUND_MB),
        "MOCKSANDBOX_RUNS_SCRATCH_MB": str(SCRATCH_BOUND_MB),
    }


@pytest.fixture(scope="module")
def server(shape: str, home: Path) -> Iterator[ServeProcess]:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in server_environment(home).items():
            patch.setenv(name, value)
        process = start_serve(shape=shape, home=home)
    yield process
    # What it keeps in the temp dir while it lives (its runs' dir, and the lock beside it that
    # every mount namespace sees): gone once it has stopped, whatever the shape.
    kept = {
        Path(f.path)
        for child in psutil.Process(process.process.pid).children(recursive=True)
        if is_server_process(child)
        for f in child.open_files()
        if Path(f.path).name.startswith("mocksandbox-")
    }
    stop_serve(process.process)
    assert kept, "the server held no lock in the temp dir"
    assert not [p for p in kept if p.exists()], kept
    # Nothing of its at all, after its start-up probes, its runs, kernels and swedev sessions.
    left = sorted(str(path) for path in (Path("/tmp") / home.name).rglob("*"))
    assert not left, f"the server ({shape}) left this in its temp dir: {left[:20]}"


def answers(server: ServeProcess) -> bool:
    return requests.get(f"{server.url}/v1/ping", timeout=30, proxies=NO_PROXY).status_code == 200


def test_runs_are_never_the_hosts_root(server: ServeProcess, shape: str) -> None:
    held = trying(shape, "non-root uid")
    text = "".join(server.banner)
    assert "isolation: lite" in text, text
    run_uid = run_uid_of(server)
    assert run_uid != 0
    if shape == "ordinary-user":
        assert run_uid == ORDINARY_UID
    # Which way it holds (a root server's): through idmapped mounts where this kernel takes them,
    # else without, saying why; root-without-idmap is without them whatever the kernel.
    if shape == "root-without-idmap":
        assert "without idmapped mounts: the setting idmapped_mounts is off" in text, text
    elif "without idmapped mounts" in text:
        assert shape != "ordinary-user" and "refuses them" in text, text
    assert stdout_of(server.run("id -u", language="bash")) == "0\n"  # root in its world, as on SandboxFusion
    # ... and that uid on the host, as the kernel says from this side.
    uids, _ = a_runs_ids_on_the_host(server)
    assert (uids.real, uids.effective, uids.saved) == (run_uid,) * 3
    held.update(("non-root uid",))


def test_host_files_can_be_neither_changed_nor_planted(
    server: ServeProcess, home: Path, shape: str, request: pytest.FixtureRequest
) -> None:
    held = trying(shape, "files")
    notes = home / "notes.txt"
    planted = [f"/etc/mocksandbox-planted-{os.getpid()}", str(home / "planted")]
    # Were the protection off (a mutation run), the canary must not outlive the test.
    request.addfinalizer(lambda: [os.remove(path) for path in planted if os.path.exists(path)])
    # (Changed in the run's own view, copy-on-write, or refused where the host root's files are
    # nobody's to it: root-without-idmap.)
    code = (
        "import os, shutil\n"
        f"print(open({str(notes)!r}).read(), end='')\n"  # (the canary is in the run's view)
        "try:\n"
        f"    open({str(notes)!r}, 'w').write('changed')\n"
        "except PermissionError:\n"
        "    pass\n"
        f"for path in {planted!r}:\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "    except OSError:\n"
        "        pass\n"
        f"shutil.rmtree({str(home)!r}, ignore_errors=True)\n"
        "print('done')\n"
    )
    assert stdout_of(server.run(code)) == "keep me\ndone\n"
    assert notes.read_text() == "keep me\n"
    assert not any(os.path.exists(path) for path in planted)
    held.update(("files",))


def test_tmp_and_run_start_empty_and_runs_leave_nothing(server: ServeProcess) -> None:
    """Nothing of the host's /tmp and /run nor of an earlier run in a run's view (see
    :func:`serve_process.assert_runs_start_apart`)."""
    assert_runs_start_apart(server)


def test_secrets_stay_out(server: ServeProcess, home: Path, shape: str) -> None:
    """The server user's credentials look empty (the key, readable by anyone on the host, is not
    there), the host's /etc/shadow is empty (its size, which any uid may see), and the kernel's
    keyrings are out of reach (the seccomp filter)."""
    held = trying(shape, "secrets", "seccomp")
    assert os.stat("/etc/shadow").st_size > 0  # (else the check below could not fail)
    code = (
        "import ctypes, os\n"
        "def read(path):\n"
        "    try:\n"
        "        return open(path).read()\n"
        "    except OSError as error:\n"
        "        return type(error).__name__\n"
        f"print(repr(read({str(home / '.ssh' / 'id_ed25519')!r})), os.listdir({str(home / '.ssh')!r}))\n"
        "print(os.stat('/etc/shadow').st_size)\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        "print(libc.syscall(250, 0, -4, 0), os.strerror(ctypes.get_errno()))\n"  # keyctl(GET_KEYRING_ID, @u)
    )
    lines = stdout_of(server.run(code)).splitlines()
    assert lines[0] == "'FileNotFoundError' []", lines
    assert lines[1] == "0", lines
    assert lines[2] == "-1 Operation not permitted"
    held.update(("secrets", "seccomp"))


def test_no_host_loopback_service_nor_the_control_api_is_reachable(server: ServeProcess, shape: str) -> None:
    held = trying(shape, "network")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        api_port = int(server.url.rsplit(":", 1)[1])
        code = (
            "import socket\n"
            f"for port in ({port}, {api_port}):\n"
            "    try:\n"
            "        socket.create_connection(('127.0.0.1', port), timeout=3); print('reached')\n"
            "    except OSError:\n"
            "        print('refused')\n"
        )
        assert stdout_of(server.run(code)) == "refused\nrefused\n"
    held.update(("network",))


def test_the_server_can_be_neither_seen_nor_signalled(server: ServeProcess, shape: str) -> None:
    """Neither the server nor its neighbour (a process of the server's user beside it, which the
    server's own PID 1 place could not stand for: see ``serve_process.NEIGHBOUR``) is in a run's
    process list, and a run's ``kill(-1)`` and ``pkill`` end neither."""
    held = trying(shape, "processes")
    neighbour = neighbour_of(server.process)
    code = (
        "import os, signal\n"
        "seen = []\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    try:\n"
        "        with open(f'/proc/{pid}/cmdline', 'rb') as f:\n"
        "            line = f.read()\n"
        "    except OSError:\n"
        "        continue\n"
        f"    if b'mocksandbox.cli' in line or b'{NEIGHBOUR}' in line:\n"
        "        seen.append(line.replace(bytes(1), b' ').decode())\n"
        "print(seen)\n"
        "try:\n"
        "    os.kill(-1, signal.SIGKILL)\n"
        "except ProcessLookupError:\n"
        "    pass\n"
        "print('still here')\n"
    )
    answer = server.run(code)
    assert stdout_of(answer) == "[]\nstill here\n", answer
    assert is_alive(neighbour), "a run's kill(-1) ended the server's neighbour"
    server.run(f"kill -9 -1; pkill -9 -f mocksandbox; pkill -9 -f {NEIGHBOUR}; echo done", language="bash")
    assert is_alive(neighbour), "a run's kill -9 -1 or pkill ended the server's neighbour"
    assert server.process.poll() is None and answers(server)
    held.update(("processes",))


def test_a_fork_bomb_is_bounded(server: ServeProcess, shape: str) -> None:
    """Stopped at the run's process bound (512, the program and its threads among them), not
    before it: without the bound all 2000 forks succeed."""
    held = trying(shape, "process bound")
    code = (
        "import os, time\n"
        "made = 0\n"
        "try:\n"
        "    while made < 2000:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        made += 1\n"
        "except OSError:\n"
        "    pass\n"
        "print(made)\n"
    )
    answer = server.run(code, run_timeout=20)
    made = stdout_of(answer).strip()
    assert made.isdigit() and 256 <= int(made) < 512, answer
    bomb = server.run(":(){ :|:& };:", language="bash", run_timeout=3)
    assert bomb["run_result"] is not None
    assert stdout_of(server.run("print('alive')")) == "alive\n"
    held.update(("process bound",))


def grown_to(answer: dict[str, object]) -> int:
    """The last figure (MiB) a growing program printed before it was stopped."""
    figures = [line for line in stdout_of(answer).splitlines() if line.isdigit()]
    assert figures, answer
    return int(figures[-1])


def test_a_memory_hog_is_bounded(server: ServeProcess, shape: str) -> None:
    """A program that grows 32 MiB at a time (pages written, so that they count), saying how far
    it got, is stopped near the run's memory bound (1 GiB here): killed by its cgroup, or refused
    by its rlimit where there is none. Unbounded, it reaches 3 GiB and says so."""
    held = trying(shape, "memory bound")
    grower = (
        "import sys\n"
        "chunks = []\n"
        "for size in range(32, 3 * 1024 + 1, 32):\n"
        "    chunks.append(b'x' * (32 << 20))\n"
        "    print(size, flush=True)\n"
        "print('survived')\n"
    )
    answer = server.run(grower, run_timeout=60)
    assert answer["status"] == "Failed" and "survived" not in stdout_of(answer), answer
    result = answer["run_result"]
    assert isinstance(result, dict) and result["status"] != "TimeLimitExceeded", answer
    assert MEMORY_BOUND_MB // 2 <= grown_to(answer) <= MEMORY_BOUND_MB, answer
    if shape not in WITHOUT_CGROUPS:
        assert result["return_code"] == -9, answer  # the run's own cgroup's OOM kill
    assert stdout_of(server.run("print('alive')")) == "alive\n"
    held.update(("memory bound",))


def test_scratch_space_is_bounded(server: ServeProcess, shape: str) -> None:
    """Files in pieces of 64 MiB (under a file's bound), saying how far they got: stopped near the
    run's memory bound where a cgroup counts a run's files (on the runs' tmpfs) in it, else near the
    runs' tmpfs's size; never on the host's disk. Unbounded, 4 GiB are written and it says so."""
    held = trying(shape, "scratch bound")
    disk = shutil.disk_usage("/tmp").used
    code = (
        "written = 0\n"
        "try:\n"
        "    for index in range(64):\n"
        "        with open(f'scratch-{index}', 'wb') as out:\n"
        "            out.write(b'x' * (64 << 20))\n"
        "        written += 64\n"
        "        print(written, flush=True)\n"
        "    print('survived')\n"
        "except OSError as error:\n"
        "    print('stopped', error.errno)\n"
    )
    answer = server.run(code, run_timeout=120)
    assert "survived" not in stdout_of(answer), answer
    bound = SCRATCH_BOUND_MB if shape in WITHOUT_CGROUPS else MEMORY_BOUND_MB
    assert bound // 2 <= grown_to(answer) <= bound, answer
    assert shutil.disk_usage("/tmp").used - disk < (1 << 30)  # not on the host's disk
    assert stdout_of(server.run("print('alive')")) == "alive\n"
    held.update(("scratch bound",))


def test_a_swedev_session_runs_and_ends(server: ServeProcess) -> None:
    """A swedev episode (its world, the repository's commands, the scoring): the server's fixture
    then checks it left nothing in its temp dir."""

    def post(path: str, body: dict[str, object]) -> dict[str, object]:
        reply = requests.post(f"{server.url}{path}", json=body, timeout=300, proxies=NO_PROXY)
        assert reply.status_code == 200, reply.text
        answer: dict[str, object] = reply.json()
        return answer

    sid = post("/start_instance", {"instance_id": "acme__pagekit-17"})["sid"]
    content = post(
        "/process_action",
        {
            "sid": sid,
            "content": "<function=execute_bash>\n<parameter=command>ls; touch made-here</parameter>\n</function>",
        },
    )
    assert "EXECUTION RESULT of" in str(content["content"]), content
    post("/postprocess", {"sid": sid})
    assert "reward" in post("/compute_reward", {"sid": int(str(sid))})


def test_doctor_tells_the_truth(shape: str, home: Path, server: ServeProcess) -> None:
    """``mocksandbox doctor`` on the same shape: its table against what this suite found."""
    command = shape_command(shape, [sys.executable, "-m", "mocksandbox.cli", "doctor"], home)
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **server_environment(home)},
        start_new_session=True,
    )
    table = {
        name: (holds, how)
        for name, holds, how in re.findall(
            r"^([a-z][a-z -]+?)\s{2,}(yes|partly|no)\s+(.*)$", done.stdout, re.M
        )
    }
    rows = {name: holds for name, (holds, _) in table.items()}
    # The way runs are their uid, as the banner says it (without idmapped mounts: why).
    without_idmap = re.search(r"^non-root uid .*without idmapped mounts: (.*)$", done.stdout, re.M)
    banner_says = re.search(r"without idmapped mounts: (.*?);", "".join(server.banner))
    assert bool(without_idmap) == bool(banner_says), done.stdout
    if shape == "root-without-idmap":
        assert without_idmap and "the setting idmapped_mounts is off" in without_idmap.group(1), done.stdout
    assert set(rows) == {*PROVED, "memory bound", "scratch bound"}, done.stdout + done.stderr
    assert {name: rows[name] for name in PROVED} == dict.fromkeys(PROVED, "yes"), done.stdout
    bounds = "partly" if shape in WITHOUT_CGROUPS else "yes"
    assert (rows["memory bound"], rows["scratch bound"]) == (bounds, bounds), done.stdout
    assert done.returncode == (1 if shape in WITHOUT_CGROUPS else 0), done.stdout + done.stderr
    # Each row that holds says how the start-up run proved it, or that it is configured, not proven
    # here: only the scratch bound a cgroup gives (filling it is no start-up work).
    proven = {name for name, (_, how) in table.items() if "(proven at start: " in how}
    unproven = {name for name, (_, how) in table.items() if "(configured, not proven here: " in how}
    assert proven == set(table) - ({"scratch bound"} if shape not in WITHOUT_CGROUPS else set()), done.stdout
    assert unproven == set(table) - proven, done.stdout
    # ... and what the start-up run proved, the hostile suite found on this shape too (as far as it
    # ran in this process: all of it in the whole module, which one worker runs, this test last).
    found = FOUND.get(shape, {"tried": set(), "held": set()})
    assert {name for name in proven if name in found["tried"]} <= found["held"], (found, done.stdout)


def test_a_jupyter_kernel_is_in_a_world_as_a_run_is(server: ServeProcess, home: Path) -> None:
    """Kernels are runs too: root in their world, no host file, secret or server within reach."""
    if "jupyter: off" in "".join(server.banner):
        pytest.fail("no ipykernel for the server's interpreter: make test installs the jupyter extra")
    api_port = int(server.url.rsplit(":", 1)[1])
    cells = [
        "import os, socket\n"
        "print(os.getuid())\n"
        "try:\n"
        f"    open({str(home / 'notes.txt')!r}, 'w').write('changed by a kernel')\n"
        "except PermissionError:\n"
        "    pass  # (the host root's files are nobody's to it: root-without-idmap)\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {api_port}), timeout=3); print('reached')\n"
        "except OSError:\n"
        "    print('refused')\n"
    ]
    response = requests.post(
        f"{server.url}/run_jupyter", json={"cells": cells}, timeout=120, proxies=NO_PROXY
    )
    answer = response.json()
    assert answer["status"] == "Success", answer
    assert answer["cells"][0]["stdout"] == "0\nrefused\n", answer
    assert (home / "notes.txt").read_text() == "keep me\n"
