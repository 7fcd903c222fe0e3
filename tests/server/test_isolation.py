"""Every run in a world of its own (isolation lite, the default where the host allows it), tried
as a user would: a real ``mocksandbox serve`` with its default settings, hostile programs sent over
HTTP.

The server runs as PID 1 of a PID namespace of the test's own (``start_serve(pid_namespace=True)``):
a program that escaped its world could signal nothing but the server, never this machine. Canary
files and listeners are the test's own.
"""

from __future__ import annotations

import base64
import ctypes
import os
import re
import shutil
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
import requests
from serve_process import (
    NO_PROXY,
    ServeProcess,
    a_runs_ids_on_the_host,
    assert_runs_start_apart,
    run_uid_of,
    start_serve,
    stdout_of,
    stop_serve,
)
from visible_dirs import visible_dir

from mocksandbox.execution.world import lite_unavailable_reason


@pytest.fixture(autouse=True)
def _needs_lite(require_or_skip: Callable[[str | None], None]) -> None:
    """Skipped where worlds cannot be had, saying why; under CI that is a failure, not a skip."""
    reason = lite_unavailable_reason()
    require_or_skip(None if reason is None else f"isolation lite is not available here: {reason}")


# add_key(2) and keyctl(2) on x86-64 (the machines this suite runs on) and their arguments.
_SYS_ADD_KEY, _SYS_KEYCTL = 248, 250
_KEYCTL_READ, _KEYCTL_REVOKE = 11, 3
_KEY_SPEC_SESSION_KEYRING, _KEY_SPEC_USER_KEYRING = -3, -4


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    """A home dir of the test's own holding credential canaries, the server's ``HOME``: where runs
    see it (not in /tmp, which they find empty), so that only the mask keeps its secrets from them."""
    home = visible_dir("home-")
    yield from _filled_home(home)


def _filled_home(home: Path) -> Iterator[Path]:
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "id_ed25519").write_text("CANARY-SSH-KEY\n")
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text("[default]\naws_secret_access_key = CANARY-AWS\n")
    (home / ".netrc").write_text("machine example.com password CANARY-NETRC\n")
    yield home
    shutil.rmtree(home, ignore_errors=True)


#: As root, the servers here run twice: with idmapped mounts (``auto``: this machine's kernel takes
#: them) and without (``off``: what a kernel before 6.3, whose tmpfs refuses them, gives: runs join
#: their user namespace themselves, and the host root's files are nobody's to them).
IDMAPPED_MOUNTS = ["auto", "off"] if os.geteuid() == 0 else ["auto"]


@pytest.fixture(scope="module", params=IDMAPPED_MOUNTS, ids=lambda mode: f"idmapped-mounts-{mode}")
def idmapped_mounts(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@contextmanager
def environment(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` while a server starts (it inherits them), as it was after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def without_idmapped_mounts(server: ServeProcess) -> bool:
    """Whether the server's runs are its unprivileged uid without idmapped mounts (the banner says
    so): the host root's files are nobody's to a run then, and read-only to it."""
    return "without idmapped mounts" in "".join(server.banner)


@pytest.fixture(scope="module")
def server(home: Path, idmapped_mounts: str) -> Iterator[ServeProcess]:
    with environment(
        HOME=str(home),
        MY_SERVICE_API_TOKEN="CANARY-ENV",
        HF_TOKEN="CANARY-HF",
        KEEP_ME_TOKEN="kept",
        MOCKSANDBOX_IDMAPPED_MOUNTS=idmapped_mounts,
    ):
        process = start_serve("--run-env-keep", "KEEP_ME_TOKEN", pid_namespace=True)
    # (With auto, whichever way this kernel allows: the banner says which; see the tests below.)
    if idmapped_mounts == "off" and os.geteuid() == 0:
        assert without_idmapped_mounts(process), process.banner
    yield process
    stop_serve(process.process)


def test_the_banner_says_what_is_in_force(server: ServeProcess) -> None:
    text = "".join(server.banner)
    assert "isolation: lite" in text and "own loopback only" in text
    assert "hidden from runs" in text and ".ssh" in text and "MY_SERVICE_API_TOKEN" in text
    assert "KEEP_ME_TOKEN" not in text


def test_a_run_is_root_only_in_a_user_namespace_of_its_own(server: ServeProcess) -> None:
    """In its world a run is root, as on SandboxFusion, and the image's files are root's (without
    idmapped mounts: nobody's, and read-only to it); on the host its processes are an unprivileged
    uid (the kernel says so: read from this side)."""
    run_uid = run_uid_of(server)
    assert run_uid != 0
    code = (
        "id -u; id -g; stat -c '%u %g' /usr/bin/env /etc; cat /proc/self/uid_map\n"
        "touch /usr/bin/planted-here 2>/dev/null && stat -c %u /usr/bin/planted-here || echo refused\n"
        "stat -c '%u %g' / .\n"
    )
    lines = stdout_of(server.run(code, language="bash")).splitlines()
    image, planted = "0 0", "0"
    if without_idmapped_mounts(server):
        nobody = Path("/proc/sys/kernel/overflowuid").read_text().strip()
        image, planted = f"{nobody} {Path('/proc/sys/kernel/overflowgid').read_text().strip()}", "refused"
    assert lines[:4] == ["0", "0", image, image]
    assert lines[4].split() == ["0", str(run_uid), "65536"]
    assert lines[5] == planted
    assert lines[6:] == ["0 0", "0 0"]  # its root and its dir are its own either way
    uids, gids = a_runs_ids_on_the_host(server)
    assert (uids.real, uids.effective, uids.saved) == (run_uid,) * 3
    assert (gids.real, gids.effective) == (run_uid,) * 2


def test_the_hosts_shadow_file_and_the_servers_keyrings_stay_out(server: ServeProcess) -> None:
    """The host's /etc/shadow is root's, and a run's root sees root's files as its own: the mask
    keeps it. The kernel's keyrings are not namespaced: the seccomp filter keeps them."""
    if not Path("/etc/shadow").read_text():
        pytest.skip("this host's /etc/shadow is empty: nothing to hide")
    canary = f"CANARY-KEYRING-{uuid.uuid4().hex}"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    # add_key(2) into this process's user keyring and session keyring, which the server (started by
    # this process, as the same user) shares.
    keys = [
        libc.syscall(
            _SYS_ADD_KEY, b"user", f"mocksandbox-{which}".encode(), canary.encode(), len(canary), which
        )
        for which in (_KEY_SPEC_USER_KEYRING, _KEY_SPEC_SESSION_KEYRING)
    ]
    assert all(key > 0 for key in keys), os.strerror(ctypes.get_errno())
    try:
        code = (
            "import ctypes, os\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "libc.syscall.restype = ctypes.c_long\n"
            "buffer = ctypes.create_string_buffer(256)\n"
            f"for key in {keys!r}:\n"
            f"    size = libc.syscall({_SYS_KEYCTL}, {_KEYCTL_READ}, key, buffer, 256)\n"
            "    print(size, os.strerror(ctypes.get_errno()), buffer.value.decode())\n"
            "print(repr(open('/etc/shadow').read()))\n"
            "print(open('/proc/self/status').read().split('Seccomp:')[1].split()[0])\n"
        )
        text = stdout_of(server.run(code))
    finally:
        for key in keys:
            libc.syscall(_SYS_KEYCTL, _KEYCTL_REVOKE, key)
    assert canary not in text
    assert text.splitlines() == ["-1 Operation not permitted ", "-1 Operation not permitted ", "''", "2"]


def test_a_run_makes_no_namespaces_and_mounts_nothing(server: ServeProcess) -> None:
    """The ways past a world into the kernel (new namespaces, mounts, modules) are refused, as
    Docker's default seccomp profile refuses them to SandboxFusion's runs; a new IPC namespace (the
    one ``unshare`` the filter lets through, for the relay) by the kernel, for want of
    ``CAP_SYS_ADMIN``."""
    code = (
        "import ctypes, os, subprocess\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for flag in (0x10000000, 0x00020000, 0x40000000, 0x08000000, 0x08000000 | 0x10000000):\n"
        "    print(libc.unshare(flag), os.strerror(ctypes.get_errno()))\n"
        "print(libc.mount(b'none', b'/mnt', b'tmpfs', 0, None), os.strerror(ctypes.get_errno()))\n"
        "print(subprocess.run(['unshare', '-r', 'true'], capture_output=True).returncode != 0)\n"
        "print(subprocess.run(['echo', 'a child'], capture_output=True, text=True).stdout.strip())\n"
    )
    assert stdout_of(server.run(code)).splitlines() == [
        *["-1 Operation not permitted"] * 6,
        "True",
        "a child",
    ]


def test_host_files_can_be_neither_changed_nor_planted(server: ServeProcess, visible_tmp_path: Path) -> None:
    tmp_path = visible_tmp_path
    canary = tmp_path / "canary"
    canary.write_text("keep me")
    tmp_path.chmod(0o755)  # (in the view of a run without idmapped mounts too, which is not root's)
    planted = [f"/etc/mocksandbox-planted-{os.getpid()}", f"/root/mocksandbox-planted-{os.getpid()}"]
    code = (
        "import os, shutil\n"
        f"print(open({str(canary)!r}).read())\n"  # (the canary is in the run's view)
        "def attempt(change, *args):\n"
        "    try:\n"
        "        change(*args)\n"
        "    except OSError as error:\n"
        "        print(type(error).__name__)\n"
        f"attempt(os.remove, {str(canary)!r})\n"
        f"shutil.rmtree({str(tmp_path)!r}, ignore_errors=True)\n"
        f"for path in {planted!r}: attempt(lambda: open(path, 'w').write('x'))\n"
        "open('/tmp/left-by-a-run', 'w').write('x')\n"
        f"print(os.path.exists({str(canary)!r}), all(os.path.exists(p) for p in {planted!r}))"
    )
    answer = server.run(code, files={"/opt/planted-by-files": base64.b64encode(b"x").decode()})
    # Changed in its own view, copy-on-write; without idmapped mounts the host root's files and
    # dirs are nobody's to it, and the kernel refuses even that (but in /root, where a root
    # server's Python is, whose way is the run root's then, as the idmapped view shows it).
    lines = stdout_of(answer).splitlines()
    if without_idmapped_mounts(server):
        assert lines[:3] == ["keep me", "PermissionError", "PermissionError"], answer
        assert lines[-1] == "True False", answer
    else:
        assert lines == ["keep me", "False True"], answer
    assert canary.read_text() == "keep me"
    assert not any(os.path.exists(path) for path in [*planted, "/opt/planted-by-files"])
    # A later run sees nothing an earlier one wrote, in /tmp or anywhere.
    later = server.run(
        f"import os\nprint(os.path.exists('/tmp/left-by-a-run'), os.path.exists({planted[0]!r}))"
    )
    assert stdout_of(later) == "False False\n"


def test_absolute_files_and_fetch_files_round_trip_in_the_runs_view(server: ServeProcess) -> None:
    code = (
        "import os\n"
        "data = open('/data/in.txt').read()\n"
        "os.makedirs('/results', exist_ok=True)\n"
        "open('/results/out.txt', 'w').write(data.upper())\n"
        "os.symlink('/results/out.txt', 'link.txt')\n"
        "open('relative.txt', 'w').write('here')\n"
    )
    answer = server.run(
        code,
        files={"/data/in.txt": base64.b64encode(b"hello").decode()},
        fetch_files=["/results/out.txt", "link.txt", "relative.txt", "/data/in.txt", "/results/missing"],
    )
    files = {name: base64.b64decode(value) for name, value in answer["files"].items()}  # type: ignore[union-attr]
    assert files == {
        "/results/out.txt": b"HELLO",
        "link.txt": b"HELLO",  # followed in the run's view, not the host's
        "relative.txt": b"here",
        "/data/in.txt": b"hello",
    }
    assert not os.path.exists("/results/out.txt") and not os.path.exists("/data/in.txt")


def test_secrets_stay_out(server: ServeProcess, home: Path) -> None:
    code = (
        "import os, glob\n"
        f"print(sorted(os.listdir({str(home / '.ssh')!r})), sorted(os.listdir({str(home / '.aws')!r})))\n"
        f"print(repr(open({str(home / '.netrc')!r}).read()))\n"
        "print(sorted(k for k in os.environ if 'TOKEN' in k))\n"
    )
    out = stdout_of(server.run(code))
    assert "CANARY" not in out
    assert out.splitlines() == ["[] []", "''", "['KEEP_ME_TOKEN']"]
    # fetch_files reads what the run sees, so it cannot read them either.
    answer = server.run("pass", fetch_files=[str(home / ".ssh" / "id_ed25519"), str(home / ".netrc")])
    assert answer["files"] == {str(home / ".netrc"): ""}


def test_no_host_loopback_service_nor_the_control_api_is_reachable(server: ServeProcess) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    api_port = int(server.url.rsplit(":", 1)[1])
    try:
        code = (
            "import socket\n"
            f"for port in ({port}, {api_port}):\n"
            "    try:\n"
            "        socket.create_connection(('127.0.0.1', port), timeout=2).close(); print('reached')\n"
            "    except OSError as error: print(type(error).__name__)\n"
            "try:\n"
            "    socket.create_connection(('192.0.2.1', 80), timeout=2); print('reached')\n"
            "except OSError as error: print(type(error).__name__)\n"
        )
        out = stdout_of(server.run(code))
    finally:
        listener.close()
    assert out.splitlines() == ["ConnectionRefusedError", "ConnectionRefusedError", "OSError"]


def test_a_run_serves_and_reaches_its_own_ports_and_two_runs_bind_one_port(server: ServeProcess) -> None:
    # SandboxFusion's test_isolation_network_server_port_conflict, in substance: both at once.
    code = (
        "import socket, socketserver, threading, time, urllib.request, http.server\n"
        "class Handler(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers(); self.wfile.write(b'special string')\n"
        "    def log_message(self, *args): pass\n"
        "server = socketserver.TCPServer(('', 18123), Handler)\n"
        "threading.Thread(target=server.serve_forever, daemon=True).start()\n"
        "time.sleep(0.5)\n"
        "for host in ('127.0.0.1', 'localhost'):\n"
        "    print(urllib.request.urlopen(f'http://{host}:18123', timeout=5).read().decode())\n"
    )
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: server.run(code), range(2)))
    for answer in answers:
        assert stdout_of(answer) == "special string\nspecial string\n", answer
    # And again at once: the port an earlier run served on is free for the next.
    assert stdout_of(server.run(code)) == "special string\nspecial string\n"


def test_a_run_sees_and_signals_only_its_own_processes(server: ServeProcess) -> None:
    code = (
        "import os, signal\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "print(pids[0], os.getpid() in pids, len(pids) < 5)\n"
        "try:\n"
        "    os.kill(1, signal.SIGKILL)\n"
        "except PermissionError:\n"
        "    pass  # (a relay that is the host's root: runs without idmapped mounts)\n"
        "try:\n"
        "    os.kill(-1, signal.SIGKILL)\n"
        "except ProcessLookupError:\n"
        "    pass  # nothing else to signal\n"
        "print('still here')\n"
    )
    assert stdout_of(server.run(code)) == "1 True True\nstill here\n"
    answer = server.run("pkill -9 -f mocksandbox; pkill -9 python; kill -9 -1; echo done", language="bash")
    assert server.process.poll() is None
    assert requests.get(f"{server.url}/v1/ping", timeout=10, proxies=NO_PROXY).status_code == 200
    assert answer["run_result"] is not None
    # The relay (PID 1 of the run's namespace) is out of a run's reach: no /proc/1/root, no environ.
    code = (
        "for path in ('/proc/1/root/etc/hostname', '/proc/1/environ'):\n"
        "    try:\n"
        "        open(path).read(); print('read')\n"
        "    except OSError as error: print(type(error).__name__)\n"
    )
    assert stdout_of(server.run(code)) == "PermissionError\nPermissionError\n"


def test_a_root_program_cannot_reach_the_host_through_devices_mounts_or_the_kernel(
    server: ServeProcess,
) -> None:
    code = (
        "import os, subprocess\n"
        "print(sorted(os.listdir('/dev')))\n"
        "for command in (['mount', '-t', 'tmpfs', 'x', '/mnt'], ['mknod', '/tmp/disk', 'b', '8', '0'],\n"
        "                ['sh', '-c', 'echo 1 > /proc/sys/vm/drop_caches'], ['chroot', '/', 'true'],\n"
        "                ['sh', '-c', 'echo 0 > /sys/kernel/profiling']):\n"
        "    print(subprocess.run(command, capture_output=True).returncode != 0)\n"
        "print(not os.path.exists('/proc/sysrq-trigger') or open('/proc/sysrq-trigger').read() == '')\n"
    )
    lines = stdout_of(server.run(code)).splitlines()
    assert eval(lines[0]) == sorted(
        [
            "fd",
            "full",
            "mqueue",
            "null",
            "ptmx",
            "pts",
            "random",
            "shm",
            "stderr",
            "stdin",
            "stdout",
            "tty",
            "urandom",
            "zero",
        ]
    )
    assert lines[1:] == ["True"] * 6


def test_fork_bomb_and_memory_hog_leave_the_server_answering(server: ServeProcess) -> None:
    bomb = server.run(":(){ :|:& };:", language="bash", run_timeout=2)
    assert bomb["run_result"] is not None
    hog = server.run("x = bytearray(8 * 1024**3)\nprint('survived')", run_timeout=10)
    assert hog["status"] == "Failed"
    assert stdout_of(server.run("print('alive')")) == "alive\n"


def test_a_server_killed_with_sigkill_starts_again_and_answers_its_first_run(
    tmp_path: Path, idmapped_mounts: str
) -> None:
    """A server killed with SIGKILL leaves its cgroups and its runs' tmpfs; the next one, with the
    same pid (PID 1 of its namespace, as in every container), steps around or reclaims them."""
    with environment(MOCKSANDBOX_IDMAPPED_MOUNTS=idmapped_mounts):
        first = start_serve(pid_namespace=True, runs_dir=tmp_path)
    try:
        assert stdout_of(first.run("print(1)")) == "1\n"
    finally:
        os.killpg(first.process.pid, signal.SIGKILL)
        first.process.wait()
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith("mocksandbox-")]
    with environment(MOCKSANDBOX_IDMAPPED_MOUNTS=idmapped_mounts):
        second = start_serve(pid_namespace=True, runs_dir=tmp_path)
    try:
        assert stdout_of(second.run("print(2)")) == "2\n"
        assert stdout_of(second.run("print(3)", language="python")) == "3\n"
        # What the first one left was reclaimed at start.
        assert not any(os.path.ismount(path) for path in leftovers)
    finally:
        stop_serve(second.process)
    deadline = time.monotonic() + 10
    while any(os.path.ismount(p) for p in tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in tmp_path.iterdir() if os.path.ismount(p)] == []


def test_isolation_none_is_todays_behaviour(tmp_path: Path) -> None:
    server = start_serve("--isolation", "none", pid_namespace=True)
    marker = tmp_path / "written-by-a-run"
    try:
        assert "isolation: none" in "".join(server.banner)
        server.run(f"open({str(marker)!r}, 'w').write('x')")
    finally:
        stop_serve(server.process)
    assert marker.read_text() == "x"


def test_a_killed_server_leaves_no_program_running(tmp_path: Path, idmapped_mounts: str) -> None:
    """The relay of a world is PID 1 of the run's namespace and watches the server: when the server
    dies mid-run (SIGKILL, the OOM killer), the run's processes die with it."""
    with environment(MOCKSANDBOX_IDMAPPED_MOUNTS=idmapped_mounts):
        server = start_serve()
    marker = f"{os.getpid()}{time.monotonic_ns() % 10**6}"
    code = f"import subprocess, time\nsubprocess.Popen(['sleep', '300.{marker}'])\ntime.sleep(300)"
    pool = ThreadPoolExecutor(1)
    try:
        pool.submit(
            lambda: requests.post(
                f"{server.url}/run_code",
                json={"code": code, "language": "python"},
                proxies=NO_PROXY,
                timeout=30,
            )
        )
        deadline = time.monotonic() + 20
        while not processes_with(f"300.{marker}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(f"300.{marker}"), "the program did not start"
    finally:
        server.process.kill()
        server.process.wait()
        pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + 10
    while processes_with(f"300.{marker}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(f"300.{marker}") == []


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def test_what_servers_keep_in_the_temp_root_is_hidden_even_when_made_later(server: ServeProcess) -> None:
    """State dirs, control sockets, shared counters and kernels' connection files of every server
    (``<tmp>/mocksandbox-*``), those made after the server started too, are not in a run's view: in
    /tmp, which a run finds empty, not at all (elsewhere, a ``tmp_root`` of a run's view, they look
    empty: the mask's ``hide_prefixed``)."""
    later = Path(tempfile.mkdtemp(prefix="mocksandbox-made-later-"))
    try:
        (later / "secret").write_text("CANARY")
        code = (
            "import os, tempfile\n"
            "root = tempfile.gettempdir()\n"
            "names = [n for n in os.listdir(root) if n.startswith('mocksandbox-')]\n"
            "def empty(path):  # a dir with nothing in it, or a file with nothing in it (a lock)\n"
            "    return os.listdir(path) == [] if os.path.isdir(path) else os.path.getsize(path) == 0\n"
            f"print({later.name!r} in names, all(empty(os.path.join(root, n)) for n in names))\n"
        )
        assert stdout_of(server.run(code)) == "False True\n"
        answer = server.run("pass", fetch_files=[str(later / "secret")])
        assert answer["files"] == {}
    finally:
        shutil.rmtree(later)


def test_tmp_and_run_start_empty_and_runs_leave_nothing(server: ServeProcess) -> None:
    """Nothing of the host's /tmp and /run nor of an earlier run in a run's view, with idmapped
    mounts and without (see :func:`serve_process.assert_runs_start_apart`)."""
    assert_runs_start_apart(server)


def _swedev(server: ServeProcess, endpoint: str, **payload: object) -> dict[str, object]:
    response = requests.post(f"{server.url}/{endpoint}", json=payload, timeout=300, proxies=NO_PROXY)
    assert response.status_code == 200, response.text
    answer: dict[str, object] = response.json()
    return answer


def test_swedev_sessions_run_in_worlds_of_their_own(
    server: ServeProcess, visible_tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A session's commands: the host untouched, secrets and the API out of reach, no signal to
    the server; what a command writes outside /workspace stays for the session's next commands
    only; scoring still works."""
    from mocksandbox.sessions import InstanceRegistry
    from mocksandbox.sessions.scripted import diff_block, function_call

    assert "swedev isolation: a world per session" in "".join(server.banner)
    instance = next(
        i for i in InstanceRegistry.from_paths([]).all() if i.instance_id == "sciutils__unitconv-311"
    )
    canary = visible_tmp_path / "canary"
    canary.write_text("keep me")
    # Written outside /workspace, in the session's layer: in the image's /etc, or (without idmapped
    # mounts, where the host root's dirs are read-only to a command) in its root, which is its own.
    planted = f"/etc/mocksandbox-session-{os.getpid()}"
    if without_idmapped_mounts(server):
        planted = f"/mocksandbox-session-{os.getpid()}"
    api_port = int(server.url.rsplit(":", 1)[1])

    def bash(sid: object, command: str) -> str:
        content = function_call("execute_bash", command=command)
        return str(_swedev(server, "process_action", sid=sid, content=content)["content"])

    first = _swedev(server, "start_instance", instance_hash=str(instance.instance_hash))["sid"]
    second = _swedev(server, "start_instance", instance_hash=str(instance.instance_hash))["sid"]
    request.addfinalizer(lambda: os.path.exists(planted) and os.remove(planted))  # were it to escape
    out = bash(
        first,
        f"rm -f {canary}; echo planted > {planted}; cat ~/.ssh/id_ed25519; "
        f"(exec 3<>/dev/tcp/127.0.0.1/{api_port}) 2>/dev/null && echo api-reached; "
        "kill -9 -1; echo after-kill",
    )
    assert "CANARY" not in out and "api-reached" not in out, out
    assert canary.read_text() == "keep me" and not os.path.exists(planted)
    assert server.process.poll() is None
    # The command's own shells are all that kill -1 reaches: the outer one (the run's program, the
    # inner one's parent) dies of it, and the relay then ends the rest, the inner shell too, racing
    # its echo; the session itself answers its next command (below).
    assert out.endswith("[Command finished with exit code -9]"), out
    kept = bash(first, f"cat {planted}; pwd")
    assert kept.split("\n")[1:3] == ["planted", instance.workspace_path], (
        "the session's layer keeps its writes"
    )
    assert "No such file" in bash(second, f"cat {planted}"), "another session sees none of them"
    # The gold patch, applied by the model, scores 1.0 with the tests run in a world.
    _swedev(server, "process_action", sid=first, content=diff_block(instance.patch))
    _swedev(server, "postprocess", sid=first)
    reward = _swedev(server, "compute_reward", sid=first)
    assert reward["reward"] == 1.0, reward
    assert not os.path.exists(planted)


def test_jupyter_kernels_run_in_worlds_of_their_own(
    server: ServeProcess, visible_tmp_path: Path, home: Path
) -> None:
    """A kernel's cells: the host untouched, secrets, host services and the API out of reach, no
    signal to the server; ``files`` and ``fetch_files`` (absolute names, links) in its view."""
    if "jupyter: off" in "".join(server.banner):
        pytest.skip("no ipykernel for the server's interpreter")
    canary = visible_tmp_path / "canary"
    canary.write_text("keep me")
    visible_tmp_path.chmod(0o755)  # (in the view of a run without idmapped mounts too, not root's)
    planted = f"/etc/mocksandbox-kernel-{os.getpid()}"
    api_port = int(server.url.rsplit(":", 1)[1])
    cells = [
        # (Changed in its own view, copy-on-write; without idmapped mounts the host root's files are
        # nobody's to it, and the kernel refuses even that.)
        "import os, signal, socket\n"
        "def attempt(change):\n"
        "    try:\n"
        "        change()\n"
        "    except PermissionError:\n"
        f"        assert {without_idmapped_mounts(server)!r}\n"
        f"attempt(lambda: os.remove({str(canary)!r}))\n"
        f"attempt(lambda: open({planted!r}, 'w').write('x'))\n"
        "print(os.getcwd().startswith('/tmp/tmp'), sorted(int(p) for p in os.listdir('/proc') if p.isdigit())[:2])",
        f"print(os.listdir({str(home / '.ssh')!r}))\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {api_port}), timeout=2); print('reached')\n"
        "except OSError as error: print(type(error).__name__)",
        "try:\n"
        "    os.kill(-1, signal.SIGKILL)\n"
        "except ProcessLookupError:\n"
        "    pass  # nothing else to signal\n"
        "print(open('in.txt').read(), open('/data/in.txt').read())\n"
        "os.makedirs('/results', exist_ok=True)\n"
        "open('/results/out.txt', 'w').write('out')\n"
        f"os.symlink({str(home / '.netrc')!r}, 'key')",
    ]
    files = {"in.txt": base64.b64encode(b"rel").decode(), "/data/in.txt": base64.b64encode(b"abs").decode()}
    try:
        response = requests.post(
            f"{server.url}/run_jupyter",
            json={
                "cells": cells,
                "files": files,
                "fetch_files": ["/results/out.txt", "key", "in.txt", "nothing"],
            },
            timeout=120,
            proxies=NO_PROXY,
        )
        answer = response.json()
        assert answer["status"] == "Success", answer
        outputs = [cell["stdout"] for cell in answer["cells"]]
        assert outputs == ["True [1, 2]\n", "[]\nConnectionRefusedError\n", "rel abs\n"], answer["cells"]
        fetched = {name: base64.b64decode(value) for name, value in answer["files"].items()}
        assert fetched == {"/results/out.txt": b"out", "key": b"", "in.txt": b"rel"}
        assert canary.read_text() == "keep me"
        assert not os.path.exists(planted) and not os.path.exists("/data/in.txt")
        assert server.process.poll() is None
    finally:
        if os.path.exists(planted):  # were it to escape
            os.remove(planted)


def test_a_jupyter_kernel_is_root_only_in_a_user_namespace_of_its_own(server: ServeProcess) -> None:
    """Kernels are runs too: root in their world, the runs' unprivileged uid on the host."""
    if "jupyter: off" in "".join(server.banner):
        pytest.fail("no ipykernel for the server's interpreter: make test installs the jupyter extra")
    cells = ["import os\nprint(os.getuid(), open('/proc/self/uid_map').read().split()[:2])"]
    response = requests.post(
        f"{server.url}/run_jupyter", json={"cells": cells}, timeout=120, proxies=NO_PROXY
    )
    answer = response.json()
    assert answer["status"] == "Success", answer
    uid, inside, outside = re.findall(r"\d+", answer["cells"][0]["stdout"])
    assert (uid, inside) == ("0", "0")
    assert outside == str(run_uid_of(server))


def test_a_killed_kernels_fork_server_leaves_no_kernel_running(idmapped_mounts: str) -> None:
    """A kernel's world hangs from a child of the kernels' fork server (the zygote) that joined the
    runs' user namespace (without idmapped mounts: from the world's PID 1, the host's root, whose
    kernel joins it): when the zygote is killed mid-cell, that child, its world and the kernel
    die too (their parent-death signals are set after the change of credentials that clears them)."""
    with environment(MOCKSANDBOX_IDMAPPED_MOUNTS=idmapped_mounts):
        server = start_serve(pid_namespace=True)
    pool = ThreadPoolExecutor(1)
    try:
        if "jupyter: off" in "".join(server.banner):
            pytest.fail("no ipykernel for the server's interpreter: make test installs the jupyter extra")
        marker = f"300.{uuid.uuid4().int % 10**9}"  # (sleep's argument: a number, and this test's own)
        cells = [f"import subprocess, time\nsubprocess.Popen(['sleep', '{marker}'])\ntime.sleep(120)"]
        pool.submit(
            requests.post, f"{server.url}/run_jupyter", json={"cells": cells}, timeout=150, proxies=NO_PROXY
        )
        deadline = time.monotonic() + 60
        while not processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(marker), "the kernel's program did not start"
        tree = psutil.Process(server.process.pid).children(recursive=True)
        forks = {p.pid for p in tree if "_zygote.py" in " ".join(p.cmdline())}
        zygotes = [p for p in tree if p.pid in forks and p.ppid() not in forks]
        assert zygotes, "no kernels' fork server under the server"
        for zygote in zygotes:
            zygote.kill()
        deadline = time.monotonic() + 10
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(marker) == []
    finally:
        stop_serve(server.process)
        pool.shutdown(wait=False, cancel_futures=True)
