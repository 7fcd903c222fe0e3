"""The launcher: a small, single-threaded process that forks every run for the server.

Started once per engine as ``<python> <this dir>/__main__.py <socket fd>`` (standard library only,
so any interpreter can run it, with nothing of the user's imported; the server's side is this
package's ``__init__.py``, which this process never imports). It forks *relays*; a relay forks
one *program* per run and reports how it ended; a relay serves many runs, one at a time. Each part
is a module of this dir, which is ``sys.path[0]`` here, so they import each other by their
top-level names:

``_launcher_protocol``  the wire protocol: run messages in, status records out
``_launcher_serve``     the launcher's loop: relays forked, orphans reaped, cgroup moves kept fast
``_launcher_relay``     a relay's life: one program per run, its status reported
``_launcher_watch``     a relay's watch on the server while a program runs (SIGIO)
``_launcher_program``   the program's start: session, cgroups, limits, stdio, ``execve``
``_launcher_python``    the warm Python program: this interpreter turned into ``python <file>``
``_launcher_limits``    rlimits, thread stacks and the recursion count a program starts with
``_launcher_world``     a run's world (isolation lite): a relay's namespaces, each run's root
``_launcher_devices``   the runs' /dev, made once per relay
``_launcher_ipc``       what runs leave in the relay's IPC namespace, and a new one where they do
``_launcher_reaping``   the relay as its runs' PID 1: the program waited for, orphans reaped
``_launcher_mask``      the mask layer that hides the server's secrets and state from runs
``_launcher_kept``      a root kept from run to run for runs that touch only their own dir
``_launcher_users``     uid maps: runs as an unprivileged range of host uids (joined by a world's
                        relays, or by each program where the relays stay the host's root)
``_launcher_syscalls``  the system calls, by ctypes, bound once
``_launcher_state``     the one home of every value set at start or rebound at run time

Their names start with ``_launcher_``: with this dir first on ``sys.path``, a module named as one
of the standard library's (``signal``, ``select``, ``types``...) would be imported in its place,
by this process and by the standard library's own imports. No program sees them: a warm Python
program's module table is given back the shape of a fresh interpreter's before the first fork
(``_launcher_python.forget_launcher_modules``, with the table captured below before anything of
the launcher is imported), and its ``sys.path[0]`` is its own dir, not this one.

Why the server runs this file rather than ``python <this dir>``: an interpreter given a dir runs
its ``__main__.py`` through ``runpy``, which imports modules a fresh ``python <file>`` does not
have (``runpy`` and what it needs: 19 more on CPython 3.10, ``importlib.util`` and others on
3.13), and they would stay in every program's module table; and it runs this module below
``runpy``'s frames, where the recursion count read at module level (``RecursionDepth.measure``)
is not a fresh ``<module>``'s (a program recursed 3 levels less deep on 3.10).

Why separate processes: the server is multi-threaded and large; forking it per run is slow and
unsafe, and a program that kills its parent must not kill the server, nor the launcher: it kills
its relay only, and that run alone reports -9.
"""

import sys

# Captured first: the modules a fresh `python <file>` has too. Everything imported after this
# line belongs to the launcher and is dropped from the program's module table.
_BASELINE_MODULES = frozenset(sys.modules)

import _socket  # noqa: E402
import os  # noqa: E402

# The server's linker setting, for the launcher alone (see __init__.launcher_env): the dynamic
# linker read it at the start; programs must not find it in their environment.
if os.environ.pop("MOCKSANDBOX_LAUNCHER_BIND_NOW", None) is not None:
    os.environ.pop("LD_BIND_NOW", None)

# This dir is sys.path[0], but for an interpreter told not to put it there (3.11's -P or
# PYTHONSAFEPATH, which the runs' environment may carry): there it is, while the launcher's
# modules are imported, and only then (the programs' sys.path stays as it was).
_SAFE_PATH = getattr(sys.flags, "safe_path", False)
if _SAFE_PATH:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _launcher_state as state  # noqa: E402
from _launcher_limits import RecursionDepth  # noqa: E402
from _launcher_protocol import parse_json, read_all  # noqa: E402
from _launcher_serve import open_missing_std_fds, serve  # noqa: E402
from _launcher_syscalls import Syscalls, ctypes  # noqa: E402
from _launcher_users import RunUsers  # noqa: E402

if _SAFE_PATH:
    del sys.path[0]

if __name__ == "__main__":
    open_missing_std_fds()
    if ctypes is not None:
        state.SYSCALLS = Syscalls()
    state.RECURSION = RecursionDepth()
    state.RECURSION.measure(state.RECURSION.read())  # read here, at module level: see measure()
    for option in sys.argv[2:]:
        if option.startswith("--cpus="):
            state.PROGRAM_CPUS = {int(cpu) for cpu in option[len("--cpus=") :].split(",")}
        elif option == "--relays-roam":
            state.RELAYS_ROAM = True
        elif option.startswith("--world-fd="):
            # On a pipe, not on the command line: a program must not read in its /proc/self/cmdline
            # (the launcher's, for a forked one) what is hidden from it.
            state.WORLD_CONFIG = parse_json(read_all(int(option[len("--world-fd=") :])))
            if state.WORLD_CONFIG.get("userns") is not None:
                try:
                    state.USERS = RunUsers(state.WORLD_CONFIG, state.SYSCALLS)
                except OSError as exc:
                    state.USERS_ERROR = f"cannot make the runs' user namespace: {exc}"
    server_socket = _socket.socket(fileno=int(sys.argv[1]))
    if state.WORLD_CONFIG is not None and state.WORLD_CONFIG.get("userns") is not None:
        # Ready: the server may now write the runs' files where the relays will see them.
        server_socket.send(b"ready")
    serve(server_socket, _BASELINE_MODULES)
