"""A fork server for IPython kernels, run as a script by mocksandbox's ``ForkServerLauncher``.

It runs under the interpreter chosen for user code, which need not have mocksandbox installed:
standard library and ipykernel only. It imports everything a kernel needs once, then forks a child
per kernel asked for; a child is ready to answer in ~0.2 s where ``python -m ipykernel_launcher``
takes over a second. Each child is a brand-new kernel process: nothing runs before the fork but
imports, so no state can pass from one kernel to the next.

Protocol, one JSON object per line: after the imports it writes ``{"ready": true, "pid": N}`` (or
``{"error": "..."}`` and exits); then for each ``{"argv": [...], "cwd": "..."}`` read it forks and
writes ``{"pid": N}`` (or ``{"error": "..."}``). It exits when its input closes (the server stopped,
or died), and kills first the process group of every kernel it forked; a kernel also polls this
process and exits when it is gone (killed itself, it can kill nothing).

Usage: ``python _zygote.py MARKER`` (the marker, e.g. the pool's runtime directory, only names
this process and its kernels in ``ps``).
"""

import json
import os
import signal
import sys
import traceback
from typing import IO, Any, NoReturn

#: Modules a kernel imports anyway, at start-up or for its first traceback.
_PRELOAD = (
    "ipykernel.debugger",
    "stack_data",
    "pygments.formatters.terminal256",
    "pygments.styles",
)


def _reply(stream: IO[str], message: dict[str, Any]) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def _run_kernel(
    request: dict[str, Any], protocol_in: IO[str], protocol_out: IO[str], launcher_path: str
) -> NoReturn:
    """In the child: become a kernel (never returns)."""
    code = 1
    try:
        os.setsid()  # its own session and process group: killed as a group, apart from us
        protocol_in.close()
        protocol_out.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # user code must be able to wait for children
        os.chdir(request["cwd"])
        os.environ["JPY_PARENT_PID"] = str(os.getppid())
        sys.argv = [launcher_path, *request["argv"]]
        from ipykernel.kernelapp import IPKernelApp

        # Its parent poller: the default comes from JPY_PARENT_PID as it was when the zygote
        # imported ipykernel, before any kernel's, so it is set here or there is no poller at all.
        IPKernelApp.launch_instance(argv=request["argv"], parent_handle=os.getppid())
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def main() -> int:
    # Running a script puts its directory first on sys.path; kernels must not import from here.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    # The protocol keeps the pipes it was given; fds 0 and 1 become /dev/null so that nothing a
    # kernel prints to them can reach the protocol.
    protocol_in = os.fdopen(os.dup(0), "r", encoding="utf-8")
    protocol_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    try:
        import importlib
        import importlib.util

        import ipykernel.ipkernel
        import ipykernel.kernelapp
        import ipykernel.zmqshell

        # Imported by every kernel at start-up (the debugger is the slowest part), or by the first
        # traceback it formats (~0.1 s then): modules only, no code of any kernel has run yet.
        for name in _PRELOAD:
            try:
                importlib.import_module(name)
            except Exception:
                pass
        spec = importlib.util.find_spec("ipykernel_launcher")
        launcher_path = spec.origin if spec is not None and spec.origin else ipykernel.kernelapp.__file__
    except Exception as exc:
        _reply(protocol_out, {"error": f"cannot import ipykernel with {sys.executable}: {exc}"})
        return 1
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # kernels are reaped as soon as they exit
    _reply(protocol_out, {"ready": True, "pid": os.getpid()})
    kernels: list[int] = []
    try:
        _serve(protocol_in, protocol_out, launcher_path, kernels)
    finally:
        # The server closed our input: stopped, or killed without closing its kernels. A kernel
        # killed already is gone; one still running goes with everything its code started.
        for pid in kernels:
            if _still_ours(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
    return 0


def _still_ours(pid: int) -> bool:
    """Whether group ``pid`` is still one of our kernels' (kernels are reaped unseen here). A pid is
    not given to a new process while a group of that id lives; so if a process ``pid`` exists with
    another parent, the kernel and its whole group are gone and the number was reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return True  # the kernel is gone; its group may live on (user code's children)
    return int(fields[1]) == os.getpid()


def _serve(protocol_in: IO[str], protocol_out: IO[str], launcher_path: str, kernels: list[int]) -> None:
    """Fork a kernel for each request read, until the input closes; their pids go in ``kernels``."""
    for line in protocol_in:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            pid = os.fork()
        except OSError as exc:
            _reply(protocol_out, {"error": f"fork failed: {exc}"})
            continue
        if pid == 0:
            _run_kernel(request, protocol_in, protocol_out, launcher_path)
        kernels.append(pid)
        _reply(protocol_out, {"pid": pid})


if __name__ == "__main__":
    sys.exit(main())
