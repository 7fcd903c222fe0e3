"""Reading the server's process limits and splitting them between the server and its runs."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from mocksandbox.execution.budget import (
    MIN_PER_RUN,
    MIN_SERVER_RESERVE,
    ProcessLimit,
    discover_process_limits,
    plan_process_budget,
)


def _fake_host(tmp_path: Path, cgroup_lines: str, mountinfo: str = "") -> tuple[Path, Path]:
    proc, sys_fs = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup_lines)
    (proc / "self" / "mountinfo").write_text(mountinfo)
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "sys" / "kernel" / "pid_max").write_text("32768\n")
    (proc / "sys" / "kernel" / "threads-max").write_text("100000\n")
    for pid, threads in (("1", 1), ("42", 3)):
        for tid in range(threads):
            (proc / pid / "task" / str(int(pid) + tid)).mkdir(parents=True)
    return proc, sys_fs


def _group(root: Path, path: str, limit: str, current: int) -> None:
    directory = root / path.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pids.max").write_text(f"{limit}\n")
    (directory / "pids.current").write_text(f"{current}\n")


def test_v1_limits_of_the_own_cgroup_and_every_one_above(tmp_path: Path) -> None:
    proc, sys_fs = _fake_host(tmp_path, "8:pids:/ci/job-7\n4:memory:/ci\n")
    _group(sys_fs / "pids", "/ci", "1000", 300)
    _group(sys_fs / "pids", "/ci/job-7", "max", 12)  # no limit of its own
    limits = {lim.source: lim for lim in discover_process_limits(proc, sys_fs)}
    assert limits["cgroup v1 pids.max of /ci"] == ProcessLimit("cgroup v1 pids.max of /ci", 1000, 300)
    assert not any("job-7" in source for source in limits)
    assert limits["kernel.pid_max"] == ProcessLimit("kernel.pid_max", 32768, 4)
    assert limits["kernel.threads_max"].limit == 100000


def test_v2_limits_through_the_cgroup2_mount(tmp_path: Path) -> None:
    mount = tmp_path / "unified"
    mountinfo = f"30 25 0:26 / {mount} rw,nosuid - cgroup2 cgroup2 rw\n"
    proc, sys_fs = _fake_host(tmp_path, "0::/system.slice/ci.service\n", mountinfo)
    _group(mount, "/system.slice/ci.service", "400", 20)
    _group(mount, "/system.slice", "max", 900)
    (limit,) = [lim for lim in discover_process_limits(proc, sys_fs) if "cgroup" in lim.source]
    assert limit == ProcessLimit("cgroup v2 pids.max of /system.slice/ci.service", 400, 20)


def test_a_small_budget_is_split_so_that_runs_leave_the_server_room() -> None:
    budget = plan_process_budget([ProcessLimit("cgroup v1 pids.max of /ci", 400, 10)], max_processes=512)
    assert budget.server_reserve == 97
    assert budget.runs_total == 293
    assert budget.per_run == 36
    assert "400 (cgroup v1 pids.max of /ci), 10 in use" in budget.describe()


def test_the_tightest_limit_binds_and_the_setting_caps_each_run() -> None:
    limits = [ProcessLimit("kernel.pid_max", 4_194_304, 300), ProcessLimit("RLIMIT_NPROC", 2000, 1500)]
    budget = plan_process_budget(limits, max_processes=512)
    assert budget.binding is not None and budget.binding.source == "RLIMIT_NPROC"
    roomy = plan_process_budget([ProcessLimit("kernel.pid_max", 4_194_304, 300)], max_processes=512)
    assert roomy.per_run == 512


def test_no_limit_found() -> None:
    budget = plan_process_budget([], max_processes=512)
    assert budget.runs_total is None and budget.per_run == 512
    assert budget.describe() == "no process limit found"


@given(
    limit=st.integers(1, 10_000_000),
    in_use=st.integers(0, 10_000_000),
    max_processes=st.integers(8, 100_000),
)
def test_the_split_holds_for_any_limit(limit: int, in_use: int, max_processes: int) -> None:
    budget = plan_process_budget([ProcessLimit("x", limit, in_use)], max_processes)
    assert budget.runs_total is not None
    assert budget.per_run <= max_processes
    assert budget.per_run >= min(MIN_PER_RUN, max_processes)
    assert budget.server_reserve >= MIN_SERVER_RESERVE
    headroom = max(0, limit - in_use)
    if headroom - budget.server_reserve >= MIN_PER_RUN:
        # Runs together never eat into the server's reserve, and seven bombs leave room.
        assert budget.runs_total + budget.server_reserve <= headroom
        assert 7 * budget.per_run < budget.runs_total or budget.per_run <= MIN_PER_RUN
