"""Drift check: send a cassette's requests to a deployment again and list what answers differently.

Requests go one at a time in cassette order, so a swedev episode replays as one: the ``sid`` the
deployment gives to a recorded ``/start_instance`` replaces the recorded one in the requests that
follow. Answers are compared as the differential contract mode compares them (execution times
dropped; temp paths, interpreter paths and locale quotes normalised; see
:mod:`mocksandbox.contract.corpus`), plus session ids, field by field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import requests

from mocksandbox.contract.corpus import normalize_text
from mocksandbox.contract.differential import normalize
from mocksandbox.recording.cassette import Exchange
from mocksandbox.recording.matching import normalize_string

#: Fields of answers that differ between any two runs and are never compared.
VOLATILE_FIELDS = frozenset({"execution_time", "executor_pod_name"})
#: Fields naming a session: compared as present or absent, not by value.
SESSION_FIELDS = frozenset({"sid"})
#: The wall-clock time pytest prints in its summary line (``2 passed in 0.03s``).
_PYTEST_TIME = re.compile(r"\bin \d+(?:\.\d+)?s\b")


@dataclass(frozen=True)
class Drift:
    """One field of one recorded exchange that the deployment now answers differently."""

    source: str
    request: str
    field: str
    recorded: Any
    now: Any


def comparable(status: int | None, body: bytes) -> dict[str, Any]:
    """What is compared of one answer, flattened to ``field.subfield`` keys."""
    try:
        data: Any = json.loads(body) if body else None
    except (ValueError, RecursionError):
        data = body.decode("utf-8", errors="replace")
    view = {"http_status": status, **_answer_view(data)}
    return {k: _volatile_text(v) if isinstance(v, str) else v for k, v in _flatten(view)}


def _volatile_text(text: str) -> str:
    # What contract normalisation leaves: bare temp names (pytest's ``tmpi8_94_ys.py .``) and times.
    return _PYTEST_TIME.sub("in <T>s", normalize_string(text))


def _answer_view(data: Any) -> dict[str, Any]:
    if isinstance(data, dict) and "run_result" in data:
        view = normalize(200, data)
        del view["http_status"]
        return view
    return {"body": _generic(data)}


def _generic(value: Any, key: str | None = None) -> Any:
    if key in SESSION_FIELDS and value is not None:
        return "<sid>"
    if isinstance(value, dict):
        if "run_result" in value:  # a run's answer inside another (a /submit test's exec_info)
            return _answer_view(value)
        return {k: _generic(v, k) for k, v in value.items() if k not in VOLATILE_FIELDS}
    if isinstance(value, list):
        return [_generic(v) for v in value]
    if isinstance(value, str):
        return normalize_text(value, drop_caret_lines=True)
    return value


def _flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for key, inner in value.items():
            yield from _flatten(inner, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, value


def _with_sessions(body: bytes, sessions: dict[str, Any]) -> bytes:
    if not sessions or b'"sid"' not in body:
        return body
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return body
    if isinstance(data, dict) and str(data.get("sid")) in sessions:
        live = sessions[str(data["sid"])]
        data["sid"] = int(live) if isinstance(data["sid"], int) and str(live).isdigit() else live
        return json.dumps(data, ensure_ascii=False).encode()
    return body


def _learn_session(recorded: bytes, now: bytes, sessions: dict[str, Any]) -> None:
    if b'"sid"' not in recorded:
        return
    try:
        before, after = json.loads(recorded), json.loads(now)
    except (ValueError, RecursionError):
        return
    if isinstance(before, dict) and isinstance(after, dict) and "sid" in before and "sid" in after:
        sessions[str(before["sid"])] = after["sid"]


def check(
    exchanges: Sequence[Exchange],
    url: str,
    timeout: float = 600.0,
    progress: Callable[[int, int], None] | None = None,
) -> list[Drift]:
    """Send every exchange's request to ``url`` in order; the fields whose answers changed."""
    base = url.rstrip("/")
    sessions: dict[str, Any] = {}
    found: list[Drift] = []
    with requests.Session() as session:
        session.headers.clear()
        for done, exchange in enumerate(exchanges, start=1):
            request = exchange.request
            # A new connection each (see mocksandbox.recording.forward): one request's 500 must not
            # make the next fail on a connection the deployment closed.
            headers = {"Connection": "close"}
            if request.content_type:
                headers["Content-Type"] = request.content_type
            target = base + request.path + (f"?{request.query}" if request.query else "")
            status: int | None
            try:
                reply = session.request(
                    request.method,
                    target,
                    data=_with_sessions(request.body, sessions),
                    headers=headers,
                    timeout=timeout,
                    allow_redirects=False,
                )
                status, body = reply.status_code, reply.content
            except requests.RequestException as exc:
                status, body = None, json.dumps({"error": type(exc).__name__}).encode()
            _learn_session(exchange.body, body, sessions)
            then, now = comparable(exchange.status, exchange.body), comparable(status, body)
            for field in [*then, *(k for k in now if k not in then)]:
                if then.get(field, "<absent>") != now.get(field, "<absent>"):
                    found.append(
                        Drift(
                            exchange.source,
                            request.describe(),
                            field,
                            then.get(field, "<absent>"),
                            now.get(field, "<absent>"),
                        )
                    )
            if progress is not None:
                progress(done, len(exchanges))
    return found


def _short(value: Any, width: int) -> str:
    text = repr(value) if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def format_table(drifts: Sequence[Drift], total: int) -> Iterator[str]:
    """The changes as a table, then a one-line verdict."""
    if drifts:
        yield f"{'recording':<22} {'request':<28} {'field':<20} {'recorded':<40} now"
        for drift in drifts:
            yield (
                f"{drift.source[-22:]:<22} {drift.request[:28]:<28} {drift.field[:20]:<20} "
                f"{_short(drift.recorded, 40):<40} {_short(drift.now, 40)}"
            )
    changed = len({d.source for d in drifts})
    yield f"{total - changed}/{total} recorded exchanges answered as recorded; {changed} changed"
