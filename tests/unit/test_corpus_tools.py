"""The corpus helpers: normalisation must hide only what legitimately differs between hosts."""

from __future__ import annotations

import pytest

from mocksandbox.contract.corpus import compare_answer, normalize_text, request_parts, skip_reason


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('File "/tmp/tmpdw3m0zaa/tmpu138rp_a.py", line 1', 'File "<TMP>/<CODE>.py", line 1'),
        ("/tmp/tmpmoswohhc/tmp2vm319b7.cpp:1:21: error", "<TMP>/<CODE>.cpp:1:21: error"),
        ("/var/runs/tmpabcdefgh/Main.java:3: error", "<TMP>/Main.java:3: error"),
        ("['/tmp/tmpj65reg8r/tmpizwxr183.py'] /tmp/tmpj65reg8r\n", "['<TMP>/<CODE>.py'] <TMP>\n"),
        (
            "/opt/venv/bin/python3.11: error while loading shared libraries: libpython3.11.so.1.0: failed",
            "python: error while loading shared libraries: <LIB>: failed",
        ),
        ("exception on running command /usr/bin/python3 /tmp/tmpaaaaaaaa/tmpbbbbbbbb.py: x", "exception on running command python <TMP>/<CODE>.py: x"),
        ('File "/usr/lib/python3.10/json/decoder.py"', 'File "<STDLIB>/json/decoder.py"'),
        ("error: \u2018x\u2019 was not declared", "error: 'x' was not declared"),
        # left alone: not temp dirs, not interpreters
        ("/tmp/tmpshort/x /tmp/pytest-of-root/a", "/tmp/tmpshort/x /tmp/pytest-of-root/a"),
        ("python is great; mypython", "python is great; mypython"),
    ],
)  # fmt: skip
def test_normalize_text(text: str, expected: str) -> None:
    assert normalize_text(text) == expected


def test_caret_lines_dropped_only_on_request() -> None:
    text = "    x = f()\n        ^^^\n    ~~~^~~~\nboom ^\n"
    assert normalize_text(text) == text
    assert normalize_text(text, drop_caret_lines=True) == "    x = f()\nboom ^\n"
    assert normalize_text(None) is None


def test_request_parts() -> None:
    assert request_parts({"json": {"a": "é"}}) == (
        "POST",
        "/run_code",
        '{"a": "é"}'.encode(),
        "application/json",
    )
    assert request_parts({"method": "GET", "path": "/v1/ping"}) == ("GET", "/v1/ping", None, None)
    assert request_parts({"body": "x=1", "content_type": None}) == ("POST", "/run_code", b"x=1", None)


def test_skip_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert skip_reason({"name": "a"}) is None
    assert "needs 'g++'" in (skip_reason({"name": "a", "toolchain": "g++"}) or "")
    assert skip_reason({"name": "a", "toolchain_absent": "dotnet"}) is None


EXPECT = {
    "http_status": 200,
    "status": "Failed",
    "message": "",
    "compile_result": None,
    "run_result": {"status": "Finished", "return_code": 1, "stdout": "", "stderr": 'File "/tmp/tmpaaaaaaaa/tmpbbbbbbbb.py"\n'},
    "files": {"a": "eA==", "b": "eQ=="},
}  # fmt: skip


def answer(**changes: object) -> dict[str, object]:
    body: dict[str, object] = {
        "status": "Failed",
        "message": "",
        "compile_result": None,
        "run_result": {
            "status": "Finished",
            "execution_time": 0.5,
            "return_code": 1,
            "stdout": "",
            "stderr": 'File "/tmp/tmpcccccccc/tmpdddddddd.py"\n    ^^^^\n',
        },
        "executor_pod_name": None,
        "files": {"a": "eA==", "b": "eQ=="},
    }
    body.update(changes)
    return body


def test_compare_ignores_paths_times_and_carets() -> None:
    assert compare_answer(EXPECT, 200, "application/json", answer()) == []


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"status": "Success"}, "status:"),
        ({"files": {"b": "eQ==", "a": "eA=="}}, "files:"),  # order matters
        ({"run_result": None}, "run_result:"),
        ({"run_result": {"status": "Finished", "return_code": 2, "stdout": "", "stderr": ""}}, "run_result:"),
    ],
)
def test_compare_reports_differences(changes: dict[str, object], problem: str) -> None:
    [found] = compare_answer(EXPECT, 200, "application/json", answer(**changes))
    assert found.startswith(problem)
    assert compare_answer(EXPECT, 500, "application/json", answer())[0].startswith("http_status:")


def test_compare_422_exact_or_by_type_and_location() -> None:
    item = {"type": "missing", "loc": ["body", "code"], "msg": "Field required", "input": {}, "url": "u"}
    expect = {"http_status": 422, "detail": [item]}
    reworded = {"detail": [{**item, "msg": "Required field"}]}
    assert compare_answer(expect, 422, "application/json", {"detail": [item]}) == []
    assert compare_answer(expect, 422, "application/json", reworded) != []
    assert compare_answer(expect, 422, "application/json", reworded, exact_detail=False) == []
    moved = {"detail": [{**item, "loc": ["body", "language"]}]}
    assert compare_answer(expect, 422, "application/json", moved, exact_detail=False) != []
