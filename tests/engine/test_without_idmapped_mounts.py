"""A root server's runs without idmapped mounts: what ``auto`` does where the kernel refuses them
(tmpfs before Linux 6.3; overlayfs, 9p, virtiofs, NFS on 6.1), what it says, and what it leaves.

The protections themselves are proved on this path by the suites the engine fixtures run it in
(``-noidmap``: tests/engine/test_hostile.py, test_kept_root.py, test_ipc_namespaces.py), by
tests/server/test_isolation.py (``idmapped-mounts-off``) and by the ``root-without-idmap`` host
shape (tests/server/test_host_shapes.py). Here: the way there, and that nothing is left after.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mocksandbox.core import MockSandbox
from mocksandbox.execution import engine as engine_module
from mocksandbox.execution.confinement import CgroupConfinement
from mocksandbox.execution.engine import IsolationError, why_no_idmapped_mounts
from mocksandbox.execution.process import CommandSpec
from mocksandbox.execution.protections import protections
from mocksandbox.execution.world import lite_unavailable_reason
from mocksandbox.models import CommandRunResult, CommandRunStatus, RunCodeRequest
from mocksandbox.settings import load_settings

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0, reason="idmapped mounts are a root server's: nothing to do without"
    ),
    pytest.mark.skipif(lite_unavailable_reason() is not None, reason=str(lite_unavailable_reason())),
]

#: What the launcher says where the kernel refuses an idmapped mount of the runs' tmpfs (Linux 6.1).
REFUSED = (
    "mocksandbox launcher: cannot make the runs' user namespace: [Errno 22] this kernel's tmpfs refuses "
    "idmapped mounts (/tmp/mocksandbox-0123456789ab: Invalid argument) | None"
)


def run(box: MockSandbox, code: str, language: str = "bash") -> str:
    answer = box.engine.run_code(RunCodeRequest(code=code, language=language))  # type: ignore[arg-type]
    assert answer.run_result is not None and answer.run_result.return_code == 0, answer
    return answer.run_result.stdout or ""


def test_what_refused_them_is_said_in_short() -> None:
    assert why_no_idmapped_mounts(IsolationError(REFUSED)) == (
        "this kernel's tmpfs refuses them (/tmp/mocksandbox-0123456789ab: Invalid argument)"
    )
    assert (
        why_no_idmapped_mounts(IsolationError("no such thing")) == "their start-up run failed: no such thing"
    )


def test_a_refused_idmapped_mount_gives_runs_their_uid_all_the_same(tmp_path: Path) -> None:
    """A real refusal: the server's temp dir on a ramfs, which no kernel idmaps. ``doctor`` (in a
    mount namespace of its own, where that ramfs is mounted) says runs are their uid without
    idmapped mounts, which file system refused, and that the start-up run proved it."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) (util-linux) is needed to mount a ramfs out of this machine's sight")
    temp = tmp_path / "ramfs"
    temp.mkdir()
    script = f'mount -t ramfs -o mode=1777 none {temp} && exec "$@"'
    doctor = [sys.executable, "-m", "mocksandbox.cli", "doctor"]
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh", *doctor],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "TMPDIR": str(temp), "MOCKSANDBOX_IDMAPPED_MOUNTS": "auto"},
    )
    row = next((line for line in done.stdout.splitlines() if line.startswith("non-root uid")), "")
    assert row.split()[2] == "yes", done.stdout + done.stderr
    refused = re.search(r"without idmapped mounts: this kernel's (\S+) refuses them \((.+?): [^()]+\); ", row)
    assert refused is not None, row
    # The ramfs, or what the kernel refused before it: the root file system, on a kernel before 6.3
    # whose root is 9p or overlayfs (a VM's, a container's).
    assert refused.groups() == ("ramfs", str(temp)) or refused.group(2) == "/", row
    assert "host files owned by others are read-only to runs" in row
    assert "WARNING" not in done.stdout + done.stderr  # not the host's root: nothing missing


def test_runs_are_the_hosts_root_only_where_neither_way_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where runs cannot be their uid with idmapped mounts nor without, ``auto`` falls back to the
    host's root, with the warning and the reasons, as before; where only the first fails, not."""
    real_start = engine_module._start_lite
    tries: list[tuple[bool, str]] = []

    def refusing(*args: object, **kwargs: object) -> object:
        as_user, without_idmap = (
            bool(args[4]),
            str(args[6] if len(args) > 6 else kwargs.get("without_idmap", "")),
        )
        tries.append((as_user, without_idmap))
        if as_user and (not without_idmap or refuse_without):
            raise IsolationError(REFUSED if not without_idmap else "the second way failed too")
        return real_start(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine_module, "_start_lite", refusing)
    settings = load_settings(overrides={"tmp_root": str(tmp_path), "isolation": "lite"})
    refuse_without = False
    box = MockSandbox.create(settings)
    try:
        isolation = box.engine.isolation
        assert isolation.run_uid is not None and not isolation.missing()
        assert isolation.without_idmapped_mounts.startswith("this kernel's tmpfs refuses them")
        row = next(row for row in protections(isolation, box.confinement) if row.name == "non-root uid")
        assert row.holds == "yes" and "this kernel's tmpfs refuses them" in row.how
        assert run(box, "id -u; stat -c %u /etc") == f"0\n{Path('/proc/sys/kernel/overflowuid').read_text()}"
    finally:
        box.close()
    assert [without for _, without in tries] == ["", isolation.without_idmapped_mounts]
    tries.clear()
    refuse_without = True
    box = MockSandbox.create(settings)
    try:
        isolation = box.engine.isolation
        assert isolation.run_uid is None and [as_user for as_user, _ in tries] == [True, True, False]
        assert "the second way failed too" in isolation.run_as_reason
        assert "(without idmapped mounts: this kernel's tmpfs refuses them" in isolation.run_as_reason
        (missing,) = isolation.missing()
        assert missing.startswith("an unprivileged uid: runs are the host's root")
    finally:
        box.close()


def _mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as mountinfo:
        return [line.split()[4] for line in mountinfo if line.split()[4].startswith(str(path))]


def _our_cgroups() -> list[str]:
    """This process's cgroups (a server's are named ``mocksandbox-<its pid>-...``), v1 and v2."""
    return sorted(glob.glob(f"/sys/fs/cgroup/**/mocksandbox-{os.getpid()}-*", recursive=True))


def test_nothing_is_left_once_the_server_is_closed(tmp_path: Path) -> None:
    """Runs in every kind of world (a layered root, a kept one, files outside the run's dir and
    fetched back, a run that makes its dir unreadable, one timed out) and then the server closed:
    no mount, no dir in its temp root, no cgroup, no process of it."""
    before = _our_cgroups()
    confinement = "cgroup" if CgroupConfinement.available() else "process-group"
    settings = load_settings(
        overrides={
            "tmp_root": str(tmp_path),
            "isolation": "lite",
            "idmapped_mounts": "off",
            "confinement": confinement,
        }
    )
    box = MockSandbox.create(settings)
    try:
        assert box.engine.isolation.without_idmapped_mounts
        for _ in range(3):
            run(box, "print('kept')", language="python")
        answer = box.engine.run_code(
            RunCodeRequest(
                code="import os\nos.makedirs('/results')\nopen('/results/out', 'w').write('x')\n"
                "os.makedirs('deep/er')\nos.chmod('deep', 0)\nos.chmod('.', 0)",
                language="python",
                files={"/data/in.txt": "eA=="},
                fetch_files=["/results/out", "/data/in.txt"],
            )
        )
        assert answer.files == {"/results/out": "eA==", "/data/in.txt": "eA=="}, answer
        timed_out = box.engine.run_code(
            RunCodeRequest(
                code="sleep 30 & mkdir -p a/b && chmod 0 a && sleep 30", language="bash", run_timeout=1
            )
        )
        assert timed_out.run_result is not None
        assert timed_out.run_result.status == CommandRunStatus.TimeLimitExceeded
        assert _mounts_under(tmp_path), "the runs' tmpfs was not in this mount table"
    finally:
        box.close()
    assert _mounts_under(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert _our_cgroups() == before
    leftovers = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            if str(tmp_path) in os.readlink(f"/proc/{pid}/cwd") + os.readlink(f"/proc/{pid}/root"):
                leftovers.append(pid)
        except OSError:
            continue
    assert leftovers == [], textwrap.shorten(str(leftovers), 200)


@pytest.mark.parametrize(
    "settings", [{"idmapped_mounts": "off"}, {"run_as": "root"}], ids=["noidmap", "root"]
)
def test_a_link_a_command_left_on_the_way_to_a_bound_dir_leads_nowhere(
    tmp_path: Path, settings: dict[str, str]
) -> None:
    """A session's layer outlives its commands, and its dirs are bound into it at each command. A
    command that leaves a link on the way to a bound dir must not lead the next command's relay,
    the host's root here, to make that dir (and mount on it) where the link points on the host."""
    box = MockSandbox.create(
        load_settings(overrides={"tmp_root": str(tmp_path), "isolation": "lite", **settings})
    )
    escaped = Path(f"/etc/mocksandbox-escaped-{os.getpid()}")
    try:
        layer, bound = tmp_path / "layer", tmp_path / "bound"
        for path in (layer / "u", layer / "w", bound):
            path.mkdir(parents=True)
        owner = box.engine.isolation.run_owner()
        if owner is not None:
            owner.give_tree(str(bound))
        world = {
            "upper": str(layer / "u"),
            "work": str(layer / "w"),
            "lowers": [],
            "binds": [[str(bound), f"/x/y/{escaped.name}"]],
        }

        def command(line: str) -> CommandRunResult:
            spec = CommandSpec(line, "/", box.engine._base_env, None, 30.0, world=world)
            return box.engine.runner.run(spec)

        planted = command("mv /x /x2 && mkdir /x && ln -s /etc /x/y && echo planted")
        assert planted.stdout == "planted\n", planted
        after = command("echo ran")
        assert not escaped.exists()
        assert after.status == CommandRunStatus.Error and "not a dir on the way to a bound dir: /x/y" in (
            after.stderr or ""
        ), after
    finally:
        box.close()
        if escaped.is_dir():
            escaped.rmdir()
