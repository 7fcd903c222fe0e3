"""What limits a forked program starts with, and what it must not inherit from the launcher's
interpreter: its rlimits (the run's confinement's, and SandboxFusion's ``memory_limit_MB``), the
default stack size of its threads under that limit (:class:`ThreadStackDefault`), and where its
recursion count starts (:class:`RecursionDepth`).
"""

import os
import resource

try:  # for the thread stacks of memory-limited programs, and the recursion count
    import ctypes
except ImportError:  # an interpreter built without libffi
    ctypes = None


def apply_memory_limit(megabytes: int) -> None:
    """SandboxFusion's limit: soft RLIMIT_AS, RLIMIT_DATA and RLIMIT_STACK of N MiB (within the
    hard limits the run's confinement set)."""
    if megabytes > 0:
        limit = megabytes * 1024 * 1024
        for which in (resource.RLIMIT_AS, resource.RLIMIT_DATA, resource.RLIMIT_STACK):
            hard = resource.getrlimit(which)[1]
            resource.setrlimit(which, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def apply_rlimits(limits: list) -> None:
    """The run's confinement's rlimits (``[resource, limit]``), soft and hard alike."""
    for which, limit in limits:
        resource.setrlimit(which, (limit, limit))


class ThreadStackDefault:
    """The default stack size of new threads that forked programs inherit from the launcher.

    glibc reads RLIMIT_STACK once, at a program's start, as the default stack size of new threads.
    Under SandboxFusion's ``memory_limit_MB`` (soft RLIMIT_STACK = RLIMIT_AS = N MiB) every new
    thread then asks for an N MiB stack inside an N MiB address space, so none can start ("can't
    start new thread"). A forked interpreter would keep the launcher's default instead, so before
    forking a memory-limited Python run the relay sets its own default (it starts no threads
    itself) to what glibc would have derived, and puts its own back for the next unlimited run.
    Done here rather than in the program: ctypes calls in a fresh fork cost about 1.5 ms of page
    faults, in the relay a few microseconds. glibc only (``pthread_setattr_default_np``);
    elsewhere this does nothing.
    """

    _ATTR_BYTES = 256  # a pthread_attr_t: 56 bytes on x86-64 glibc
    _PTHREAD_STACK_MIN = 16384

    def __init__(self) -> None:
        self._functions = None
        self._own = self._current = 0
        self._page = os.sysconf("SC_PAGE_SIZE")
        if ctypes is None:
            return
        try:
            libc = ctypes.CDLL(None)
            self._functions = (
                libc.pthread_attr_init,
                libc.pthread_attr_destroy,
                libc.pthread_attr_setstacksize,
                libc.pthread_attr_getstacksize,
                libc.pthread_getattr_default_np,
                libc.pthread_setattr_default_np,
            )
        except (OSError, AttributeError):
            return
        self._functions[2].argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        attr = ctypes.create_string_buffer(self._ATTR_BYTES)
        size = ctypes.c_size_t()
        if self._functions[4](attr) == 0:
            self._functions[3](attr, ctypes.byref(size))
            self._functions[1](attr)
        self._own = self._current = size.value

    def prepare(self, request: dict) -> None:
        """Set the default that the program of ``request`` must start with."""
        if self._functions is None or not self._own:
            return
        limit_mb = request.get("memory_limit_mb", -1) if request.get("mode") == "python" else -1
        if limit_mb > 0:
            page = self._page
            wanted = -(-max(limit_mb * 1024 * 1024, self._PTHREAD_STACK_MIN) // page) * page
        else:
            wanted = self._own
        if wanted == self._current:
            return
        attr_init, attr_destroy, attr_setstacksize, _, _, setattr_default = self._functions
        attr = ctypes.create_string_buffer(self._ATTR_BYTES)
        if attr_init(attr) == 0:
            try:
                if attr_setstacksize(attr, wanted) == 0 and setattr_default(attr) == 0:
                    self._current = wanted
            finally:
                attr_destroy(attr)


class RecursionDepth:
    """Where a forked program's recursion starts: at its ``<module>``, as in a fresh ``python <file>``.

    A forked program runs below the launcher's own frames (its loop, the relay's, the start of the
    run: eight on CPython 3.10), and the interpreter counts them against the recursion limit: a
    program that recursed 998 deep under SandboxFusion got a RecursionError here, and the one that
    hit the limit printed ``[Previous line repeated 988 more times]`` where SandboxFusion's printed
    996. The count is a field of the thread state (``recursion_depth`` on 3.10, counting up;
    ``recursion_remaining`` and ``py_recursion_remaining`` after it, counting down), with no API to
    set it: ctypes finds it once, here in the launcher, as the one int of the thread state that a
    call moves by one, and measures what ``exec`` adds. While the program runs, the count is shifted
    by the depth of the launcher's frames, and put back after; ``sys.getrecursionlimit()`` and the
    limit itself stay the program's. Where the field cannot be found (no ctypes, another layout)
    nothing is shifted, as before.
    """

    def __init__(self) -> None:
        self.field = None
        self.exec_adds = 0
        self.at_module = 0
        if ctypes is None:
            return
        try:
            get_state = ctypes.pythonapi.PyThreadState_Get
            get_state.restype = ctypes.c_void_p
            state = get_state()
            ints = [ctypes.c_int.from_address(state + offset) for offset in range(16, 64, 4)]
        except (AttributeError, OSError, TypeError, ValueError):
            return
        # The field moves by one per call, and by two per two calls.
        here = [field.value for field in ints]
        one = _values_one_call_down(ints)
        two = _values_two_calls_down(ints)
        moving = [
            field for field, a, b, c in zip(ints, here, one, two) if b - a in (1, -1) and c - a == 2 * (b - a)
        ]
        if len(moving) == 1:
            self.field = moving[0]

    def read(self) -> int:
        """The count, as a call of this method sees it (0 where it was not found)."""
        return self.field.value if self.field is not None else 0

    def measure(self, at_module: int) -> None:
        """``at_module``: :meth:`read` called at the launcher's module level, the depth of a fresh
        ``python <file>``'s ``<module>``: what a program's must see. Measures here what ``exec``
        adds, called as ``_launcher_python._run_main`` calls it."""
        if self.field is None:
            return
        self.at_module = at_module
        seen = []
        code = compile("seen.append(depth.read())", "<mocksandbox-depth>", "exec", dont_inherit=True)
        before = self.read()
        exec(code, {"seen": seen, "depth": self})
        self.exec_adds = seen[0] - before

    def shift_for_program(self, before: int) -> int:
        """Shift the count so that the ``<module>`` that ``exec`` runs next sees ``at_module``;
        ``before`` is :meth:`read` called from the frame that calls ``exec``. The shift, for
        :meth:`unshift`."""
        if self.field is None:
            return 0
        shift = self.at_module - self.exec_adds - before
        self.field.value += shift
        return shift

    def unshift(self, shift: int) -> None:
        if shift:
            self.field.value -= shift


def _values_one_call_down(ints: list) -> list:
    return [field.value for field in ints]


def _values_two_calls_down(ints: list) -> list:
    return _values_one_call_down(ints)
