"""Contract §0.1, row by row: what SandboxFusion answers to malformed and extreme input, through the
Flask test client. Bodies are raw bytes: NaN, Infinity and ``\\ud83d`` escapes are JSON tokens the
client sends as text, which ``json=`` could not produce.

Plus the mock's own endpoints (swedev, ``/_mock/``), which SandboxFusion does not have: the same
input must give them a valid JSON answer, never a 500.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from mocksandbox.core import MockSandbox
from mocksandbox.settings import Settings
from mocksandbox.web import create_app

PYDANTIC_URL = "https://errors.pydantic.dev/2.6/v/"
PARSE_ERROR = {"detail": "There was an error parsing the body"}
NOT_COMPLIANT = "Out of range float values are not JSON compliant"
NAN_MESSAGE = ": cannot convert float NaN to integer | None"

#: Every POST endpoint that parses a JSON body: SandboxFusion's, then swedev's.
SANDBOXFUSION_POSTS = [
    "/run_code",
    "/run_jupyter",
    "/list_ids",
    "/get_prompts",
    "/get_prompt_by_id",
    "/submit",
    "/get_metrics",
    "/get_metrics_function",
]
SWEDEV_POSTS = ["/start_instance", "/process_action", "/postprocess", "/compute_reward"]


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("malformed") / "runs"


@pytest.fixture(scope="module")
def box(runs_root: Path) -> Iterator[MockSandbox]:
    runs_root.mkdir()
    sandbox = MockSandbox.create(Settings(pod_name=None, tmp_root=str(runs_root)))
    yield sandbox
    sandbox.close()


@pytest.fixture(scope="module")
def app(box: MockSandbox) -> Flask:
    return create_app(box)


@pytest.fixture
def client(app: Flask, box: MockSandbox) -> Iterator[FlaskClient]:
    box.reset()
    yield app.test_client()
    # Contract answers, 500s included, are not bugs: nothing may be recorded as a server error.
    assert box.take_errors() == []


def post(client: FlaskClient, path: str, raw: bytes, method: str = "POST") -> TestResponse:
    return client.open(path, method=method, data=raw, content_type="application/json")


def strict_json(response: TestResponse) -> Any:
    """The body as strict JSON: UTF-8, and no NaN or Infinity tokens."""

    def reject(token: str) -> Any:
        raise AssertionError(f"{token} in the answer: not valid JSON\n{response.get_data()!r}")

    return json.loads(response.get_data().decode("utf-8"), parse_constant=reject)


def assert_global_500(response: TestResponse, detail: str | re.Pattern[str]) -> None:
    """SandboxFusion's global handler: 500, ``{"detail": str(exc), "traceback": [str, ...]}``."""
    assert response.status_code == 500, response.get_data()
    assert response.mimetype == "application/json"
    body = strict_json(response)
    assert list(body) == ["detail", "traceback"]
    if isinstance(detail, str):
        assert body["detail"] == detail
    else:
        assert detail.fullmatch(body["detail"]), body["detail"]
    assert isinstance(body["traceback"], list) and body["traceback"]
    assert all(isinstance(line, str) for line in body["traceback"])


# -- row 1: nesting past the parser's limit ----------------------------------------------------------

DEEP_BODIES = {
    "array_1000": b"[" * 1000 + b"]" * 1000,
    "object_2000": b'{"a":' * 2000 + b"1" + b"}" * 2000,
    "deep_field": b'{"code":' + b"[" * 1000 + b"]" * 1000 + b',"language":"python"}',
}


@pytest.mark.parametrize("path", SANDBOXFUSION_POSTS + SWEDEV_POSTS)
@pytest.mark.parametrize("name", list(DEEP_BODIES))
def test_nesting_past_the_parser_limit_is_a_400(client: FlaskClient, path: str, name: str) -> None:
    response = post(client, path, DEEP_BODIES[name])
    assert (response.status_code, strict_json(response)) == (400, PARSE_ERROR)


@pytest.mark.parametrize("path", SANDBOXFUSION_POSTS + SWEDEV_POSTS)
def test_100_levels_still_parse(client: FlaskClient, path: str) -> None:
    response = post(client, path, b"[" * 100 + b"]" * 100)
    assert response.status_code == 422
    [item] = strict_json(response)["detail"]
    assert (item["type"], item["loc"]) == ("model_attributes_type", ["body"])
    depth, value = 0, item["input"]
    while value:
        depth, value = depth + 1, value[0]
    assert depth == 99  # the innermost list is empty


def test_deep_control_bodies_are_a_400(client: FlaskClient) -> None:
    for method, path in [("POST", "/_mock/faults"), ("PUT", "/_mock/capacity")]:
        response = post(client, path, DEEP_BODIES["array_1000"], method=method)
        assert (response.status_code, strict_json(response)) == (400, PARSE_ERROR), path


# -- rows 2, 3: NaN and infinite timeouts -------------------------------------------------------------


@pytest.mark.parametrize("token", [b"NaN", b'"NaN"'])
def test_nan_run_timeout_is_a_sandbox_error(client: FlaskClient, runs_root: Path, token: bytes) -> None:
    response = post(
        client, "/run_code", b'{"code":"print(1)","language":"python","run_timeout":' + token + b"}"
    )
    assert response.status_code == 200
    body = strict_json(response)
    message = body["message"]
    pattern = rf"exception on running command python {re.escape(str(runs_root))}/tmp\w+/tmp\w+\.py"
    assert re.fullmatch(pattern + re.escape(NAN_MESSAGE), message), message
    assert body == {
        "status": "SandboxError",
        "message": message,
        "compile_result": None,
        "run_result": {
            "status": "Error",
            "execution_time": None,
            "return_code": None,
            "stdout": None,
            "stderr": message,
        },
        "executor_pod_name": None,
        "files": {},
    }


def test_nan_compile_timeout_of_a_compiled_language_is_a_sandbox_error(client: FlaskClient) -> None:
    raw = b'{"code":"int main() { return 0; }","language":"cpp","compile_timeout":NaN}'
    body = strict_json(post(client, "/run_code", raw))
    assert body["status"] == "SandboxError"
    assert body["message"].startswith("exception on running command g++ ")
    assert body["message"].endswith(NAN_MESSAGE)
    assert body["compile_result"]["status"] == "Error" and body["run_result"] is None


@pytest.mark.parametrize("field", [b"compile_timeout", b"bogus"])
def test_nan_elsewhere_is_ignored(client: FlaskClient, field: bytes) -> None:
    raw = b'{"code":"print(1)","language":"python","' + field + b'":NaN}'
    body = strict_json(post(client, "/run_code", raw))
    assert (body["status"], body["run_result"]["stdout"]) == ("Success", "1\n")


def test_infinite_run_timeout_runs(client: FlaskClient) -> None:
    raw = b'{"code":"print(1)","language":"python","run_timeout":Infinity}'
    body = strict_json(post(client, "/run_code", raw))
    assert (body["status"], body["run_result"]["stdout"]) == ("Success", "1\n")


def test_minus_infinite_run_timeout_is_a_time_limit(client: FlaskClient) -> None:
    raw = b'{"code":"print(1)","language":"python","run_timeout":-Infinity}'
    body = strict_json(post(client, "/run_code", raw))
    result = body["run_result"]
    assert (body["status"], body["message"]) == ("Failed", "")
    assert (result["status"], result["return_code"], result["stdout"], result["stderr"]) == (
        "TimeLimitExceeded",
        None,
        "",
        "",
    )


# -- row 4: a 422 that would echo NaN cannot be encoded ----------------------------------------------

NAN_ECHOES = [
    ("/run_code", b'{"code":"print(1)","language":NaN}'),
    ("/run_code", b'{"code":NaN,"language":"python"}'),
    ("/run_code", b'{"code":"print(1)","language":"python","memory_limit_MB":NaN}'),
    ("/run_code", b'{"code":"print(1)","language":"python","memory_limit_MB":Infinity}'),
    ("/run_code", b'{"language":"python","bogus":NaN}'),  # `missing` echoes the whole body
    ("/run_jupyter", b'{"cells":NaN}'),
    ("/run_jupyter", b'{"total_timeout":NaN}'),
    ("/list_ids", b'{"dataset":NaN,"config":{}}'),
    ("/get_prompts", b'{"dataset":"mbpp","config":{},"offset":-Infinity}'),
    ("/get_prompt_by_id", b'{"dataset":"mbpp","config":{},"id":NaN}'),
    ("/submit", b'{"dataset":"mbpp","id":12,"bogus":NaN}'),
    ("/get_metrics", b'{"dataset":"mbpp","config":{},"results":NaN}'),
    ("/get_metrics_function", b'{"dataset":NaN,"config":{}}'),
]


@pytest.mark.parametrize(("path", "raw"), NAN_ECHOES)
def test_nan_echoed_by_a_422_is_sandboxfusions_500(client: FlaskClient, path: str, raw: bytes) -> None:
    assert_global_500(post(client, path, raw), NOT_COMPLIANT)


# -- row 5: /run_jupyter with a NaN total_timeout -----------------------------------------------------


@pytest.mark.parametrize("token", [b"NaN", b'"NaN"'])
def test_nan_total_timeout_fails_the_driver(client: FlaskClient, token: bytes) -> None:
    response = post(client, "/run_jupyter", b'{"cells":["print(1)"],"total_timeout":' + token + b"}")
    assert response.status_code == 200
    assert strict_json(response) == {
        "status": "Failed",
        "message": "",
        "driver": {
            "status": "Error",
            "execution_time": None,
            "return_code": None,
            "stdout": None,
            "stderr": "exception on running command python main.py" + NAN_MESSAGE,
        },
        "cells": [],
        "executor_pod_name": None,
        "files": {},
    }


# -- rows 6, 7: lone surrogates ----------------------------------------------------------------------


def test_lone_surrogate_in_code_is_sandboxfusions_500(client: FlaskClient) -> None:
    """Writing the code file fails; the SandboxError's message embeds the code, and encoding that
    answer fails at offset 70 of its JSON text, after ``...running code print(\\"``."""
    response = post(client, "/run_code", b'{"code":"print(\\"\\ud83d\\")","language":"python"}')
    assert_global_500(
        response, "'utf-8' codec can't encode character '\\ud83d' in position 70: surrogates not allowed"
    )
    assert len('{"status":"SandboxError","message":"exception on running code print(\\"') == 70


def test_lone_surrogate_echoed_by_a_422_is_sandboxfusions_500(client: FlaskClient) -> None:
    response = post(client, "/run_code", b'{"code":"x","language":"\\udc00"}')
    assert_global_500(
        response,
        re.compile(r"'utf-8' codec can't encode character '\\udc00' in position \d+: surrogates not allowed"),
    )


def test_lone_surrogate_in_stdin_is_dropped(client: FlaskClient) -> None:
    raw = b'{"code":"import sys; print(repr(sys.stdin.read()))","language":"python","stdin":"a\\ud83db"}'
    body = strict_json(post(client, "/run_code", raw))
    assert (body["status"], body["run_result"]["stdout"]) == ("Success", "'ab'\n")


# -- row 8: bodies that are not JSON values ----------------------------------------------------------


@pytest.mark.parametrize(("raw", "offset"), [(b"\x00", 0), (b"   \n\t ", 6), (b"  \x00", 2), (b"\n", 1)])
def test_nul_and_whitespace_are_json_invalid(client: FlaskClient, raw: bytes, offset: int) -> None:
    response = post(client, "/run_code", raw)
    assert response.status_code == 422
    assert strict_json(response) == {
        "detail": [
            {
                "type": "json_invalid",
                "loc": ["body", offset],
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": "Expecting value"},
            }
        ]
    }


def test_null_is_a_missing_body(client: FlaskClient) -> None:
    response = post(client, "/run_code", b"null")
    assert response.status_code == 422
    assert strict_json(response) == {
        "detail": [
            {
                "type": "missing",
                "loc": ["body"],
                "msg": "Field required",
                "input": None,
                "url": PYDANTIC_URL + "missing",
            }
        ]
    }


# -- row 9: NaN in an unknown field of the dataset endpoints -----------------------------------------

DATASET_BODIES = [
    ("/list_ids", {"dataset": "mbpp", "config": {}, "limit": 3}),
    ("/get_prompts", {"dataset": "mbpp", "config": {}, "limit": 1}),
    (
        "/submit",
        {
            "dataset": "mbpp",
            "id": 12,
            "config": {},
            "completion": "```python\ndef sort_matrix(M):\n    return sorted(M, key=sum)\n```",
        },
    ),
]


@pytest.mark.parametrize(("path", "body"), DATASET_BODIES)
def test_nan_in_an_unknown_dataset_field_is_ignored(
    client: FlaskClient, path: str, body: dict[str, Any]
) -> None:
    plain = post(client, path, json.dumps(body).encode())
    with_nan = post(client, path, json.dumps(body).encode()[:-1] + b',"bogus":NaN}')
    assert plain.status_code == with_nan.status_code == 200
    first, second = strict_json(plain), strict_json(with_nan)
    if path == "/submit":  # timings and temp file names differ from run to run
        for answer in (first, second):
            for test in answer["tests"]:
                test["exec_info"] = test["exec_info"]["status"]
    assert first == second


# -- row 10: file names that leave the temp dir -------------------------------------------------------


def test_files_and_fetch_files_relative_to_the_temp_dir(
    client: FlaskClient, runs_root: Path, box: MockSandbox
) -> None:
    content = base64.b64encode(b"outside").decode()
    leaked = runs_root / "x.txt"  # ../x.txt of every run's temp dir
    try:
        response = client.post(
            "/run_code",
            json={
                "code": "print(open('../x.txt').read())",
                "language": "python",
                "files": {"../x.txt": content},
                "fetch_files": ["../x.txt"],
            },
        )
        body = strict_json(response)
        assert (response.status_code, body["status"]) == (200, "Success")
        assert body["run_result"]["stdout"] == "outside\n"
        assert body["files"] == {"../x.txt": content}
        if box.engine.isolation.mode == "lite":
            assert not leaked.exists()  # written in the run's world, not on the host
        else:
            assert leaked.read_bytes() == b"outside"  # SandboxFusion's none: where it says
    finally:
        leaked.unlink(missing_ok=True)


# -- row 11: the mock's own endpoints answer valid JSON --------------------------------------------------

# How a 422 of the mock's own endpoints echoes what SandboxFusion's could not encode: NaN and the
# infinities as the strings "NaN", "Infinity", "-Infinity", lone surrogates as \udXXX escapes.
OWN_ENDPOINT_ECHOES = [
    ("POST", "/start_instance", b'{"instance_hash":NaN}', "NaN"),
    ("POST", "/start_instance", b'{"instance_hash":Infinity}', "Infinity"),
    ("POST", "/start_instance", b'{"instance_hash":["\\ud83d"]}', ["\ud83d"]),
    ("POST", "/process_action", b'{"sid":NaN,"content":1}', "NaN"),
    ("POST", "/process_action", b'{"sid":"1","content":-Infinity}', "-Infinity"),
    ("POST", "/postprocess", b'{"sid":NaN}', "NaN"),
    ("POST", "/compute_reward", b'{"sid":[-Infinity,"\\udfff"]}', ["-Infinity", "\udfff"]),
    ("POST", "/compute_reward", b'{"bogus":NaN}', {"bogus": "NaN"}),  # `missing` echoes the body
    ("PUT", "/_mock/capacity", b'{"max_in_flight":NaN}', "NaN"),
    ("PUT", "/_mock/capacity", b'{"queue_timeout_s":Infinity}', "Infinity"),
    ("PUT", "/_mock/capacity", b'{"retry_after_s":-Infinity}', "-Infinity"),
    ("PUT", "/_mock/capacity", b'{"overload":"\\ud800"}', "\ud800"),
]


@pytest.mark.parametrize(("method", "path", "raw", "echo"), OWN_ENDPOINT_ECHOES)
def test_own_endpoints_echo_unencodable_input_as_valid_json(
    client: FlaskClient, method: str, path: str, raw: bytes, echo: Any
) -> None:
    response = post(client, path, raw, method=method)
    assert response.status_code == 422, response.get_data()
    detail = strict_json(response)["detail"]
    assert echo in [item["input"] for item in detail]


@pytest.mark.parametrize(
    "action",
    [
        b'{"type":"delay","seconds":Infinity}',
        b'{"type":"delay","seconds":NaN}',
        b'{"type":"status","status":503,"retry_after":Infinity}',
        b'{"type":"truncate","fraction":NaN}',
    ],
)
def test_fault_rules_refuse_non_finite_numbers(client: FlaskClient, box: MockSandbox, action: bytes) -> None:
    response = post(client, "/_mock/faults", b'{"action":' + action + b"}")
    assert response.status_code == 422
    assert "finite number" in strict_json(response)["detail"]
    assert box.fault_rules() == []


def test_fault_rule_with_unencodable_values_is_listed_as_valid_json(client: FlaskClient) -> None:
    raw = (
        b'{"name":"x\\ud800","match":{"path":"/nowhere","body":{"k":NaN}},'
        b'"action":{"type":"status","status":500,"body":[Infinity]}}'
    )
    response = post(client, "/_mock/faults", raw)
    assert response.status_code == 201
    [rule] = strict_json(response)["faults"]
    # (pydantic's JSON mode has made NaN and Infinity null already)
    assert (rule["id"], rule["match"]["body"], rule["action"]["body"]) == ("x\ud800", {"k": None}, [None])
    assert strict_json(client.get("/_mock/faults"))["faults"] == [rule]


def test_journal_of_malformed_bodies_is_valid_json(client: FlaskClient) -> None:
    for raw in [
        *DEEP_BODIES.values(),
        b'{"code":NaN,"language":"\\ud83d"}',
        b"\xff\xfe",
        b"[" * 900 + b"]" * 900,
    ]:
        post(client, "/run_code", raw)
    response = client.get("/_mock/journal?language=python")
    assert response.status_code == 200
    strict_json(response)
    entries = strict_json(client.get("/_mock/journal"))["entries"]
    assert len(entries) == 6
    assert entries[3]["body"] == {"code": "NaN", "language": "\ud83d"}


def test_sandboxfusion_endpoints_are_the_contracts(app: Flask) -> None:
    """The encoding rule follows blueprints: SandboxFusion's answer 500, the mock's own never do."""
    from mocksandbox.web.responses import SANDBOXFUSION_BLUEPRINTS

    faithful = {
        rule.rule
        for rule in app.url_map.iter_rules()
        if rule.endpoint.split(".")[0] in SANDBOXFUSION_BLUEPRINTS
    }
    assert faithful == {*SANDBOXFUSION_POSTS, "/v1/ping", "/list_datasets"}


# -- a body of another content type that is not UTF-8 (measured on SandboxFusion 469de08) --------------


@pytest.mark.parametrize("path", ["/run_code", "/run_jupyter", "/submit", "/get_prompts"])
def test_undecodable_text_body_is_sandboxfusions_500(path: str) -> None:
    """SandboxFusion: ``printf '\\xff\\xfe{...}' | curl -H 'Content-Type: text/plain' ...`` -> 500
    ``{"detail": "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte", ...}``."""
    box = MockSandbox.create(Settings())
    try:
        reply = create_app(box).test_client().post(
            path, data=b'\xff\xfe{"code":1}', headers={"Content-Type": "text/plain"}
        )
        assert reply.status_code == 500
        body = reply.get_json()
        assert body["detail"] == "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"
        assert isinstance(body["traceback"], list)
        assert box.take_errors() == []  # SandboxFusion's answer, not a bug of the mock
    finally:
        box.close()


def test_undecodable_text_body_on_the_mocks_own_endpoints_is_a_clear_400() -> None:
    box = MockSandbox.create(Settings())
    try:
        client = create_app(box).test_client()
        for path in ("/start_instance", "/_mock/faults"):
            reply = client.post(path, data=b"\xff\xfe", headers={"Content-Type": "text/plain"})
            assert reply.status_code == 400, path
            assert reply.get_json() == {"detail": "There was an error parsing the body"}
    finally:
        box.close()
