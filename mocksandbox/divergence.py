"""Where SandboxFusion would have answered differently (DESIGN seam 9), said beside the answer.

The mock's answers stay SandboxFusion's, byte for byte where it can. Where it knows that the real
service would have answered a request differently (a program whose output SandboxFusion's reader
would have cut or stalled on; a language whose toolchain the mock lacks), the code that knows it
calls :func:`note` while serving the request. The outermost layer (``web/middleware.py``) collects
the notes of each request with :func:`collecting` and hands them to the control state with the
answer: they land in the request's journal entry (``divergences``), are counted in
``/_mock/stats``, shown in the console's journal and printed in the pytest summary of the test that
sent the request. Never in the answer body.

Also here: the output mode asked for one request (a fault rule's ``output_mode`` action), which
the engine reads with :func:`requested_output_mode`.

Both travel in context variables: whatever serves a request runs in its thread, or in a pool
thread started with :func:`carry` (the online-judge cases of one ``/submit``).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any, Generic, Literal, ParamSpec, TypeVar

#: ``complete``: every stream drained while the program runs and kept up to ``max_output_bytes``
#: (the mock's default, the better sandbox). ``sandboxfusion``: SandboxFusion's reader, emulated
#: (``execution/process.py``): a stream is no longer read past 128 KiB, so a program that writes
#: more blocks once the socket buffer is full and the run ends at ``run_timeout``.
OutputMode = Literal["complete", "sandboxfusion"]

#: Bytes of one stream past which SandboxFusion's reader stops reading it (asyncio's StreamReader
#: pauses its transport above twice its 64 KiB limit). Up to this much, its answer is the mock's.
SANDBOXFUSION_READER_PAUSE_BYTES = 2 * 64 * 1024

#: Kinds of divergence (the part of a note before the first ``:``; stats count by kind).
OUTPUT = "output"
TOOLCHAIN = "toolchain"
#: A protection of the run's world that was asked for (``auto``) and this host could not give.
ISOLATION = "isolation"
#: User Python of another version than production's, or without a package production's runtime has.
RUNTIME = "runtime"
#: The run's relay ended without saying how the program ended (its answer's return code a guess).
RELAY = "relay"
#: The run was killed because all runs together reached the server's memory budget (SandboxFusion
#: keeps none: its host's OOM killer decides, for any process of the host).
MEMORY_BUDGET = "memory budget"

_notes: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "mocksandbox_divergences", default=None
)
_output_mode: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mocksandbox_output_mode", default=None
)

P = ParamSpec("P")
T = TypeVar("T")
V = TypeVar("V")


class _Setting(Generic[V]):
    """``with``: ``variable`` set to ``value`` inside, put back after (a class rather than a
    ``contextmanager`` generator: both are entered for every request)."""

    __slots__ = ("_token", "_value", "_variable")

    def __init__(self, variable: contextvars.ContextVar[Any], value: V) -> None:
        self._variable = variable
        self._value = value

    def __enter__(self) -> V:
        self._token = self._variable.set(self._value)
        return self._value

    def __exit__(self, *exc_info: object) -> None:
        self._variable.reset(self._token)


def collecting() -> _Setting[list[str]]:
    """Collect the notes made while serving one request (in this context and those it carries):
    ``with collecting() as notes``."""
    return _Setting(_notes, [])


def note(kind: str, detail: str) -> None:
    """Say that SandboxFusion would have answered the request being served differently (once per
    request and text; nothing happens outside a request)."""
    notes = _notes.get()
    text = f"{kind}: {detail}"
    if notes is not None and text not in notes:
        notes.append(text)


def kind_of(text: str) -> str:
    """The kind of a note (``output``, ``toolchain``, ...)."""
    return text.split(":", 1)[0]


def output_mode(mode: str | None) -> _Setting[str | None]:
    """Serve what runs inside with this output mode (``None``: the server's setting)."""
    return _Setting(_output_mode, mode)


def requested_output_mode(default: OutputMode) -> OutputMode:
    """The output mode of the request being served: a fault rule's, else ``default``."""
    mode = _output_mode.get()
    if mode == "sandboxfusion":
        return "sandboxfusion"
    if mode == "complete":
        return "complete"
    return default


def carry(fn: Callable[P, T]) -> Callable[P, T]:
    """``fn`` bound to the current context (notes and output mode), to run in another thread."""
    context = contextvars.copy_context()

    def in_context(*args: P.args, **kwargs: P.kwargs) -> T:
        return context.run(fn, *args, **kwargs)

    return in_context


def output_note(stream: str, size: int) -> str:
    """The divergence of a stream of ``size`` bytes that SandboxFusion's reader would have cut."""
    return (
        f"{stream} of {size} bytes: SandboxFusion stops reading a stream past 128 KiB, so it would "
        "have kept about 128-214 KiB of it and, once its socket buffer filled, left the program "
        "blocked until run_timeout (TimeLimitExceeded); output_mode sandboxfusion reproduces that"
    )
