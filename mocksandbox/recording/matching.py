"""Which recorded exchange answers a request: the request as the sandbox sees it, normalised.

Two requests match when the sandbox would run the same thing for both: same method, path and
query, same body once validated (defaults filled in, unknown fields dropped, as SandboxFusion's
pydantic models do: ``{"code": "print(1)", "language": "python"}`` matches the same request with
``"run_timeout": 10`` spelled out), with volatile parts normalised (temp names, a swedev ``sid``
sent as an int or a string) and redacted fields left out. When nothing matches, :func:`nearest`
finds the closest recorded request and :func:`differences` says what differs, as ``responses``
explains why a matcher did not match.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from mocksandbox.recording.cassette import REDACTED, RecordedRequest

# Temp names a client may put into a request (a program that prints its own path, a pytest
# tmp_path in a file name): ``/tmp/tmpab12_xyz`` and ``/tmp/pytest-of-me/pytest-12/test_x0``.
_TEMP_NAMES = (
    (re.compile(r"(?:/[\w.\-]+)*?/pytest-of-[^/\s]+/pytest-\d+(?:/popen-gw\d+)?"), "<PYTEST_TMP>"),
    (re.compile(r"(?<![\w])tmp[a-z0-9_]{8}(?![a-z0-9_])"), "<TMP>"),
)
#: Fields that name a swedev session or instance: the sandbox reads an int and its decimal string alike.
_ID_FIELDS = frozenset({"sid", "instance_hash"})


@functools.cache
def _request_models() -> dict[str, type[BaseModel]]:
    # Imported here: the models pull in the engine's and datasets' modules, which a cassette
    # reader (the drift check) does not otherwise need.
    from mocksandbox.datasets.models import SubmitRequest
    from mocksandbox.jupyter.models import RunJupyterRequest
    from mocksandbox.models import RunCodeRequest

    return {"/run_code": RunCodeRequest, "/run_jupyter": RunJupyterRequest, "/submit": SubmitRequest}


def _model_for(path: str) -> type[BaseModel] | None:
    return _request_models().get(path)


def normalize_string(text: str) -> str:
    """``text`` with temp names replaced by placeholders."""
    for pattern, placeholder in _TEMP_NAMES:
        text = pattern.sub(placeholder, text)
    return text


def _normalize(value: Any, redact: frozenset[str], key: str | None = None) -> Any:
    if isinstance(value, dict):
        return {str(k): _normalize(v, redact, str(k)) for k, v in value.items() if str(k) not in redact}
    if isinstance(value, list):
        return [_normalize(v, redact) for v in value]
    if key in _ID_FIELDS and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        return normalize_string(value)
    return value


def _is_json_type(content_type: str | None) -> bool:
    # SandboxFusion parses a body with no Content-Type as JSON too (contract §0).
    if not content_type:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def request_view(request: RecordedRequest, redact: Iterable[str] = ()) -> dict[str, Any]:
    """What matching compares of ``request``: plain JSON data."""
    hidden = frozenset(redact)
    view: dict[str, Any] = {"method": request.method.upper(), "path": request.path, "query": request.query}
    if not _is_json_type(request.content_type):
        # Another content type is answered differently (a 422 quoting the raw body): keep it all.
        view["content_type"] = request.content_type
        view["body"] = normalize_string(request.body.decode("utf-8", errors="replace"))
        return view
    try:
        body: Any = json.loads(request.body) if request.body else None
    except (ValueError, RecursionError):
        view["body"] = normalize_string(request.body.decode("utf-8", errors="replace"))
        view["body_is_json"] = False
        return view
    model = _model_for(request.path) if request.method.upper() == "POST" else None
    if model is not None and isinstance(body, dict):
        try:
            # As the server sees it: defaults filled in, unknown fields dropped, lax coercion done.
            body = model.model_validate(body).model_dump(mode="json")
        except (ValidationError, ValueError):
            pass  # answered with a 422 that quotes the body: compare it as sent
    view["body"] = _normalize(body, hidden)
    return view


def view_key(view: dict[str, Any]) -> str:
    """A short stable key for a view: equal views, equal keys."""
    text = json.dumps(view, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()[:32]


def redact_data(data: Any, fields: frozenset[str]) -> tuple[Any, bool]:
    """``data`` with the values of keys named in ``fields`` (at any depth) replaced by
    :data:`REDACTED`; and whether anything was."""
    if not fields:
        return data, False
    if isinstance(data, dict):
        changed = False
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key in fields:
                out[key], changed = REDACTED, True
            else:
                out[key], inner = redact_data(value, fields)
                changed = changed or inner
        return out, changed
    if isinstance(data, list):
        items = [redact_data(item, fields) for item in data]
        return [item for item, _ in items], any(changed for _, changed in items)
    return data, False


@dataclass(frozen=True)
class Difference:
    """One field in which a request differs from a recorded one."""

    field: str
    sent: Any
    recorded: Any

    def describe(self, width: int = 70) -> str:
        text = f"{self.field}: sent {_short(self.sent, width)}, recorded {_short(self.recorded, width)}"
        if isinstance(self.sent, str) and isinstance(self.recorded, str):
            at = next(
                (i for i, (a, b) in enumerate(zip(self.sent, self.recorded, strict=False)) if a != b),
                min(len(self.sent), len(self.recorded)),
            )
            text += f" (first difference at character {at})"
        return text


_ABSENT = "<absent>"


def differences(sent: dict[str, Any], recorded: dict[str, Any]) -> list[Difference]:
    """The fields in which two views differ: top-level ones, and the body's own fields."""
    found: list[Difference] = []
    for name in ("method", "path", "query", "content_type"):
        if sent.get(name) != recorded.get(name):
            found.append(Difference(name, sent.get(name), recorded.get(name)))
    sent_body, recorded_body = sent.get("body"), recorded.get("body")
    if isinstance(sent_body, dict) and isinstance(recorded_body, dict):
        for name in [*sent_body, *(k for k in recorded_body if k not in sent_body)]:
            a, b = sent_body.get(name, _ABSENT), recorded_body.get(name, _ABSENT)
            if a != b:
                found.append(Difference(name, a, b))
    elif sent_body != recorded_body:
        found.append(Difference("body", sent_body, recorded_body))
    return found


def _distance(diffs: Sequence[Difference]) -> float:
    # Fewer differing fields first; among equals, the most similar texts.
    total = 0.0
    for diff in diffs:
        a = diff.sent if isinstance(diff.sent, str) else json.dumps(diff.sent, default=str)
        b = diff.recorded if isinstance(diff.recorded, str) else json.dumps(diff.recorded, default=str)
        total += 1.0 - difflib.SequenceMatcher(None, a[:1000], b[:1000], autojunk=False).ratio()
    weight = 100.0 if any(d.field in ("method", "path") for d in diffs) else 0.0
    return weight + len(diffs) + total


def nearest(
    sent: dict[str, Any], recorded: Iterable[tuple[str, dict[str, Any]]]
) -> tuple[str, list[Difference]] | None:
    """The key of the recorded view closest to ``sent`` and how they differ (None if none)."""
    best: tuple[float, str, list[Difference]] | None = None
    for label, view in recorded:
        diffs = differences(sent, view)
        score = _distance(diffs)
        if best is None or score < best[0]:
            best = (score, label, diffs)
    return None if best is None else (best[1], best[2])


def _short(value: Any, width: int) -> str:
    text = repr(value) if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."
