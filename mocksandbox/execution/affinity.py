"""Worker processes kept to their share of the cores; user programs free to use them all.

With ``--workers N``, each worker, its launcher and its relays keep to a share of the usable cores
(worker ``i`` gets every ``N``-th core from the ``i``-th): a request is then served, started and
reaped on the cores where its worker runs, rather than bounced between cores at every wake-up,
which on a small machine costs more than the second process gains. Measured on 2 cores at
concurrency 32, ``print(1)``: about 10% less CPU per request (see ``benchmarks/bench_run_code.py``).

User code never inherits a share: the launcher's programs and the Jupyter kernels are put back on
every core the server could use, so that ``os.sched_getaffinity`` and ``nproc`` in a program say
what they say without workers. The set travels in :data:`PROGRAM_CPUS_VARIABLE` (hidden from
programs, like every ``MOCKSANDBOX_`` variable).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence

#: The cores user programs may use, as ``0,1,2``: set in a worker kept to a share.
PROGRAM_CPUS_VARIABLE = "MOCKSANDBOX_PROGRAM_CPUS"


def usable_cpus() -> list[int]:
    """The cores this process may run on (a container's or a ``taskset``'s set, not the host's)."""
    return sorted(os.sched_getaffinity(0))


def worker_shares(cpus: Sequence[int], workers: int) -> list[list[int]]:
    """Each of ``workers`` workers' cores: every ``workers``-th of ``cpus`` from its own index, or,
    with more workers than cores, one core each in turn."""
    if workers <= len(cpus):
        return [list(cpus[index::workers]) for index in range(workers)]
    return [[cpus[index % len(cpus)]] for index in range(workers)]


def format_cpus(cpus: Collection[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))


def parse_cpus(text: str) -> set[int]:
    """``0,1,3`` as a set; ``ValueError`` for anything else."""
    cpus = {int(part) for part in text.split(",") if part.strip()}
    if not cpus or min(cpus) < 0:
        raise ValueError(f"not a list of CPU numbers: {text!r}")
    return cpus


def keep_to(share: Collection[int]) -> None:
    """Keep this process (its calling thread, and every thread and child it starts after) to
    ``share``, and remember the cores it had for its users' programs. Call it first, before any
    thread starts."""
    os.environ[PROGRAM_CPUS_VARIABLE] = format_cpus(os.sched_getaffinity(0))
    os.sched_setaffinity(0, share)


def program_cpus() -> set[int] | None:
    """The cores user programs get back, or ``None`` when this process was not kept to a share."""
    text = os.environ.get(PROGRAM_CPUS_VARIABLE)
    return parse_cpus(text) if text else None


def release_to_programs(pid: int) -> None:
    """Give process ``pid`` (a kernel just started) every core users may use, if this process was
    kept to a share; a process that is already gone is left alone."""
    cpus = program_cpus()
    if cpus is None:
        return
    try:
        os.sched_setaffinity(pid, cpus)
    except OSError:
        pass  # it exited already, or the cpuset changed under us: it keeps what it had
