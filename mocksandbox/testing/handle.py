"""What a test holds (:class:`MockSandboxHandle`), and how a test's server is readied and checked.

The fixtures of :mod:`mocksandbox.pytest_plugin` hand a handle out through :func:`handle_for_test`:
the server's state is reset and shaped by the test's markers when the test starts, and what failed
inside the server while it ran is re-raised when it ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from mocksandbox.core import MockSandbox
    from mocksandbox.faults import FaultRule
    from mocksandbox.journal import JournalEntry
    from mocksandbox.serving.fleet import Fleet
    from mocksandbox.serving.workers import PoolControl

#: The base URL ``mocksandbox_inprocess`` answers on (``requests`` calls only, no socket).
INPROCESS_BASE_URL = "http://mocksandbox.test"


class MockSandboxHandle:
    """What a test holds: the sandbox's state and helpers to shape and inspect it."""

    def __init__(self, sandbox: MockSandbox | PoolControl | Fleet, url: str) -> None:
        #: The sandbox behind the server (a :class:`~mocksandbox.serving.workers.PoolControl` for workers,
        #: a :class:`~mocksandbox.serving.fleet.Fleet` for a Ray fleet).
        self.sandbox = sandbox
        #: Base URL of the server (``http://127.0.0.1:<port>``).
        self.url = url

    @property
    def run_code_url(self) -> str:
        return f"{self.url}/run_code"

    # -- faults ------------------------------------------------------------------------------

    def add_fault(self, spec: dict[str, Any] | None = None, **parts: Any) -> FaultRule:
        """Add a fault rule (see :mod:`mocksandbox.faults`)."""
        return self.sandbox.add_fault(spec, **parts)

    def fail(
        self, status: int, path: str | None = "/run_code", retry_after: float | None = None, **schedule: Any
    ) -> FaultRule:
        """Answer ``status`` (e.g. 429, 500, 504) on matching requests, per ``schedule``."""
        action: dict[str, Any] = {"type": "status", "status": status}
        if retry_after is not None:
            action["retry_after"] = retry_after
        return self.add_fault(match={"path": path}, action=action, schedule=schedule)

    def delay(self, seconds: float, path: str | None = "/run_code", **schedule: Any) -> FaultRule:
        """Hold matching requests for ``seconds`` before serving them."""
        return self.add_fault(
            match={"path": path}, action={"type": "delay", "seconds": seconds}, schedule=schedule
        )

    def drop(self, mode: str = "reset", path: str | None = "/run_code", **schedule: Any) -> FaultRule:
        """Drop matching connections without an answer (``reset`` or ``close``)."""
        return self.add_fault(match={"path": path}, action={"type": mode}, schedule=schedule)

    def sandbox_error(
        self, message: str | None = None, path: str | None = "/run_code", **schedule: Any
    ) -> FaultRule:
        """Answer 200 with ``status: SandboxError`` on matching requests."""
        action: dict[str, Any] = {"type": "sandbox_error"}
        if message is not None:
            action["message"] = message
        return self.add_fault(match={"path": path}, action=action, schedule=schedule)

    def output_mode(self, mode: str = "sandboxfusion", **match: Any) -> FaultRule:
        """Serve matching requests (all, by default) with this output mode: ``sandboxfusion`` for
        SandboxFusion's stalling reader, ``complete`` for the mock's (see
        :mod:`mocksandbox.divergence`)."""
        return self.add_fault(match=match, action={"type": "output_mode", "mode": mode})

    def clear_faults(self) -> None:
        self.sandbox.clear_faults()

    # -- capacity, journal, stats --------------------------------------------------------------

    def set_capacity(self, **policy: Any) -> None:
        """Server-side cap: ``max_in_flight``, ``overload`` (reject/queue), ``queue_timeout_s``, ..."""
        self.sandbox.set_capacity(**policy)

    def requests(self, **filters: Any) -> list[JournalEntry]:
        """Journal entries matching ``path``, ``method``, ``language`` and/or ``status``."""
        return self.sandbox.requests(**filters)

    def assert_requests(self, count: int, **filters: Any) -> list[JournalEntry]:
        """Assert exactly ``count`` matching requests; the failure shows the nearest calls."""
        return self.sandbox.assert_requests(count, **filters)

    def stats(self) -> dict[str, Any]:
        return self.sandbox.stats()

    def divergences(self) -> list[JournalEntry]:
        """The journal entries (since the test began) that SandboxFusion would have answered
        differently, each with its ``divergences`` notes."""
        return [entry for entry in self.sandbox.requests() if entry.divergences]

    def reset(self) -> None:
        self.sandbox.reset()


@contextmanager
def handle_for_test(
    box: MockSandbox | PoolControl | Fleet, url: str, node: pytest.Item
) -> Iterator[MockSandboxHandle]:
    """The test's handle on ``box`` (served at ``url``): reset and shaped by the test's markers
    before, and the server's errors re-raised after."""
    prepare_for_test(box, node)
    yield MockSandboxHandle(box, url)
    reraise_server_errors(box)


@contextmanager
def inprocess_handle_for_test(sandbox: MockSandbox, node: pytest.Item) -> Iterator[MockSandboxHandle]:
    """:func:`handle_for_test` without sockets: this process's ``requests`` calls to
    :data:`INPROCESS_BASE_URL` go into the app meanwhile (the ``responses`` library routes them)."""
    from mocksandbox.web.inprocess import route_requests_to

    with (
        handle_for_test(sandbox, INPROCESS_BASE_URL, node) as handle,
        route_requests_to(sandbox, INPROCESS_BASE_URL),
    ):
        yield handle


def prepare_for_test(box: MockSandbox | PoolControl | Fleet, node: pytest.Item) -> None:
    """Reset ``box`` and set the test's faults, cap, output mode and cassette from its markers."""
    # Reset at the start: another fixture's teardown may still have sent requests after the last test.
    box.wait_idle()
    box.reset()
    for marker in node.iter_markers("mocksandbox_faults"):
        for rule in marker.args:
            box.add_fault(rule)
    for marker in node.iter_markers("mocksandbox_capacity"):
        box.set_capacity(**marker.kwargs)
    for marker in node.iter_markers("mocksandbox_output_mode"):
        mode = marker.args[0] if marker.args else marker.kwargs.get("mode", "sandboxfusion")
        match = {k: v for k, v in marker.kwargs.items() if k != "mode"}
        box.add_fault({"match": match, "action": {"type": "output_mode", "mode": mode}})
    if node.get_closest_marker("mocksandbox_cassette") is not None:
        from mocksandbox.recording.pytest_support import use_cassette

        use_cassette(box, node)


def reraise_server_errors(box: MockSandbox | PoolControl | Fleet) -> None:
    """Raise the first exception the server raised while serving the test, noting where."""
    errors = box.take_errors()
    if errors:
        first = errors[0]
        first.exception.add_note(
            f"raised inside the mocksandbox server while serving {first.path}"
            + (f" ({len(errors) - 1} more server error(s))" if len(errors) > 1 else "")
        )
        raise first.exception
