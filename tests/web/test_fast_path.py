"""The direct path for POST /run_code answers exactly what the Flask view answers."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask

from mocksandbox.core import MockSandbox
from mocksandbox.settings import Settings
from mocksandbox.web import create_app
from mocksandbox.web.fast_path import RunCodeFastPath

JSON = "application/json"

#: (raw body, content type): answered below Flask when they validate, by Flask otherwise.
CASES: list[tuple[bytes, str | None]] = [
    (b'{"code": "print(6*7)", "language": "python"}', JSON),
    (b'{"code": "print(6*7)", "language": "python"}', None),  # no content type: parsed as JSON
    (b'{"code": "import sys; print(sys.stdin.read()[::-1])", "language": "python", "stdin": "abc"}', JSON),
    (b'{"code": "echo hi >&2; exit 3", "language": "bash"}', JSON),
    (b'{"code": "raise SystemExit(\\"no\\")", "language": "python"}', JSON),
    (b'{"code": "print(1)", "language": "python", "run_timeout": "NaN"}', JSON),
    (b'{"code": "print(1)", "language": "python", "run_timeout": -Infinity}', JSON),
    (b'{"code": "print(\\"\\ud83d\\")", "language": "python"}', JSON),  # unencodable answer: SF's 500
    (b'{"code": "print(open(\\"a.txt\\").read())", "language": "python", "files": {"a.txt": "aGk="},'
     b' "fetch_files": ["a.txt", "missing"]}', JSON),
    (b'{"code": "print(1)", "language": "python", "files": {"a": "%%%"}}', JSON),  # bad base64
    (b'{"code": "print(1)", "language": "sql"}', JSON),
    (b'{"code": 1, "language": "python"}', JSON),  # 422: Flask answers
    (b'{"code": "x", "language": NaN}', JSON),  # 422 echoing NaN: SandboxFusion's 500
    (b"[" * 1000 + b"]" * 1000, JSON),  # too deep: 400
    (b"code=1", "application/x-www-form-urlencoded"),
    (b"", JSON),
]


def _flask_only(app: Flask) -> Flask:
    """The same app with the direct path taken out of its chain of layers."""
    layer: Any = app.wsgi_app
    while not isinstance(layer.app, RunCodeFastPath):
        layer = layer.app
    layer.app = layer.app.app
    return app


def _normalised(status: int, headers: dict[str, str], body: bytes) -> tuple[Any, ...]:
    text = re.sub(r"tmp\w{8}", "tmpXXXXXXXX", body.decode("utf-8", "replace"))  # temp names
    data = json.loads(text)
    if isinstance(data, dict):
        if status == 500:
            data.pop("traceback", None)  # frames differ; the shape is checked below
        for key in ("compile_result", "run_result"):
            if isinstance(data.get(key), dict) and data[key].get("execution_time") is not None:
                data[key]["execution_time"] = "T"
    return status, headers.get("Content-Type"), data


@pytest.fixture(scope="module")
def sandbox() -> Iterator[MockSandbox]:
    box = MockSandbox.create(Settings())
    yield box
    box.close()


@pytest.mark.parametrize("raw, content_type", CASES)
def test_the_direct_path_answers_as_flask(sandbox: MockSandbox, raw: bytes, content_type: str | None) -> None:
    fast_app, flask_app = create_app(sandbox), _flask_only(create_app(sandbox))
    headers = {"Content-Type": content_type} if content_type else {}
    answers = []
    for app in (fast_app, flask_app):
        reply = app.test_client().post("/run_code", data=raw, headers=headers)
        answers.append(_normalised(reply.status_code, dict(reply.headers), reply.get_data()))
        if reply.status_code == 500:
            assert isinstance(reply.get_json()["traceback"], list)
    assert answers[0] == answers[1]
    assert sandbox.take_errors() == []  # SandboxFusion's own 500s are not server errors


def test_well_formed_requests_skip_flask(sandbox: MockSandbox) -> None:
    app = create_app(sandbox)
    layer: Any = app.wsgi_app
    while not isinstance(layer, RunCodeFastPath):
        layer = layer.app
    client = app.test_client()
    assert client.post("/run_code", json={"code": "print(1)", "language": "python"}).status_code == 200
    assert client.post("/run_code", json={"code": 1, "language": "python"}).status_code == 422
    assert client.get("/run_code").status_code == 405
    assert layer.answered == 1
    assert [e.status for e in sandbox.requests(path="/run_code")][-3:] == [200, 422, 405]
