"""Every example of the contract (§0–§2) through the Flask test client, plus the wire details
that a normalised comparison would hide: key order, null keys, 422 item shape, serialisation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from mocksandbox.contract.corpus import (
    compare_answer,
    describe_mismatch,
    load_corpus,
    request_parts,
    skip_reason,
)
from mocksandbox.core import MockSandbox
from mocksandbox.models import ALL_LANGUAGES
from mocksandbox.settings import Settings
from mocksandbox.web import create_app

CASES = load_corpus("run_code")

RESPONSE_KEYS = ["status", "message", "compile_result", "run_result", "executor_pod_name", "files"]
RESULT_KEYS = ["status", "execution_time", "return_code", "stdout", "stderr"]
PYDANTIC_URL = "https://errors.pydantic.dev/2.6/v/"


@pytest.fixture(scope="module", params=["fork", "spawn"])
def contract_sandbox(request: pytest.FixtureRequest) -> Iterator[MockSandbox]:
    """A real sandbox with default settings, no pod name (as outside SandboxFusion's cloud), in
    each execution mode: the warm fork path must answer exactly as a fresh interpreter does.

    Programs inherit the server's environment (as in SandboxFusion), which the engine captures when
    it is built; the contract's server had no PYTHONUNBUFFERED, and the unflushed-timeout example
    depends on that.
    """
    with pytest.MonkeyPatch.context() as env:
        env.delenv("PYTHONUNBUFFERED", raising=False)
        box = MockSandbox.create(Settings(pod_name=None, exec_mode=request.param))
    yield box
    box.close()


@pytest.fixture(scope="module")
def contract_app(contract_sandbox: MockSandbox) -> Flask:
    return create_app(contract_sandbox)


@pytest.fixture
def contract_client(contract_app: Flask) -> FlaskClient:
    return contract_app.test_client()


def _ordered(raw: bytes) -> Any:
    """Parse JSON keeping every object's keys in wire order (as lists of pairs)."""
    return json.loads(raw, object_pairs_hook=lambda pairs: pairs)


def _keys(pairs: list[tuple[str, Any]]) -> list[str]:
    return [key for key, _ in pairs]


def _value(pairs: list[tuple[str, Any]], key: str) -> Any:
    return dict(pairs)[key]


def _run(client: FlaskClient, **body: Any) -> Any:
    response = client.post("/run_code", json=body)
    assert response.status_code == 200, response.get_data(as_text=True)
    return response


# -- the corpus ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", [pytest.param(case, id=case["name"]) for case in CASES])
def test_corpus_case(contract_client: FlaskClient, case: dict[str, Any]) -> None:
    reason = skip_reason(case)
    if reason is not None:
        pytest.skip(reason)
    method, path, body, content_type = request_parts(case["request"])
    response = contract_client.open(path, method=method, data=body, content_type=content_type)
    raw = response.get_data(as_text=True)
    try:
        answer = json.loads(raw)
    except json.JSONDecodeError:
        answer = raw
    problems = compare_answer(case["expect"], response.status_code, response.mimetype, answer)
    assert not problems, describe_mismatch(case, problems, answer)


def test_corpus_is_well_formed() -> None:
    names = [case["name"] for case in CASES]
    assert len(names) == len(set(names)), "case names must be unique"
    for case in CASES:
        assert set(case) <= {"name", "source", "note", "toolchain", "toolchain_absent", "request", "expect"}
        assert case["source"].startswith("§"), case["name"]
        request, expect = case["request"], case["expect"]
        assert not ("json" in request and "body" in request), case["name"]
        assert isinstance(expect["http_status"], int), case["name"]
        for key in ("compile_result", "run_result"):
            if expect.get(key) is not None:
                assert list(expect[key]) == ["status", "return_code", "stdout", "stderr"], case["name"]


def test_corpus_covers_the_contract_examples() -> None:
    """A case dropped from the corpus by accident fails here, not silently."""
    required = {
        "success", "sys_exit_3", "uncaught_exception", "python_syntax_error", "sigkill", "cpp_segfault",
        "run_timeout_flushed", "run_timeout_unflushed", "run_timeout_zero", "run_timeout_negative",
        "cpp_compile_error", "cpp_compile_timeout", "java_compile_error", "unknown_language",
        "sql_no_runner", "bad_base64", "scala_without_object", "missing_toolchain_csharp", "stdin",
        "no_stdin_input_eof", "stdin_empty_read", "files_and_fetch_files",
        "fetch_files_directory_and_dot_slash", "files_ignore_this_file", "files_absolute_path",
        "memory_limit_memory_error", "memory_limit_loader_failure", "non_utf8_output",
        "unknown_field_ignored", "no_content_type", "run_timeout_string_coerced", "memory_limit_float",
        "run_timeout_not_a_number", "code_null", "missing_code_and_language", "invalid_json",
        "empty_body", "json_array_body", "form_content_type", "unknown_path", "run_code_wrong_method",
        "ping",
    }  # fmt: skip
    assert required <= {case["name"] for case in CASES}


def test_no_content_type_really_sends_no_header(contract_client: FlaskClient) -> None:
    response = contract_client.post("/run_code", data=b'{"code":"print(1)","language":"python"}')
    assert response.request.headers.get("Content-Type") is None
    assert response.status_code == 200
    assert response.get_json()["status"] == "Success"


# -- response key order and nulls ----------------------------------------------------------------


def test_success_keys_in_order_with_nulls_present(contract_client: FlaskClient) -> None:
    body = _ordered(_run(contract_client, code="print(1)", language="python").get_data())
    assert _keys(body) == RESPONSE_KEYS
    assert _value(body, "compile_result") is None
    assert _value(body, "executor_pod_name") is None
    assert _value(body, "files") == []  # an empty object, as pairs
    run_result = _value(body, "run_result")
    assert _keys(run_result) == RESULT_KEYS
    assert isinstance(_value(run_result, "execution_time"), float)


def test_error_result_keeps_null_keys(contract_client: FlaskClient) -> None:
    body = _ordered(_run(contract_client, code="println(1)", language="scala").get_data())
    assert _keys(body) == RESPONSE_KEYS
    compile_result = _value(body, "compile_result")
    assert compile_result == [
        ("status", "Error"),
        ("execution_time", None),
        ("return_code", 1),
        ("stdout", None),
        ("stderr", "Object name not found."),
    ]
    assert _value(body, "run_result") is None


def test_sandbox_error_has_both_results_null(contract_client: FlaskClient) -> None:
    body = _ordered(_run(contract_client, code="select 1;", language="sql").get_data())
    assert _keys(body) == RESPONSE_KEYS
    assert [_value(body, k) for k in ("compile_result", "run_result", "files")] == [None, None, []]


def test_timeout_result_has_null_return_code(contract_client: FlaskClient) -> None:
    body = _ordered(_run(contract_client, code="print(1)", language="python", run_timeout=0).get_data())
    run_result = _value(body, "run_result")
    assert _keys(run_result) == RESULT_KEYS
    assert _value(run_result, "status") == "TimeLimitExceeded"
    assert _value(run_result, "return_code") is None
    assert isinstance(_value(run_result, "execution_time"), float)


def test_fetched_files_keep_request_order(contract_client: FlaskClient) -> None:
    body = _ordered(
        _run(
            contract_client,
            code="open('b', 'w').write('b'); open('a', 'w').write('a')",
            language="python",
            fetch_files=["b", "a", "./b"],
        ).get_data()
    )
    assert _keys(_value(body, "files")) == ["b", "a", "./b"]


# -- 422 items -------------------------------------------------------------------------------------


def _detail(client: FlaskClient, **kwargs: Any) -> list[list[tuple[str, Any]]]:
    response = client.post("/run_code", **kwargs)
    assert response.status_code == 422
    body = _ordered(response.get_data())
    assert _keys(body) == ["detail"]
    detail: list[list[tuple[str, Any]]] = _value(body, "detail")
    return detail


def test_422_item_with_ctx_key_order(contract_client: FlaskClient) -> None:
    [item] = _detail(contract_client, json={"code": "x", "language": "cobol"})
    assert _keys(item) == ["type", "loc", "msg", "input", "ctx", "url"]
    assert _value(item, "url") == PYDANTIC_URL + "literal_error"
    expected = ", ".join(f"'{name}'" for name in ALL_LANGUAGES[:-1]) + f" or '{ALL_LANGUAGES[-1]}'"
    assert _value(item, "ctx") == [("expected", expected)]


def test_422_item_without_ctx_key_order(contract_client: FlaskClient) -> None:
    [item] = _detail(contract_client, json={"language": "python"})
    assert _keys(item) == ["type", "loc", "msg", "input", "url"]
    assert _value(item, "input") == [("language", "python")]


def test_json_invalid_item_has_no_url(contract_client: FlaskClient) -> None:
    [item] = _detail(contract_client, data=b"not json", content_type="application/json")
    assert item == [
        ("type", "json_invalid"),
        ("loc", ["body", 0]),
        ("msg", "JSON decode error"),
        ("input", []),
        ("ctx", [("error", "Expecting value")]),
    ]


def test_422_items_follow_field_order(contract_client: FlaskClient) -> None:
    detail = _detail(contract_client, json={"language": "cobol", "code": 1, "run_timeout": "x"})
    assert [(_value(i, "type"), _value(i, "loc")) for i in detail] == [
        ("float_parsing", ["body", "run_timeout"]),
        ("string_type", ["body", "code"]),
        ("literal_error", ["body", "language"]),
    ]


def test_422_for_alias_languages_not_in_the_enum(contract_client: FlaskClient) -> None:
    for alias in ("js", "ts", "Python"):
        [item] = _detail(contract_client, json={"code": "x", "language": alias})
        assert _value(item, "type") == "literal_error"
        assert _value(item, "input") == alias


# -- serialisation and content types -------------------------------------------------------------


def test_verbatim_422_bytes(contract_client: FlaskClient) -> None:
    response = contract_client.post("/run_code", json={})
    assert response.get_data() == (
        b'{"detail":[{"type":"missing","loc":["body","code"],"msg":"Field required","input":{},'
        b'"url":"https://errors.pydantic.dev/2.6/v/missing"},{"type":"missing","loc":["body","language"],'
        b'"msg":"Field required","input":{},"url":"https://errors.pydantic.dev/2.6/v/missing"}]}'
    )


def test_compact_separators(contract_client: FlaskClient) -> None:
    raw = _run(contract_client, code="print(1)", language="python").get_data()
    assert raw.startswith(
        b'{"status":"Success","message":"","compile_result":null,'
        b'"run_result":{"status":"Finished","execution_time":'
    )
    assert raw.endswith(b',"return_code":0,"stdout":"1\\n","stderr":""},"executor_pod_name":null,"files":{}}')


def test_non_ascii_kept_raw(contract_client: FlaskClient) -> None:
    raw = _run(contract_client, code="print('héllo ✓ 你好')", language="python").get_data()
    assert "héllo ✓ 你好\\n".encode() in raw
    assert b"\\u" not in raw


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [
        ("POST", "/run_code", {"json": {"code": "print(1)", "language": "python"}}, 200),
        ("POST", "/run_code", {"json": {"code": "print(1)"}}, 422),
        ("POST", "/run_code", {"data": b"{", "content_type": "application/json"}, 422),
        ("GET", "/nowhere", {}, 404),
        ("GET", "/run_code", {}, 405),
        ("GET", "/v1/ping", {}, 200),
    ],
    ids=["run_code", "validation", "json_invalid", "not_found", "method_not_allowed", "ping"],
)
def test_content_type_is_plain_application_json(
    contract_client: FlaskClient, method: str, path: str, kwargs: dict[str, Any], status: int
) -> None:
    response = contract_client.open(path, method=method, **kwargs)
    assert response.status_code == status
    assert response.headers["Content-Type"] == "application/json"


def test_ping_is_six_bytes(contract_client: FlaskClient) -> None:
    response = contract_client.get("/v1/ping")
    assert response.get_data() == b'"pong"'


# -- 404 and 405 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/health", "/v1/run_code", "/languages", "/ping", "/v1/ping/x"])
def test_unknown_paths_are_404(contract_client: FlaskClient, path: str) -> None:
    for method in ("GET", "POST"):
        response = contract_client.open(path, method=method)
        assert response.status_code == 404
        assert response.get_data() == b'{"detail":"Not Found"}'


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/run_code"), ("PUT", "/run_code"), ("POST", "/v1/ping")]
)
def test_wrong_method_is_405(contract_client: FlaskClient, method: str, path: str) -> None:
    response = contract_client.open(path, method=method)
    assert response.status_code == 405
    assert response.get_data() == b'{"detail":"Method Not Allowed"}'


# -- edges of FastAPI 0.103 / Starlette 0.27 (read from their source) -------------------------


def test_405_allow_header_names_only_post(contract_client: FlaskClient) -> None:
    assert contract_client.get("/run_code").headers["Allow"] == "POST"


def test_options_run_code_is_405(contract_client: FlaskClient) -> None:
    response = contract_client.options("/run_code")
    assert response.status_code == 405
    assert response.get_data() == b'{"detail":"Method Not Allowed"}'


def test_head_ping_is_405(contract_client: FlaskClient) -> None:
    assert contract_client.head("/v1/ping").status_code == 405


def test_trailing_slash_redirects(contract_client: FlaskClient) -> None:
    response = contract_client.post("/run_code/", json={"code": "print(1)", "language": "python"})
    assert response.status_code == 307
    assert response.headers["Location"].endswith("/run_code")


def test_uncaught_exception_is_500_with_traceback(contract_sandbox: MockSandbox) -> None:
    app = create_app(contract_sandbox)

    @app.get("/_test_boom")
    def _boom() -> str:
        raise RuntimeError("kaput")

    response = app.test_client().get("/_test_boom")
    assert response.status_code == 500
    body = _ordered(response.get_data())
    assert _keys(body) == ["detail", "traceback"]
    assert _value(body, "detail") == "kaput"
    traceback_lines = _value(body, "traceback")
    assert traceback_lines[0] == "Traceback (most recent call last):"
    assert "RuntimeError: kaput" in traceback_lines


def test_uncaught_exception_traceback_ends_with_empty_line(contract_sandbox: MockSandbox) -> None:
    app = create_app(contract_sandbox)

    @app.get("/_test_boom")
    def _boom() -> str:
        raise RuntimeError("kaput")

    traceback_lines = app.test_client().get("/_test_boom").get_json()["traceback"]
    assert traceback_lines[-2:] == ["RuntimeError: kaput", ""]
