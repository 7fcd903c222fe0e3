"""The server under load: is it reachable, is it the mock, and what did it see during the run.

Against the mock the harness reads ``/_mock/stats`` and ``/_mock/timeline`` before and after the
run (it never resets the mock: a test's faults and cap stay as they were) and takes the server's
``max_in_flight`` from the timeline points added during the run. Against anything else the
programs' own start/end stamps stand in for the server's view.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import requests


class TargetError(RuntimeError):
    """The target cannot be reached (or is not a SandboxFusion-like server)."""


@dataclass
class MockSnapshot:
    stats: dict[str, Any]
    timeline_points: int


@dataclass
class ServerView:
    """What the mock saw between two snapshots."""

    max_in_flight: int | None
    requests: int
    by_status: dict[str, int]
    rejected_by_cap: int
    in_flight_now: int
    cap: int | None
    #: ``(seconds since the mock's origin, in flight)`` points added during the run.
    points: list[tuple[float, int]] = field(default_factory=list)
    exact: bool = True


class Target:
    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._session = requests.Session()
        self.is_mock = False

    def check(self) -> None:
        """Fail early, and clearly, when nothing answers at ``url``."""
        try:
            response = self._session.get(f"{self.url}/v1/ping", timeout=self.timeout)
        except requests.RequestException as exc:
            raise TargetError(f"cannot reach {self.url}: {type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise TargetError(f"{self.url}/v1/ping answered HTTP {response.status_code}")
        try:
            stats = self._session.get(f"{self.url}/_mock/stats", timeout=self.timeout)
            self.is_mock = stats.status_code == 200 and "max_in_flight" in stats.json()
        except (requests.RequestException, ValueError):
            self.is_mock = False

    def snapshot(self) -> MockSnapshot | None:
        if not self.is_mock:
            return None
        stats = self._get("/_mock/stats")
        timeline = self._get("/_mock/timeline")
        return MockSnapshot(stats, len(timeline.get("points", [])))

    def server_view(self, before: MockSnapshot) -> ServerView:
        after = self._get("/_mock/stats")
        timeline = self._get("/_mock/timeline")
        points = [(float(t), int(n)) for t, n in timeline.get("points", [])]
        requests_delta = int(after.get("requests_total", 0)) - int(before.stats.get("requests_total", 0))
        rejected = int(after.get("rejected_by_cap", 0)) - int(before.stats.get("rejected_by_cap", 0))
        # Each served request adds two points (enter, leave); the timeline is a bounded deque.
        expected = 2 * max(0, requests_delta - rejected)
        new_points = points[before.timeline_points :]
        exact = len(new_points) >= expected
        if not exact:  # the deque wrapped around during the run: its last points are ours
            new_points = points[-expected:] if expected else []
        peak: int | None = max((n for _t, n in new_points), default=0)
        status_delta = Counter({k: int(v) for k, v in after.get("by_status", {}).items()})
        status_delta.subtract({k: int(v) for k, v in before.stats.get("by_status", {}).items()})
        return ServerView(
            max_in_flight=peak,
            requests=requests_delta,
            by_status={k: v for k, v in sorted(status_delta.items()) if v},
            rejected_by_cap=rejected,
            in_flight_now=int(after.get("in_flight", 0)),
            cap=after.get("max_in_flight_cap"),
            points=new_points,
            exact=exact,
        )

    def add_faults(self, rules: list[dict[str, Any]]) -> list[str]:
        if not rules or not self.is_mock:
            return []
        response = self._session.post(f"{self.url}/_mock/faults", json=rules, timeout=self.timeout)
        if response.status_code != 201:
            raise TargetError(f"the mock refused the harness's fault rules: {response.text[:300]}")
        return [rule["id"] for rule in response.json()["faults"]]

    def remove_faults(self, ids: list[str]) -> None:
        for rule_id in ids:
            try:
                self._session.delete(f"{self.url}/_mock/faults/{rule_id}", timeout=self.timeout)
            except requests.RequestException:
                pass

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Give the mock a moment to finish answering (its in-flight count drops after the reply)."""
        import time

        deadline = time.monotonic() + timeout
        while self.is_mock and time.monotonic() < deadline:
            if int(self._get("/_mock/stats").get("in_flight", 0)) == 0:
                return
            time.sleep(0.02)

    def _get(self, path: str) -> dict[str, Any]:
        try:
            response = self._session.get(f"{self.url}{path}", timeout=self.timeout)
            data = response.json()
        except (requests.RequestException, ValueError) as exc:
            raise TargetError(f"{self.url}{path}: {exc}") from None
        return data if isinstance(data, dict) else {}

    def close(self) -> None:
        self._session.close()
