"""Workers kept to their share of the cores; user programs given every core back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mocksandbox.execution.affinity import format_cpus, parse_cpus, worker_shares


def test_each_worker_gets_every_nth_core_from_its_own() -> None:
    assert worker_shares([0, 1], 2) == [[0], [1]]
    assert worker_shares([0, 1, 2, 3, 4], 2) == [[0, 2, 4], [1, 3]]
    assert worker_shares([2, 5, 7], 3) == [[2], [5], [7]]


def test_more_workers_than_cores_share_them_in_turn() -> None:
    assert worker_shares([0, 1], 5) == [[0], [1], [0], [1], [0]]


def test_cpu_lists_read_back_and_bad_ones_are_refused() -> None:
    assert parse_cpus(format_cpus({3, 0, 1})) == {0, 1, 3}
    for bad in ("", "a", "-1", ","):
        with pytest.raises(ValueError):
            parse_cpus(bad)


_KEPT = """
import os, sys
from mocksandbox.execution.affinity import keep_to, program_cpus
everything = os.sched_getaffinity(0)
keep_to({min(everything)})
print(sorted(os.sched_getaffinity(0)), sorted(program_cpus()), sep=";")
"""


def test_a_process_kept_to_a_share_remembers_what_programs_get() -> None:
    done = subprocess.run([sys.executable, "-c", _KEPT], capture_output=True, text=True, check=True)
    kept, programs = done.stdout.strip().split(";")
    everything = sorted(os.sched_getaffinity(0))
    assert kept == str([everything[0]]) and programs == str(everything)
