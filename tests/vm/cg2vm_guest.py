"""The guest's side of ``tests/vm``: run inside the cgroup v2 guest (``run-in-cgroup2-vm.sh``) by the
project's venv Python, as root, from the checkout's root. Standard library only, but for the
pytest it runs.

    python tests/vm/cg2vm_guest.py --out DIR [--unit-parent CGROUP] [--doctor] [--env K=V ...] \\
        -- PYTEST ARGS...

In order: the guest's facts (kernel, cgroups, uptime at start: the boot), the cold import of the
package, a snapshot of what is in ``/tmp``, ``/sys/fs/cgroup``, the mount table and the process
table; ``mocksandbox doctor`` (with ``--doctor``); pytest with ``cg2vm_report`` (its reports to
``DIR/results.jsonl``, JUnit to ``DIR/junit.xml``, its output to ``DIR/pytest.log`` and stdout);
then what is left (after up to 15 s for the kernel to reap) beyond the first snapshot, and the
kernel's OOM lines. All of it goes to ``DIR/summary.json``; the exit status is pytest's.

``--unit-parent`` (a cgroup dir, e.g. ``/sys/fs/cgroup/system.slice``): servers and ``doctor`` are
started alone in a fresh ``mocksandbox-test-<n>.service`` there (``systemd``'s ``Delegate=yes``
shape; see ``cg2vm_report.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: pytest's temp dirs in the guest: removed after the run, never counted as left behind.
BASETEMP = Path("/tmp/cg2vm-pytest")
#: What the guest's own set-up keeps in /tmp, and pytest's own temp dirs.
TMP_EXPECTED = {BASETEMP.name}


def uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def read(path: str | Path) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as error:
        return f"({error.strerror})"


def own_cgroup() -> str:
    return read("/proc/self/cgroup").split("::", 1)[-1]


def processes() -> dict[int, str]:
    """Every process with a command line (not kernel threads): pid to command line."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if cmdline:
            found[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return pids | {1}


def snapshot() -> dict[str, Any]:
    cgroups = sorted(str(Path(d).relative_to(CGROUP_ROOT)) for d, _, _ in os.walk(CGROUP_ROOT))
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        mounts.append(f"{fields[4]} ({fstype})")
    return {
        "tmp": sorted(os.listdir("/tmp")),
        "cgroups": cgroups,
        "mounts": mounts,
        "processes": processes(),
    }


def left_behind(before: dict[str, Any], within: float = 15.0) -> dict[str, Any]:
    """What is there now and was not before (processes: but for this one and its ancestors),
    waiting up to ``within`` seconds for it to go."""
    mine = ancestors()
    deadline = time.monotonic() + within
    while True:
        after = snapshot()
        left = {
            "tmp": [p for p in after["tmp"] if p not in before["tmp"] and p not in TMP_EXPECTED],
            "cgroups": [c for c in after["cgroups"] if c not in before["cgroups"]],
            "mounts": [m for m in after["mounts"] if m not in before["mounts"]],
            "processes": [
                f"{pid}: {cmd}"
                for pid, cmd in after["processes"].items()
                if pid not in before["processes"] and pid not in mine
            ],
        }
        if not any(left.values()) or time.monotonic() >= deadline:
            return left
        time.sleep(0.5)


class MemorySampler(threading.Thread):
    """The guest's peak memory in use (MemTotal - MemAvailable), sampled every half second."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_mib = 0
        self.total_mib = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            info = dict(
                (line.split(":")[0], int(line.split()[1]))
                for line in Path("/proc/meminfo").read_text().splitlines()
            )
            self.total_mib = info["MemTotal"] // 1024
            self.peak_mib = max(self.peak_mib, (info["MemTotal"] - info["MemAvailable"]) // 1024)
            self._stop_event.wait(0.5)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def in_unit(command: list[str], parent: Path | None) -> tuple[list[str], Path | None]:
    if parent is None:
        return command, None
    unit = parent / f"mocksandbox-test-{uuid.uuid4().hex[:8]}.service"
    script = 'mkdir "$1" && echo $$ > "$1/cgroup.procs" && shift && exec "$@"'
    return ["/bin/sh", "-c", script, "sh", str(unit), *command], unit


def run_doctor(env: dict[str, str], parent: Path | None) -> dict[str, Any]:
    command, unit = in_unit([sys.executable, "-m", "mocksandbox.cli", "doctor"], parent)
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if unit is not None:
        try:
            unit.rmdir()
        except OSError:
            pass
    rows = dict(re.findall(r"^([a-z][a-z -]+?)\s{2,}(yes|partly|no)\s", done.stdout, re.M))
    return {
        "seconds": round(time.monotonic() - start, 1),
        "returncode": done.returncode,
        "rows": rows,
        "output": done.stdout + done.stderr,
    }


def run_pytest(args: list[str], out: Path, env: dict[str, str]) -> int:
    # pytest.main in a child of its own, so that whatever it leaves is seen once it has gone;
    # the plugin by object (no PYTHONPATH that servers and their runs would inherit).
    bootstrap = (
        "import sys; sys.path.insert(0, sys.argv[1]); import cg2vm_report, pytest; "
        "sys.exit(pytest.main(sys.argv[2:], plugins=[cg2vm_report]))"
    )
    command = [
        sys.executable,
        "-c",
        bootstrap,
        str(HERE),
        "-p",
        "no:cacheprovider",
        f"--basetemp={BASETEMP}",
        f"--junitxml={out / 'junit.xml'}",
        "--durations=0",
        *args,
    ]
    with open(out / "pytest.log", "w", encoding="utf-8") as log:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**env, "CG2VM_REPORT": str(out / "results.jsonl")},
        )
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            log.flush()
            sys.stdout.write(line)
            sys.stdout.flush()
        return process.wait()


def oom_lines() -> list[str]:
    done = subprocess.run(["dmesg"], capture_output=True, text=True)
    return [
        line
        for line in done.stdout.splitlines()
        if "oom-kill:" in line or "Out of memory" in line or "invoked oom-killer" in line
    ]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--unit-parent", type=Path)
    parser.add_argument("--doctor", action="store_true")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    pytest_args = options.pytest_args[1:] if options.pytest_args[:1] == ["--"] else options.pytest_args
    out: Path = options.out
    summary: dict[str, Any] = {
        "uptime_at_start": uptime(),
        "kernel": os.uname().release,
        "cgroup": own_cgroup(),
        "root_subtree_control": read(CGROUP_ROOT / "cgroup.subtree_control"),
        "cgroup_mount": next(
            (line for line in read("/proc/self/mounts").splitlines() if " /sys/fs/cgroup " in line), None
        ),
        "root_fs": next(
            (line.split()[2] for line in read("/proc/self/mounts").splitlines() if line.split()[1] == "/"),
            None,
        ),
        "tmp_fs": next(
            (line.split()[2] for line in read("/proc/self/mounts").splitlines() if line.split()[1] == "/tmp"),
            "(on /)",
        ),
        "cpus": os.cpu_count(),
    }

    def save() -> None:
        (out / "summary.json").write_text(json.dumps(summary, indent=2))

    env = dict(os.environ)
    for pair in options.env:
        name, _, value = pair.partition("=")
        env[name] = value
    parent = options.unit_parent
    if parent is not None:
        env["CG2VM_UNIT_PARENT"] = str(parent)
        summary["unit_parent"] = str(parent)
        summary["unit_parent_subtree_control"] = read(parent / "cgroup.subtree_control")
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "import mocksandbox.core, mocksandbox.cli"], check=True, env=env)
    summary["import_s"] = round(time.monotonic() - start, 1)
    save()
    before = snapshot()
    sampler = MemorySampler()
    sampler.start()
    if options.doctor:
        summary["doctor"] = run_doctor(env, parent)
        save()
    start = time.monotonic()
    summary["pytest_started_at_uptime"] = uptime()
    returncode = run_pytest(pytest_args, out, env)
    summary["pytest_s"] = round(time.monotonic() - start, 1)
    summary["pytest_exit_status"] = returncode
    start = time.monotonic()
    summary["left_behind"] = left_behind(before)
    summary["left_behind_wait_s"] = round(time.monotonic() - start, 1)
    sampler.stop()
    summary["memory_peak_mib"] = sampler.peak_mib
    summary["memory_total_mib"] = sampler.total_mib
    summary["oom"] = oom_lines()
    summary["uptime_at_end"] = uptime()
    save()
    subprocess.run(["rm", "-rf", str(BASETEMP)], check=False)
    return returncode


if __name__ == "__main__":
    sys.exit(main())
