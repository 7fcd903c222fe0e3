"""The launcher's state: the one home of every value set at its start or rebound while it runs.

The other modules read and set these through this module (``state.WORLD``), never copy them with
``from _launcher_state import WORLD``: such a copy is bound once, at import, and would never see
the value set later (at the launcher's start, in a new relay, for the run being watched).
"""

# -- set once, at the launcher's start (__main__ and _launcher_serve.serve) --------------------------

#: The cores programs get back when the server keeps the launcher to a share of them (--cpus=,
#: ``0,1,3``; see ``mocksandbox/execution/affinity.py``), or relays each to one (the launcher's
#: own: ``_launcher_serve.RelayCores``), else ``None``: programs inherit ours.
PROGRAM_CPUS = None
#: Relays left to move between cores (--relays-roam; else each is kept to one: ``RelayCores``).
RELAYS_ROAM = False
#: The libc calls (``Syscalls``), bound once in the launcher where ctypes is (worlds need them;
#: warm Python programs use them for their command line).
SYSCALLS = None
#: The interpreter's recursion count (``RecursionDepth``), which forked programs start at a fresh
#: one's.
RECURSION = None
#: The launcher's world settings (``--world-fd``), or ``None``: runs share the host's (isolation
#: none).
WORLD_CONFIG = None
#: The runs' unprivileged user (``RunUsers``), made when runs are one (``--world-fd`` with
#: ``userns``).
USERS = None
#: Why that could not be made: every run that asks for a world is then refused with it.
USERS_ERROR = None
#: The std streams of every forked Python program (see ``_launcher_python.make_program_stdio``),
#: set by ``serve`` before the first fork.
PROGRAM_STDIO: tuple = ()
#: The default stack size of new threads (``ThreadStackDefault``), set by ``serve``.
THREAD_STACKS = None
#: The core each new relay keeps to: the one the server asks for, else the next in turn
#: (``RelayCores``), set by ``serve``.
RELAY_CORES = None

# -- set in a relay ------------------------------------------------------------------------------

#: The relay's world (``World``), set in each relay that entered its world.
WORLD = None
#: This relay's socket with the server (for ``end_the_run``), once it is a relay.
RELAY_SOCKET = None
#: This relay's pid (as its own PID namespace numbers it): ``end_the_run`` acts in the relay only,
#: never in a program that inherited a signal it had pending (``Syscalls.fork``).
RELAY_PID: "int | None" = None
#: That socket's flags with and without ``O_ASYNC``, once its owner is set (one socket a relay).
RELAY_SOCKET_FLAGS: "tuple | None" = None
#: The status pipe of the run this relay is watching (for ``end_the_run``), while it watches.
WATCHED_STATUS_FD: "int | None" = None
#: The program a relay on the host is watching (for ``end_the_run``): from its fork until its
#: relay reaps it, while its pid can be no other process's.
WATCHED_PID: "int | None" = None
