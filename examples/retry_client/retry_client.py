"""A small SandboxFusion client with verl-like retry logic, written to be tested with mocksandbox.

Like verl's ``check_correctness`` client: only HTTP 504 is retried (3 attempts in all, sleeping
1 s then 2 s); a 429, any other status, a connection error, a timeout or bad JSON gives up at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import requests

MAX_ATTEMPTS = 3


@dataclass
class Outcome:
    """What the client concluded: the answer, or why there is none."""

    response: dict[str, Any] | None
    attempts: int
    error: str | None = None


def run_code(
    url: str,
    code: str,
    language: str = "python",
    run_timeout: float = 10,
    backoff: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    """POST ``code`` to ``url`` (a full ``/run_code`` URL), retrying 504 like verl does."""
    body = {"code": code, "language": language, "run_timeout": run_timeout, "compile_timeout": 10}
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            reply = requests.post(url, json=body, timeout=run_timeout + 10 + 10)
        except requests.RequestException as exc:
            return Outcome(None, attempt, f"request failed: {type(exc).__name__}")
        if reply.status_code == 504 and attempt < MAX_ATTEMPTS:
            sleep(backoff * 2 ** (attempt - 1))
            continue
        if reply.status_code != 200:
            return Outcome(None, attempt, f"HTTP {reply.status_code}")
        try:
            return Outcome(reply.json(), attempt)
        except ValueError:
            return Outcome(None, attempt, "bad JSON")
    return Outcome(None, MAX_ATTEMPTS, "HTTP 504")
