"""The warm Python program: the forked launcher turned into ``python <file>``.

Fresh module table, argv, cwd, environment, stdio, ``__main__``, signals and exit handling, as
CPython's own start-up and ``pymain_run_file`` make them, and a recursion count that starts where
a fresh interpreter's does (``_launcher_limits.RecursionDepth``). What a forked program would
otherwise redo in each fork is done once in the launcher, before its first fork: the programs'
std streams (:func:`make_program_stdio`), the compiler's and the io stack's first-time work
(:func:`warm_up`), and the module table given back the shape of a fresh interpreter's
(:func:`forget_launcher_modules`).
"""

import _signal
import _warnings
import atexit  # kept: a program's exit runs it without importing it again
import builtins
import os
import sys

import _launcher_state as state
from _launcher_limits import apply_memory_limit
from _launcher_protocol import read_all


def _stdio_encoding_and_errors(fd: int) -> tuple:
    """What CPython's start-up chose for std stream ``fd``, read off the launcher's own streams;
    for one the launcher was started without (``None``): the others' encoding, and the errors
    CPython gives that stream (stderr always ``backslashreplace``)."""
    own = (sys.__stdin__, sys.__stdout__, sys.__stderr__)[fd]
    if own is not None:
        return own.encoding, own.errors
    other = sys.__stdout__ or sys.__stdin__ or sys.__stderr__
    encoding = other.encoding if other is not None else sys.getfilesystemencoding()
    if fd == 2:
        return encoding, "backslashreplace"
    sibling = (sys.__stdout__, sys.__stdin__)[fd]  # stdin's errors are stdout's, and back
    return encoding, sibling.errors if sibling is not None else "strict"


def _make_stdio(fd: int, mode: str) -> object:
    """A text stream on ``fd`` configured as CPython's start-up configures its std streams."""
    encoding, errors = _stdio_encoding_and_errors(fd)
    stream = open(  # noqa: SIM115 - lives as long as the program
        fd,
        mode,
        encoding=encoding,
        errors=errors,
        newline="\n",
        closefd=False,
    )
    if "w" in mode:
        stream.reconfigure(line_buffering=fd == 2 or os.isatty(fd))
    return stream


def make_program_stdio() -> tuple:
    """The std streams of every forked program, built once in the launcher.

    A program's descriptors 0, 1 and 2 are always pipes, so the streams are built here on pipes
    dup'ed onto 0, 1 and 2 (what a stream learns at creation, seekable or not, a tty or not, its
    buffer size, is then what it would learn in the program), and the launcher's own descriptors
    are put back. A stream holds only the descriptor number: in the forked program it reads and
    writes the run's pipes, with empty buffers.
    """
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    read_end, write_end = os.pipe()
    try:
        os.dup2(read_end, 0)
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
        return (_make_stdio(0, "r"), _make_stdio(1, "w"), _make_stdio(2, "w"))
    finally:
        for fd, original in enumerate(saved):
            os.dup2(original, fd)
            os.close(original)
        os.close(read_end)
        os.close(write_end)


#: The launcher's own std streams, referenced here so that a program replacing them does not pay
#: for tearing them down (they never close their descriptors: CPython opens them closefd=False).
_LAUNCHER_STDIO = (sys.stdin, sys.stdout, sys.stderr)


#: Put first among the warning filters while a relay compiles a program: every warning then fails
#: the compile, and the program compiles its file itself (a SyntaxWarning is the program's to show,
#: on its stderr; the filters are the C module's, the ``warnings`` module being no program's).
_EVERY_WARNING_AN_ERROR = ("error", None, Warning, None, 0)
#: The call that tells the interpreter its filters changed (``None`` where it has another name:
#: relays then leave every compile to the program).
_FILTERS_MUTATED = getattr(_warnings, "_filters_mutated", None)


#: The code of the last source this relay compiled, by source, given back under the run's own file
#: name (:func:`_with_filename`). verl and SandboxFusion's datasets send a program once per test
#: case, the same source with another stdin: a relay that serves them one after another compiles
#: it once (about 40 µs and 50 page faults a run less). One source only: what the relay holds, its
#: next program can reach, and a run must not find another run's code there (the program it forks
#: finds its own). Only a small one: each fork copies it.
_COMPILED: dict = {}
_COMPILED_SOURCE_MAX = 8192


def prepare_python_program(path: str, source: "str | None") -> tuple:
    """In the relay, before its fork: the ``sys.argv``, ``sys.path[0]`` and ``__main__`` module of
    ``python <path>``, as CPython's start-up and ``pymain_run_file`` make them, and its code where
    the run brought ``source`` (made here, where their pages cost no copy: see
    ``_launcher_program.prepare_program``)."""
    import _frozen_importlib_external  # in every interpreter's module table already

    main = type(sys)("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__annotations__ = {}
    main.__loader__ = _frozen_importlib_external.SourceFileLoader("__main__", path)
    main.__builtins__ = builtins
    return [path], os.path.dirname(path), main, _compile_before_fork(path, source)


def _compile_before_fork(path: str, source: "str | None") -> object:
    """The code of ``source`` (what the server wrote to ``path``), compiled in the relay: about 70
    page faults less in the program (its file's read, the compiler's work), which would copy each
    page they write. ``None`` leaves it to the program (``_run_main``), as before: no source came,
    or it does not compile, or it warns as it compiles.

    Called as deep in the relay's frames as ``_run_main`` is in the program's (three below
    ``_relay_one_run``): the compiler's nesting limit counts the frames below it, and is then the
    same in either. The relay is in none of the run's cgroups: what it compiles is kept small by
    the message it comes in (``Launcher.launch``), and the compiler's own limits (nesting, constant
    folding) keep the work on a small source small. A source compiled here before is not compiled
    again (see ``_COMPILED``): what compiles from one file name compiles the same from any other,
    but for the name its code objects carry."""
    known = _COMPILED.get(source)
    if known is not None:
        return _with_filename(known, path)
    _COMPILED.clear()  # (another run's code: this run's program must not find it)
    if source is None or _FILTERS_MUTATED is None:
        return None
    filters = _warnings.filters
    filters.insert(0, _EVERY_WARNING_AN_ERROR)
    _FILTERS_MUTATED()
    try:
        code = compile(source.encode("utf-8"), path, "exec", dont_inherit=True)
    except Exception:  # SyntaxError (a warning, too), ValueError, RecursionError, MemoryError...
        return None
    finally:
        if filters and filters[0] is _EVERY_WARNING_AN_ERROR:
            del filters[0]
        _FILTERS_MUTATED()
    if len(source) <= _COMPILED_SOURCE_MAX:
        _COMPILED[source] = code
    return code


def _with_filename(code: object, path: str) -> object:
    """``code`` as compiled from ``path``: each of its code objects (its functions', classes',
    lambdas' and comprehensions', which the compiler puts among their parent's constants, never
    deeper) with that file name."""
    if code.co_filename == path:
        return code
    consts = tuple(
        _with_filename(const, path) if type(const) is type(code) else const for const in code.co_consts
    )
    return code.replace(co_filename=path, co_consts=consts)


def become_python_program(request: dict, prepared: tuple) -> None:
    """Turn this forked launcher into ``python <file>``; never returns. ``prepared``: what
    :func:`prepare_python_program` made for it."""
    argv, path_first, main, compiled = prepared
    path = argv[0]
    if request.get("world") is None:  # (a world's program is in its dir already: World.enter)
        os.chdir(request["cwd"])
    env = request["env"]
    if env is not None:  # None: the launcher's own environment, nothing to do
        os.environ.clear()
        os.environ.update(env)
    sys.argv = argv
    sys.path[0] = path_first
    stdin, stdout, stderr = state.PROGRAM_STDIO
    sys.stdin = sys.__stdin__ = stdin
    sys.stdout = sys.__stdout__ = stdout
    sys.stderr = sys.__stderr__ = stderr
    # What CPython's start-up sets: SIGPIPE and SIGXFSZ ignored, SIGINT -> KeyboardInterrupt, the
    # rest (that the launcher changed) at their defaults; nothing blocked.
    _signal.signal(_signal.SIGPIPE, _signal.SIG_IGN)
    _signal.signal(_signal.SIGXFSZ, _signal.SIG_IGN)
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
    # (The default stack size of new threads was set for this limit before the fork.)
    apply_memory_limit(request.get("memory_limit_mb", -1))

    sys.modules["__main__"] = main
    os._exit(_run_main(path, main, compiled))


def _run_main(path: str, main: object, compiled: object) -> int:
    """Run the program as CPython's ``pymain_run_file`` does; its exit code. ``compiled``: its
    code, if its relay compiled it (else read and compiled here)."""
    code = 0
    try:
        if compiled is None:
            compiled = compile(_read_file(path), path, "exec", dont_inherit=True)
        depth = state.RECURSION
        shift = depth.shift_for_program(depth.read()) if depth is not None else 0
        try:
            exec(compiled, main.__dict__)
        finally:
            if depth is not None:
                depth.unshift(shift)
    except SystemExit as exc:
        code = _system_exit_code(exc)
    except BaseException as exc:
        tb = exc.__traceback__
        # Hide the launcher's own frame: the traceback starts at the program's <module>.
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        exc.__traceback__ = tb
        try:
            sys.excepthook(type(exc), exc, tb)
        except SystemExit as hook_exit:
            code = _system_exit_code(hook_exit)
        else:
            code = 1
        if isinstance(exc, KeyboardInterrupt):
            code = _finish(code)
            _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
            os.kill(os.getpid(), _signal.SIGINT)
            return 128 + _signal.SIGINT
    return _finish(code)


def _read_file(path: str) -> bytes:
    """The file's bytes (see ``read_all``)."""
    return read_all(os.open(path, os.O_RDONLY | os.O_CLOEXEC))


def _system_exit_code(exc: SystemExit) -> int:
    value = exc.code
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    try:
        sys.stderr.write(f"{value}\n")
    except Exception:
        pass
    return 1


def _finish(code: int) -> int:
    """Interpreter shutdown as far as a program can see it: threads, atexit, flushing."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = 120
    return code


def forget_launcher_modules(baseline: frozenset) -> None:
    """Give the module table back the shape of a fresh interpreter's, once, before any fork.

    The launcher keeps using the modules it imported (its functions hold them); a program that
    imports them gets new ones, as a fresh ``python <file>`` would.
    """
    for name in list(sys.modules):
        if name not in baseline:
            del sys.modules[name]


def warm_up() -> None:
    """Do once, here, the lazy first-time work of the compiler and the io stack (a few
    milliseconds on a small VM) that every forked program would otherwise repeat."""
    import _frozen_importlib_external  # noqa: F401 - the loader class the programs' __main__ uses

    source = b"import sys\nvalue = [i * 2 for i in range(3)]\nprint(value, file=sys.stderr)\n"
    code = compile(source, "<mocksandbox-warm-up>", "exec", dont_inherit=True)
    sink = open(os.devnull, "w", encoding="utf-8", errors="strict", newline="\n")  # noqa: SIM115
    saved, sys.stderr = sys.stderr, sink
    try:
        exec(code, {"__name__": "__warm__", "__builtins__": builtins})
    finally:
        sys.stderr = saved
        sink.close()
