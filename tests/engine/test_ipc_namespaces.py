"""Each run of a world has an IPC namespace of its own (``_launcher_ipc.RunIpc.renew``): SysV
shared memory, semaphores and message queues and POSIX message queues outlive the processes that
made them, in their namespace, so a relay's runs would otherwise find what its earlier runs left
(and could pile up shared memory run after run). Real engines (isolation lite, both exec modes),
real runs one after another, which go to one relay."""

from __future__ import annotations

import pytest

from mocksandbox.core import MockSandbox
from mocksandbox.models import RunCodeRequest


@pytest.fixture(scope="module")
def sandbox(lite_sandbox: MockSandbox) -> MockSandbox:
    return lite_sandbox


LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
#: Each kind of object a run can leave in its IPC namespace, made alone (0o1000: IPC_CREAT).
PLANTS = {
    "shm": "ctypes.memmove(libc.shmat(libc.shmget(0x5EED, 1 << 20, 0o1000 | 0o600), None, 0), b'left', 4)",
    "sem": "assert libc.semget(0x5EED, 1, 0o1000 | 0o600) >= 0",
    "msg": "assert libc.msgget(0x5EED, 0o1000 | 0o600) >= 0",
    "mq": "assert libc.mq_open(b'/left-by-a-run', os.O_CREAT | os.O_RDWR, 0o600, None) >= 0",
}
LOOK = LIBC + (
    "print([len(open('/proc/sysvipc/' + kind).read().splitlines()) - 1 for kind in ('shm', 'sem', 'msg')],\n"
    "      libc.shmget(0x5EED, 0, 0), libc.semget(0x5EED, 0, 0), libc.msgget(0x5EED, 0),\n"
    "      libc.mq_open(b'/left-by-a-run', os.O_RDONLY))\n"
)
NOTHING = "[0, 0, 0] -1 -1 -1 -1"


def run(box: MockSandbox, code: str, **fields: object) -> str:
    answer = box.engine.run_code(RunCodeRequest(code=code, language="python", **fields))  # type: ignore[arg-type]
    assert answer.run_result is not None and answer.run_result.return_code == 0, answer
    return (answer.run_result.stdout or "").strip()


# A run in a root its relay keeps, and one in a root of its own (fetch_files).
ROOTS = [{}, {"fetch_files": ["nothing-here"]}]


@pytest.mark.parametrize("planter", ROOTS, ids=["kept-root", "own-root"])
@pytest.mark.parametrize("kind", sorted(PLANTS))
def test_a_run_finds_nothing_an_earlier_run_left_in_ipc(
    sandbox: MockSandbox, kind: str, planter: dict
) -> None:
    """Each kind alone: the relay looks for each (it makes a new namespace only where a run left
    something)."""
    assert run(sandbox, LOOK) == NOTHING
    planted = run(sandbox, LIBC + PLANTS[kind] + "\n" + LOOK, **planter)
    assert planted != NOTHING, planted  # (seen by the run that made it)
    for looker in ROOTS:
        assert run(sandbox, LOOK, **looker) == NOTHING
