"""Reading the server's process and memory limits and splitting them between the server and its runs."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from mocksandbox.execution.budget import (
    MIB,
    MIN_PER_RUN,
    MIN_RUNS_MEMORY,
    MIN_SERVER_MEMORY_RESERVE,
    MIN_SERVER_RESERVE,
    MemoryLimit,
    ProcessLimit,
    discover_memory_limits,
    discover_process_limits,
    plan_memory_budget,
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


# -- memory ------------------------------------------------------------------------------------------

#: What cgroup v1 reports for a memory cgroup without a limit (PAGE_COUNTER_MAX pages of 4 KiB).
V1_UNLIMITED = "9223372036854771712"


def _memory_group(root: Path, path: str, files: dict[str, str]) -> None:
    directory = root / path.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(f"{text}\n")


def test_v1_memory_limits_of_the_own_cgroup_and_every_one_above(tmp_path: Path) -> None:
    proc, sys_fs = _fake_host(tmp_path, "8:pids:/\n4:memory:/docker/abc\n")
    memory = sys_fs / "memory"
    _memory_group(
        memory,
        "/docker/abc",
        {
            "memory.limit_in_bytes": str(1536 * MIB),
            "memory.usage_in_bytes": str(300 * MIB),
            # Page cache the kernel can drop at once does not count as in use.
            "memory.stat": f"cache {250 * MIB}\ninactive_file 1\ntotal_inactive_file {200 * MIB}",
        },
    )
    _memory_group(memory, "/docker", {"memory.limit_in_bytes": str(8192 * MIB), "memory.usage_in_bytes": "0"})
    _memory_group(memory, "/", {"memory.limit_in_bytes": V1_UNLIMITED, "memory.usage_in_bytes": "5"})
    assert discover_memory_limits(proc, sys_fs) == [
        MemoryLimit("cgroup v1 memory.limit_in_bytes of /docker/abc", 1536 * MIB, 100 * MIB),
        MemoryLimit("cgroup v1 memory.limit_in_bytes of /docker", 8192 * MIB, 0),
    ]


def test_v2_memory_limits_through_the_cgroup2_mount(tmp_path: Path) -> None:
    mount = tmp_path / "unified"
    mountinfo = f"30 25 0:26 / {mount} rw,nosuid - cgroup2 cgroup2 rw\n"
    proc, sys_fs = _fake_host(tmp_path, "0::/system.slice/ci.service\n", mountinfo)
    _memory_group(
        mount,
        "/system.slice/ci.service",
        {
            "memory.max": str(2048 * MIB),
            "memory.current": str(80 * MIB),
            "memory.stat": f"inactive_file {30 * MIB}",
        },
    )
    _memory_group(mount, "/system.slice", {"memory.max": "max", "memory.current": str(900 * MIB)})
    assert discover_memory_limits(proc, sys_fs) == [
        MemoryLimit("cgroup v2 memory.max of /system.slice/ci.service", 2048 * MIB, 50 * MIB)
    ]


def test_no_memory_cgroup_no_memory_limit(tmp_path: Path) -> None:
    """Without a cgroup limit and without /proc/meminfo there is none."""
    proc, sys_fs = _fake_host(tmp_path, "4:memory:/\n")
    _memory_group(
        sys_fs / "memory", "/", {"memory.limit_in_bytes": V1_UNLIMITED, "memory.usage_in_bytes": "5"}
    )
    assert discover_memory_limits(proc, sys_fs) == []
    budget = plan_memory_budget([], max_memory_mb=4096)
    assert budget.runs_total is None and budget.per_run == 4096 * MIB
    assert budget.describe() == "no memory limit found"


def test_a_container_memory_limit_is_split_so_that_runs_leave_the_server_room() -> None:
    limit = MemoryLimit("cgroup v1 memory.limit_in_bytes of /ci", 1536 * MIB, 100 * MIB)
    budget = plan_memory_budget([limit], max_memory_mb=4096)
    assert budget.server_reserve == 359 * MIB
    assert budget.runs_total == 1077 * MIB
    assert budget.per_run == 1077 * MIB  # one run may use what all runs may, never the reserve
    assert budget.describe() == (
        "1536 MiB (cgroup v1 memory.limit_in_bytes of /ci), 100 MiB in use; 359 MiB kept for the "
        "server, 1077 MiB for all runs together, 1077 MiB per run"
    )
    roomy = plan_memory_budget([MemoryLimit("cgroup v2 memory.max of /", 64 << 30, 0)], max_memory_mb=4096)
    assert roomy.per_run == 4096 * MIB


def test_the_tightest_memory_limit_binds_and_a_small_one_keeps_the_minimum_reserve() -> None:
    limits = [MemoryLimit("outer", 8192 * MIB, 7900 * MIB), MemoryLimit("inner", 1024 * MIB, 100 * MIB)]
    budget = plan_memory_budget(limits, max_memory_mb=4096)
    assert budget.binding == limits[0]
    assert budget.server_reserve == MIN_SERVER_MEMORY_RESERVE
    assert budget.runs_total == MIN_RUNS_MEMORY  # 292 MiB of headroom: the floor, not an honest share


def test_process_and_memory_limits_are_not_interchangeable() -> None:
    assert ProcessLimit("x", 1, 0) != MemoryLimit("x", 1, 0)
    assert plan_process_budget([], 512).describe() == "no process limit found"


@given(
    limit=st.integers(1, 1 << 45),
    in_use=st.integers(0, 1 << 45),
    max_memory_mb=st.integers(16, 1 << 20),
)
def test_the_memory_split_holds_for_any_limit(limit: int, in_use: int, max_memory_mb: int) -> None:
    budget = plan_memory_budget([MemoryLimit("x", limit, in_use)], max_memory_mb)
    assert budget.runs_total is not None
    assert budget.per_run <= max_memory_mb * MIB
    assert budget.per_run <= budget.runs_total
    assert budget.runs_total >= MIN_RUNS_MEMORY
    assert budget.server_reserve >= MIN_SERVER_MEMORY_RESERVE
    headroom = max(0, limit - in_use)
    if headroom - budget.server_reserve >= MIN_RUNS_MEMORY:
        assert budget.runs_total + budget.server_reserve <= headroom


def test_the_hosts_memory_is_a_limit_beside_the_cgroups(tmp_path: Path) -> None:
    """MemTotal, with what is not MemAvailable in use: a host whose server has no memory cgroup
    limit still keeps the server's share and holds runs together to the rest."""
    proc, sys_fs = _fake_host(tmp_path, "4:memory:/\n")
    _memory_group(
        sys_fs / "memory", "/", {"memory.limit_in_bytes": V1_UNLIMITED, "memory.usage_in_bytes": "5"}
    )
    (proc / "meminfo").write_text(
        f"MemTotal:       {8192 * 1024} kB\nMemFree:        {1024} kB\nMemAvailable:   {6144 * 1024} kB\n"
    )
    host = MemoryLimit("host memory, MemTotal", 8192 * MIB, 2048 * MIB)
    assert discover_memory_limits(proc, sys_fs) == [host]
    budget = plan_memory_budget([host], max_memory_mb=4096)
    assert (budget.server_reserve, budget.runs_total, budget.per_run) == (1536 * MIB, 4608 * MIB, 4096 * MIB)
    (proc / "meminfo").write_text("MemTotal: 100 kB\n")  # (a kernel before 3.14: no MemAvailable)
    assert discover_memory_limits(proc, sys_fs) == []
