"""What the pytest fixtures do with a :class:`~mocksandbox.core.MockSandbox`, done on a server
whose control state lives elsewhere: a worker pool's master
(:class:`~mocksandbox.serving.workers.PoolControl`) or a Ray fleet's control actor
(:class:`~mocksandbox.serving.fleet.Fleet`). The same names and meanings as
MockSandbox's; reading goes straight to the control state (exact, no HTTP), and a reset goes
through the server, which also resets the swedev sessions it holds."""

from __future__ import annotations

from typing import Any

from mocksandbox.control.state import (
    CapacityPolicy,
    ControlState,
    ServerError,
    assert_request_count,
    select_entries,
    wait_idle,
)
from mocksandbox.faults import FaultRule, validate_fault_spec
from mocksandbox.journal import JournalEntry


class ControlHandle:
    """Base of a handle on a running server: subclasses set :attr:`control` and :attr:`url`."""

    #: The server's control state (held in this process, or a client of where it is held).
    control: ControlState
    #: The server's base URL.
    url: str
    #: How long a ``POST /_mock/reset`` may take.
    reset_timeout_s: float = 60

    def add_fault(self, spec: Any = None, **parts: Any) -> FaultRule:
        (rule,) = self.add_faults([spec if spec is not None else parts])
        return rule

    def add_faults(self, specs: Any) -> list[FaultRule]:
        return self.control.add_faults([validate_fault_spec(spec) for spec in specs])

    def fault_rules(self) -> list[FaultRule]:
        return self.control.fault_rules()

    def clear_faults(self) -> list[str]:
        return self.control.clear_faults()

    def set_capacity(self, **changes: Any) -> CapacityPolicy:
        policy = self.control.capacity().changed(**changes)
        self.control.set_capacity(policy)
        return policy

    def stats(self) -> dict[str, Any]:
        return self.control.stats()

    def timeline(self) -> list[tuple[float, int]]:
        return self.control.timeline()

    def requests(self, **filters: Any) -> list[JournalEntry]:
        return select_entries(self.control.entries(), **filters)

    def assert_requests(self, count: int, **filters: Any) -> list[JournalEntry]:
        return assert_request_count(self.control.entries(), count, **filters)

    def take_errors(self) -> list[ServerError]:
        return self.control.take_errors()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        return wait_idle(self.control, timeout)

    def reset(self) -> None:
        """Everything back to the baseline, the server's swedev sessions included."""
        import requests

        reply = requests.post(
            f"{self.url}/_mock/reset",
            json={},
            timeout=self.reset_timeout_s,
            proxies={"http": "", "https": ""},
        )
        reply.raise_for_status()
