"""Cross-cutting protocol behaviour (contract §0-§1): ping, routing, body parsing, 422 shapes."""

from __future__ import annotations

import pytest
from contract_support import Target, check_run_code_response, check_validation_error


def test_ping(target: Target) -> None:
    reply = target.get("/v1/ping")
    assert reply.status_code == 200
    assert reply.headers["Content-Type"].startswith("application/json")
    assert reply.json() == "pong"


def test_unknown_path_is_json_404(target: Target) -> None:
    reply = target.get("/no/such/path")
    assert reply.status_code == 404
    assert reply.json() == {"detail": "Not Found"}


def test_wrong_method_is_json_405(target: Target) -> None:
    reply = target.get("/run_code")
    assert reply.status_code == 405
    assert reply.json() == {"detail": "Method Not Allowed"}


@pytest.mark.parametrize("path", ["/v1/run_code", "/health", "/languages"])
def test_paths_that_do_not_exist(target: Target, path: str) -> None:
    assert target.get(path).status_code == 404


def test_missing_code_and_language(target: Target) -> None:
    detail = check_validation_error(
        target.post("/run_code", {}), [("missing", ["body", "code"]), ("missing", ["body", "language"])]
    )
    assert all(item["input"] == {} for item in detail)


def test_unknown_language_lists_the_enum(target: Target) -> None:
    detail = check_validation_error(
        target.post("/run_code", {"code": "x", "language": "cobol"}),
        [("literal_error", ["body", "language"])],
    )
    assert detail[0]["input"] == "cobol"
    for language in ("python", "cpp", "sql", "racket"):
        assert f"'{language}'" in detail[0]["ctx"]["expected"]


@pytest.mark.parametrize("alias", ["js", "ts"])
def test_runner_aliases_are_not_in_the_enum(target: Target, alias: str) -> None:
    check_validation_error(
        target.post("/run_code", {"code": "x", "language": alias}), [("literal_error", ["body", "language"])]
    )


def test_wrong_types(target: Target) -> None:
    body = {"code": None, "language": "python", "memory_limit_MB": 1.5, "run_timeout": "abc"}
    got = target.post("/run_code", body)
    # pydantic reports fields in model order: run_timeout, memory_limit_MB, code
    check_validation_error(
        got,
        [
            ("float_parsing", ["body", "run_timeout"]),
            ("int_from_float", ["body", "memory_limit_MB"]),
            ("string_type", ["body", "code"]),
        ],
    )


def test_lax_coercion_of_numbers_in_strings(target: Target) -> None:
    # Numbers in strings; run_timeout "20", not "2": the run must finish, on a loaded machine too.
    body = target.run_code("print(1)", run_timeout="20", compile_timeout="30", memory_limit_MB="-1")
    assert body["status"] == "Success"


def test_unknown_fields_are_ignored(target: Target) -> None:
    assert target.run_code("print(1)", bogus=123)["status"] == "Success"


def test_invalid_json(target: Target) -> None:
    reply = target.post("/run_code", data=b"{bad", headers={"Content-Type": "application/json"})
    detail = check_validation_error(reply, [("json_invalid", ["body", 1])])
    assert detail[0]["input"] == {}
    assert "error" in detail[0]["ctx"]


def test_empty_body(target: Target) -> None:
    reply = target.post("/run_code", data=b"", headers={"Content-Type": "application/json"})
    detail = check_validation_error(reply, [("missing", ["body"])])
    assert detail[0]["input"] is None


def test_json_that_is_not_an_object(target: Target) -> None:
    check_validation_error(target.post("/run_code", [1, 2]), [("model_attributes_type", ["body"])])


def test_other_content_type(target: Target) -> None:
    reply = target.post(
        "/run_code",
        data=b"code=1&language=python",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    detail = check_validation_error(reply, [("model_attributes_type", ["body"])])
    assert detail[0]["input"] == "code=1&language=python"


def test_other_content_type_that_is_not_utf8_is_the_global_500(target: Target) -> None:
    # The 422 would echo the body as text; decoding it fails inside FastAPI's handler.
    reply = target.post("/run_code", data=b'\xff\xfe{"code":1}', headers={"Content-Type": "text/plain"})
    assert reply.status_code == 500
    body = reply.json()
    assert body["detail"] == "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"
    assert isinstance(body["traceback"], list)


def test_no_content_type_is_parsed_as_json(target: Target) -> None:
    reply = target.session.post(
        target.url + "/run_code", data=b'{"code": "print(1)", "language": "python"}', timeout=60
    )
    assert reply.status_code == 200
    check_run_code_response(reply.json())
    assert reply.json()["status"] == "Success"
