"""What holds on this host (DESIGN seam 10): each protection of a run, whether the server gives it
here, how or why not, and what would give it.

One table, read off what the engine actually started with (its isolation and its confinement),
never off what was asked for, and each protection that holds proven by what the start-up run tried
and was refused (``startup_proof``), or said to be "configured, not proven here", with why; a
protection the run could break is "no", whatever the configuration says. ``mocksandbox doctor`` prints it
whole, the banner and the pytest plugin's report header in short, and every answer of a server
that ``auto`` could not give a protection carries a note of what is missing (``Isolation.missing``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from mocksandbox.execution.budget import MEMORY_NOT_HELD

if TYPE_CHECKING:
    from mocksandbox.execution.confinement import Confinement
    from mocksandbox.execution.startup_proof import Proof
    from mocksandbox.execution.world import Isolation

#: ``yes``: holds; ``partly``: holds in a weaker form (said in ``how``); ``no``: does not hold.
Holds = Literal["yes", "partly", "no"]

#: What gives worlds where the server has none.
_WORLDS = (
    "isolation lite: namespaces and overlayfs, and a server started as root or unprivileged user "
    "namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0); in a "
    "container: docs/serving/security.md"
)
_CGROUPS = (
    "writable cgroups: root on cgroup v1, or a cgroup v2 subtree of the server's own with pids and "
    "memory (systemd-run --scope -p Delegate=yes mocksandbox serve; in a container: --cgroupns=private "
    "and a writable /sys/fs/cgroup)"
)


@dataclass(frozen=True)
class Protection:
    """One protection of a run and whether it holds here."""

    name: str
    holds: Holds
    #: How it holds here, or why it does not.
    how: str
    #: The command or setting that would give it (empty where it holds).
    remedy: str = ""
    #: Whether the start-up run proved it does not hold, although configured to.
    broken: bool = False


#: Said of a protection that holds by its configuration, where nothing tried it.
NOT_PROVEN = "configured, not proven here"
#: What would mend a protection the start-up run broke: it is a bug, or a host that does not do
#: what it says (a kernel, a container runtime).
_BROKEN = "report it (mocksandbox doctor's output): the configuration says it holds"


def protections(
    isolation: Isolation, confinement: Confinement, proofs: Mapping[str, Proof] | None = None
) -> list[Protection]:
    """The table for an engine with this ``isolation`` and ``confinement``, each row that holds
    (wholly or partly) with what the start-up run's ``proofs`` say of it (``ExecutionEngine.proofs``)."""
    return [_proven(row, (proofs or {}).get(row.name)) for row in _configured(isolation, confinement)]


def _proven(row: Protection, proof: Proof | None) -> Protection:
    """``row`` with how it was proven, or why not; "no" where the start-up run broke it."""
    if row.holds == "no":
        if proof is not None and proof.outcome == "done":
            return dataclasses.replace(row, how=f"{row.how}; {proof.what}")
        return row
    if proof is None:
        return dataclasses.replace(row, how=f"{row.how} ({NOT_PROVEN}: no start-up run tried it)")
    if proof.outcome == "refused":
        return dataclasses.replace(row, how=f"{row.how} (proven at start: {proof.what})")
    if proof.outcome == "done":
        return Protection(row.name, "no", f"{proof.what}, though configured: {row.how}", _BROKEN, broken=True)
    return dataclasses.replace(row, how=f"{row.how} ({NOT_PROVEN}: {proof.what})")


def broken(rows: list[Protection]) -> list[str]:
    """What the start-up run could do although configured not to: a warning each."""
    return [f"{row.name} does not hold: {row.how}" for row in rows if row.broken]


def _configured(isolation: Isolation, confinement: Confinement) -> list[Protection]:
    """The table as the configuration has it."""
    lite = isolation.mode == "lite"
    why_none = isolation.reason or "isolation none was asked for"
    rows = [
        _in_world(lite, "files", "a copy-on-write root: the host's files are read-only beneath it", why_none),
        _in_world(
            lite, "processes", "a PID namespace of its own: it sees and signals only its own", why_none
        ),
    ]
    if not lite:
        rows.append(Protection("network", "no", f"the host's network ({why_none})", _WORLDS))
    elif isolation.network == "private":
        rows.append(Protection("network", "yes", "its own loopback only: no host service, no control API"))
    else:
        rows.append(
            Protection("network", "no", "the host's network (run_network: host)", "--run-network private")
        )
    if lite:
        hidden = "the server user's credentials, the host's shadow files and the server's state look empty"
        rows.append(Protection("secrets", "yes", f"{hidden}; credential-like variables are left out"))
    else:
        rows.append(
            Protection(
                "secrets", "partly", f"only credential-like variables are left out ({why_none})", _WORLDS
            )
        )
    rows.append(_non_root(isolation))
    if lite and isolation.syscall_filter:
        rows.append(
            Protection("seccomp", "yes", "Docker's default refusals: keyrings, mounts, namespaces, modules")
        )
    elif lite:
        remedy = "pip install pyseccomp, with the host's libseccomp (apt-get install libseccomp2)"
        rows.append(Protection("seccomp", "no", isolation.syscall_filter_reason or "no filter", remedy))
    else:
        rows.append(Protection("seccomp", "no", f"no world to filter ({why_none})", _WORLDS))
    rows += _bounds(isolation, confinement)
    return rows


def _in_world(lite: bool, name: str, how: str, why_none: str) -> Protection:
    if lite:
        return Protection(name, "yes", how)
    return Protection(name, "no", f"runs share the host's ({why_none})", _WORLDS)


def _non_root(isolation: Isolation) -> Protection:
    if isolation.mode == "lite" and isolation.run_uid is not None:
        how = f"uid {isolation.run_uid} on the host, root only in its own user namespace"
        if isolation.without_idmapped_mounts:
            # (Which way holds, and why not the other: the start-up run proved it, by the owner
            # of a file it made, read from outside.)
            how += (
                f" (without idmapped mounts: {isolation.without_idmapped_mounts}; "
                "host files owned by others are read-only to runs)"
            )
        return Protection("non-root uid", "yes", how)
    if isolation.mode == "lite":
        why = isolation.run_as_reason or "run_as: root was asked for"
        return Protection("non-root uid", "no", f"runs are the host's root ({why})", "--run-as user")
    if os.geteuid() != 0:
        return Protection(
            "non-root uid", "partly", f"runs are this server's uid {os.geteuid()}, with no world", _WORLDS
        )
    return Protection("non-root uid", "no", "runs are the host's root, with no world", _WORLDS)


def _bounds(isolation: Isolation, confinement: Confinement) -> list[Protection]:
    """Process, memory and scratch bounds: cgroups where the confinement has them, else rlimits.
    (The figures are each confinement's own attributes, beyond the ``Confinement`` protocol: read
    where present, as a stand-in in a test may lack them.)"""
    megabytes = getattr(confinement, "max_memory_bytes", 0) // (1024 * 1024)
    if confinement.name == "cgroup":
        version = getattr(confinement, "version", 1)
        processes = getattr(confinement, "max_processes", None)
        budget = getattr(confinement, "memory_budget", None)
        runs_total = budget.runs_total if budget is not None else None
        together = f", {runs_total // (1024 * 1024)} MiB for all runs together" if runs_total else ""
        rows = [
            Protection("process bound", "yes", f"cgroup v{version} pids.max {processes} per run"),
            Protection(
                "memory bound", "yes", f"cgroup v{version} memory limit {megabytes} MiB per run{together}"
            ),
        ]
        if isolation.mode == "lite":
            rows.append(
                Protection("scratch bound", "yes", "a run's files are in memory, counted in its memory bound")
            )
        else:
            rows.append(
                Protection(
                    "scratch bound",
                    "partly",
                    "files on the host's temp dir, unbounded but by its disk",
                    _WORLDS,
                )
            )
        return rows
    limit = getattr(confinement, "process_limit", lambda: None)()
    if limit is None:
        processes = Protection(
            "process bound", "no", "no cgroup, and no rlimit binds the host's root", _CGROUPS
        )
    elif isolation.mode == "lite" and isolation.run_uid is not None:
        processes = Protection(
            "process bound", "yes", f"RLIMIT_NPROC {limit} per run (its own user namespace)"
        )
    else:
        processes = Protection(
            "process bound", "partly", f"RLIMIT_NPROC {limit} for this user's processes together", _CGROUPS
        )
    memory = Protection(
        "memory bound",
        "partly",
        f"RLIMIT_DATA {megabytes} MiB per process, not per run (no cgroup); {MEMORY_NOT_HELD}",
        _CGROUPS,
    )
    # (lite: a tmpfs, the server's where it is root, else the launcher's own in its namespaces)
    runs_root = "the runs' tmpfs" if isolation.mode == "lite" else "the host's disk"
    scratch = Protection(
        "scratch bound",
        "partly",
        f"RLIMIT_FSIZE {megabytes} MiB per file; all runs' files bounded by {runs_root}",
        _CGROUPS,
    )
    return [processes, memory, scratch]


def format_table(rows: list[Protection]) -> str:
    """The table ``mocksandbox doctor`` prints."""
    width = max(len(row.name) for row in rows)
    lines = [f"{'protection'.ljust(width)}  holds   how, or why not"]
    for row in rows:
        lines.append(f"{row.name.ljust(width)}  {row.holds.ljust(6)}  {row.how}")
        if row.remedy:
            lines.append(f"{''.ljust(width)}          to have it: {row.remedy}")
    return "\n".join(lines)


def summary(rows: list[Protection]) -> str:
    """The table in one line, for the banner and the pytest report header."""
    held = [row.name for row in rows if row.holds == "yes"]
    partly = [row.name for row in rows if row.holds == "partly"]
    missing = [row.name for row in rows if row.holds == "no"]
    parts = [f"{', '.join(held) or 'none'} hold"]
    if partly:
        parts.append(f"partly: {', '.join(partly)}")
    if missing:
        parts.append(f"NOT: {', '.join(missing)}")
    return "; ".join(parts) + " (mocksandbox doctor: how, why, what would give it)"
