"""The protections table (``mocksandbox doctor``, the banner, the plugin's summary) read off an
engine's isolation and confinement: what each combination is said to give, and what would give
the rest. The hostile suite (tests/server/test_host_shapes.py) holds the real table to what runs
can do on each host shape; these cases cover the combinations a machine cannot make."""

from __future__ import annotations

import resource

from mocksandbox.execution import world
from mocksandbox.execution.budget import MemoryBudget, ProcessBudget
from mocksandbox.execution.confinement import ProcessGroupConfinement
from mocksandbox.execution.protections import NOT_PROVEN, broken, format_table, protections, summary
from mocksandbox.execution.startup_proof import Proof
from mocksandbox.execution.world import Isolation


class _Cgroups:
    """Stands in for a cgroup confinement (v1 unless ``version``)."""

    name = "cgroup"
    max_processes = 512
    max_memory_bytes = 4096 << 20

    def __init__(self, version: int = 1) -> None:
        self.version = version


def holds(rows: list, name: str) -> str:
    return next(row.holds for row in rows if row.name == name)


def test_a_root_server_with_cgroups_gives_everything() -> None:
    isolation = Isolation("lite", run_uid=1 << 30, syscall_filter=True)
    rows = protections(isolation, _Cgroups(2))  # type: ignore[arg-type]
    assert {row.holds for row in rows} == {"yes"}
    assert "cgroup v2 pids.max 512 per run" in format_table(rows)
    assert summary(rows).startswith("files, processes, network, secrets, non-root uid, seccomp")
    assert "NOT" not in summary(rows)


def test_what_auto_could_not_give_is_no_with_why_and_what_would_give_it() -> None:
    isolation = Isolation("lite", run_as_reason="this kernel has no user namespaces", syscall_filter=False,
                          syscall_filter_reason="pyseccomp is not installed")  # fmt: skip
    rows = protections(isolation, _Cgroups())  # type: ignore[arg-type]
    non_root = next(row for row in rows if row.name == "non-root uid")
    assert non_root.holds == "no" and "this kernel has no user namespaces" in non_root.how
    assert non_root.remedy == "--run-as user"
    assert holds(rows, "seccomp") == "no"
    assert "NOT: non-root uid, seccomp" in summary(rows)
    assert "to have it: --run-as user" in format_table(rows)


def test_without_cgroups_the_bounds_are_rlimits_and_said_to_be_weaker() -> None:
    confinement = ProcessGroupConfinement(
        ProcessBudget(None, 0, None, 256), MemoryBudget(None, 0, None, 0), 1024
    )
    confinement.delegate_runs_to(1 << 30, 1 << 30)  # runs a uid of their own, per relay namespace
    rows = protections(Isolation("lite", run_uid=1 << 30, syscall_filter=True), confinement)
    assert holds(rows, "process bound") == "yes"
    assert (holds(rows, "memory bound"), holds(rows, "scratch bound")) == ("partly", "partly")
    assert "RLIMIT_NPROC 256 per run" in format_table(rows)
    assert "RLIMIT_DATA 1024 MiB per process" in format_table(rows)


def test_isolation_none_gives_no_world_and_says_why() -> None:
    rows = protections(Isolation("none", "host", "lite needs overlayfs"), _Cgroups())  # type: ignore[arg-type]
    for name in ("files", "processes", "network", "seccomp"):
        assert holds(rows, name) == "no", name
    assert holds(rows, "secrets") == "partly"
    files = next(row for row in rows if row.name == "files")
    assert "lite needs overlayfs" in files.how and "isolation lite" in files.remedy


def test_runs_without_idmapped_mounts_are_their_uid_and_it_says_which_way_and_why() -> None:
    why = "this kernel's tmpfs refuses them (/tmp/mocksandbox-x: Invalid argument)"
    isolation = Isolation("lite", run_uid=1 << 30, syscall_filter=True, without_idmapped_mounts=why)
    rows = protections(isolation, _Cgroups(2))  # type: ignore[arg-type]
    non_root = next(row for row in rows if row.name == "non-root uid")
    assert non_root.holds == "yes" and not non_root.remedy
    assert non_root.how.startswith(
        f"uid {1 << 30} on the host, root only in its own user namespace (without idmapped mounts: "
        f"{why}; host files owned by others are read-only to runs)"
    )
    assert isolation.missing() == []  # nothing missing: no warning, no note beside answers
    assert f"without idmapped mounts: {why}" in isolation.describe_user()
    assert isolation.run_owner() == world.RunOwner(1 << 30, 1 << 30)
    # With them, the server's own writes are the run's as they are: nobody to give them to.
    assert Isolation("lite", run_uid=1 << 30).run_owner() is None


def test_without_cgroups_a_process_may_use_no_more_than_the_memory_budgets_share_of_a_run() -> None:
    """``max_memory_mb`` alone let one hog of a small host (4096 MiB of a 3 GiB machine) bring
    the kernel's OOM killer for the whole machine: the rlimits, and what the table and
    ``describe`` say, are one run's share of the memory budget where that is less."""
    mib = 1 << 20
    budget = MemoryBudget(None, 512 * mib, 1536 * mib, 1200 * mib)
    confinement = ProcessGroupConfinement(ProcessBudget(None, 0, None, 256), budget, 4096)
    assert confinement.max_memory_bytes == 1200 * mib
    limits = dict(confinement.rlimits())
    assert (limits[resource.RLIMIT_DATA], limits[resource.RLIMIT_FSIZE]) == (1200 * mib, 1200 * mib)
    assert "RLIMIT_DATA and RLIMIT_FSIZE 1200 MiB per process" in confinement.describe()
    table = format_table(protections(Isolation("lite", run_uid=1 << 30, syscall_filter=True), confinement))
    assert "RLIMIT_DATA 1200 MiB per process" in table and "RLIMIT_FSIZE 1200 MiB per file" in table
    # The setting, where it is the smaller; and where no memory was read, the setting alone.
    assert ProcessGroupConfinement(None, budget, 1024).max_memory_bytes == 1024 * mib
    assert ProcessGroupConfinement(None, MemoryBudget(None, 0, None, 0), 4096).max_memory_bytes == 4096 * mib


def row(rows: list, name: str):  # type: ignore[no-untyped-def]
    return next(row for row in rows if row.name == name)


def test_a_row_refused_at_start_says_how_it_was_proven() -> None:
    isolation = Isolation("lite", run_uid=1 << 30, syscall_filter=True)
    proofs = {
        "files": Proof("refused", "a write to a host file was refused"),
        "seccomp": Proof("refused", "keyctl was refused with the filter's EPERM"),
    }
    rows = protections(isolation, _Cgroups(2), proofs)  # type: ignore[arg-type]
    files = row(rows, "files")
    assert files.holds == "yes" and files.how.endswith(
        "(proven at start: a write to a host file was refused)"
    )
    assert "proven at start: keyctl was refused" in row(rows, "seccomp").how
    assert broken(rows) == []


def test_a_row_nothing_tried_says_configured_not_proven_here_and_why() -> None:
    isolation = Isolation("lite", run_uid=1 << 30, syscall_filter=True)
    proofs = {"secrets": Proof("untried", "no masked file with content on this host")}
    rows = protections(isolation, _Cgroups(2), proofs)  # type: ignore[arg-type]
    secrets = row(rows, "secrets")
    assert secrets.holds == "yes"
    assert secrets.how.endswith(f"({NOT_PROVEN}: no masked file with content on this host)")
    # No proof at all (no start-up run): said too, never a bare yes.
    assert f"({NOT_PROVEN}: no start-up run tried it)" in row(rows, "network").how


def test_a_proof_that_fails_is_no_with_what_the_run_did_and_the_banner_warns() -> None:
    isolation = Isolation("lite", run_uid=1 << 30, syscall_filter=True)
    did = "the start-up run changed or deleted a host file (/var/tmp/.mocksandbox-proof-x)"
    rows = protections(isolation, _Cgroups(2), {"files": Proof("done", did)})  # type: ignore[arg-type]
    files = row(rows, "files")
    assert files.holds == "no" and files.broken and files.how.startswith(did)
    assert files.remedy  # (what to do: report it)
    assert "NOT: files" in summary(rows)
    assert broken(rows) == [f"files does not hold: {files.how}"]


def test_a_row_configured_not_to_hold_says_what_the_run_did() -> None:
    isolation = Isolation("lite", "host", run_uid=1 << 30, syscall_filter=True)
    did = "the start-up run connected to a port the server listens on at 127.0.0.1"
    rows = protections(isolation, _Cgroups(2), {"network": Proof("done", did)})  # type: ignore[arg-type]
    network = row(rows, "network")
    assert network.holds == "no" and not network.broken
    assert network.how == f"the host's network (run_network: host); {did}"
    assert broken(rows) == []  # (no warning of a break: the table says it does not hold, as configured)
