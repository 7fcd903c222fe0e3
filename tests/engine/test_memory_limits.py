"""``memory_limit_MB`` in every exec mode: what a program sees is what a new interpreter sees.

verl sends ``memory_limit_MB: 1024`` with every call, so in fork mode such runs take the warm path
too; these tests hold it to SandboxFusion's behaviour (measured there: contract §2.4 and a local
SandboxFusion), including its quirk that no thread can start under the limit.
"""

from __future__ import annotations

from mocksandbox.core import MockSandbox
from mocksandbox.execution.engine import FORK_MIN_MEMORY_LIMIT_MB
from mocksandbox.models import RunCodeRequest, RunCodeResponse, RunStatus

MIB = 1024 * 1024


def run(sandbox: MockSandbox, code: str, limit_mb: int) -> RunCodeResponse:
    return sandbox.engine.run_code(RunCodeRequest(code=code, language="python", memory_limit_MB=limit_mb))


def test_no_thread_can_start_under_the_limit(sandbox: MockSandbox) -> None:
    """glibc sizes thread stacks by RLIMIT_STACK read at start: N MiB stacks in an N MiB space."""
    code = "import threading\nt = threading.Thread(target=print, args=(1,))\nt.start()\nt.join()\n"
    response = run(sandbox, code, 1024)
    assert response.run_result is not None
    assert response.run_result.return_code == 1
    assert "RuntimeError: can't start new thread" in response.run_result.stderr


def test_threads_start_without_a_limit(sandbox: MockSandbox) -> None:
    code = "import threading\nt = threading.Thread(target=print, args=(1,))\nt.start()\nt.join()\n"
    response = run(sandbox, code, -1)
    assert response.status == RunStatus.Success
    assert response.run_result is not None and response.run_result.stdout == "1\n"


def test_limits_and_thread_stack_size_read_as_in_a_new_interpreter(sandbox: MockSandbox) -> None:
    code = (
        "import resource, threading\n"
        "print(threading.stack_size())\n"
        "for name in ('RLIMIT_AS', 'RLIMIT_DATA', 'RLIMIT_STACK'):\n"
        "    print(resource.getrlimit(getattr(resource, name))[0])\n"
    )
    response = run(sandbox, code, 1024)
    assert response.status == RunStatus.Success
    assert response.run_result is not None
    assert response.run_result.stdout.split() == ["0", *[str(1024 * MIB)] * 3]


def test_allocations_under_and_over_the_limit(sandbox: MockSandbox) -> None:
    fits = run(sandbox, f"x = bytearray({200 * MIB})\nprint(len(x))\n", 256)
    assert fits.run_result is not None and fits.run_result.stdout == f"{200 * MIB}\n"
    too_big = run(sandbox, f"x = bytearray({300 * MIB})\n", 256)
    assert too_big.run_result is not None
    assert too_big.run_result.return_code == 1
    assert "MemoryError" in too_big.run_result.stderr


def test_which_limits_take_the_warm_path(sandbox: MockSandbox) -> None:
    """In fork mode, limits from FORK_MIN_MEMORY_LIMIT_MB up run forked (forks share the
    launcher's string hash seed: two runs hash alike); smaller ones, and every run in spawn mode,
    start a new interpreter (a new seed each: 2**-64 to collide)."""
    code = "print(hash('mocksandbox'))"
    forked = sandbox.settings.exec_mode == "fork"
    for limit, warm in ((1024, forked), (FORK_MIN_MEMORY_LIMIT_MB, forked), (64, False), (-1, forked)):
        first, second = (run(sandbox, code, limit).run_result for _ in range(2))
        assert first is not None and second is not None, limit
        assert (first.stdout == second.stdout) == warm, limit
