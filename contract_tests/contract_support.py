"""HTTP client, capability detection and strict schema checks for the contract suite.

HTTP only: nothing from mocksandbox is imported, so the suite runs unchanged against any
deployment.
"""

from __future__ import annotations

import base64
import threading
from typing import Any

import requests

RUN_STATUSES = {"Success", "Failed", "SandboxError"}
COMMAND_STATUSES = {"Finished", "Error", "TimeLimitExceeded"}
RUN_CODE_KEYS = ["status", "message", "compile_result", "run_result", "executor_pod_name", "files"]
COMMAND_KEYS = ["status", "execution_time", "return_code", "stdout", "stderr"]
VALIDATION_ITEM_KEYS = ["type", "loc", "msg", "input"]

#: A tiny program per language whose stdout is "hello\n": capability probes.
HELLO: dict[str, str] = {
    "python": "print('hello')",
    "pytest": "def test_hello():\n    print('hello')\n",
    "bash": "echo hello",
    "cpp": '#include <iostream>\nint main() { std::cout << "hello" << std::endl; }',
    "nodejs": "console.log('hello')",
    "typescript": "const s: string = 'hello';\nconsole.log(s);",
    "java": 'public class Main { public static void main(String[] a) { System.out.println("hello"); } }',
    "rust": 'fn main() { println!("hello"); }',
    "go": 'package main\nimport "fmt"\nfunc main() { fmt.Println("hello") }',
    "php": '<?php echo "hello\\n";',
    "perl": 'print "hello\\n";',
    "ruby": "puts 'hello'",
    "lua": "print('hello')",
    "R": "cat('hello\\n')",
    "scala": 'object Main { def main(args: Array[String]): Unit = println("hello") }',
    "julia": 'println("hello")',
    "verilog": 'module tb; initial begin $display("hello"); $finish; end endmodule',
    "racket": '#lang racket\n(displayln "hello")',
    "csharp": 'System.Console.WriteLine("hello");',
    "swift": 'print("hello")',
    "kotlin_script": 'println("hello")',
}


#: What a probe's stdout must contain when it is not "hello" (pytest captures prints).
HELLO_OUTPUT: dict[str, str] = {"pytest": "1 passed"}


#: What a /run_jupyter answer says when the target has no kernel side installed (the mock without
#: its `jupyter` extra names the extra; other servers name the module they could not import).
MISSING_KERNEL_MARKS = ("mocksandbox[jupyter]", "No module named", "jupyter_client", "ipykernel")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class Target:
    """The deployment under test and what it can do (each capability probed once)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._local = threading.local()
        self._lock = threading.Lock()
        self._endpoints: dict[str, bool] = {}
        self._languages: dict[str, str | None] = {}
        self._is_mock: bool | None = None

    @property
    def session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def close(self) -> None:
        session = getattr(self._local, "session", None)
        if session is not None:
            session.close()

    # -- requests ----------------------------------------------------------------------------

    def post(self, path: str, json: Any = None, timeout: float = 120, **kwargs: Any) -> requests.Response:
        return self.session.post(self.url + path, json=json, timeout=timeout, **kwargs)

    def get(self, path: str, timeout: float = 60, **kwargs: Any) -> requests.Response:
        return self.session.get(self.url + path, timeout=timeout, **kwargs)

    def run_code(self, code: str, language: str = "python", **fields: Any) -> dict[str, Any]:
        """POST /run_code and return the JSON answer, after checking its HTTP status and schema."""
        reply = self.post("/run_code", {"code": code, "language": language, **fields})
        assert reply.status_code == 200, f"HTTP {reply.status_code}: {reply.text[:500]}"
        body = reply.json()
        check_run_code_response(body)
        return body

    # -- capabilities --------------------------------------------------------------------------

    def is_up(self) -> bool:
        try:
            reply = self.session.get(self.url + "/v1/ping", timeout=5)
        except requests.RequestException:
            return False
        return reply.status_code == 200 and reply.json() == "pong"

    def is_mock(self) -> bool:
        if self._is_mock is None:
            try:
                reply = self.get("/_mock/stats", timeout=10)
                self._is_mock = reply.status_code == 200 and "requests_total" in reply.json()
            except (requests.RequestException, ValueError):
                self._is_mock = False
        return self._is_mock

    def has_endpoint(self, path: str) -> bool:
        """Whether ``path`` exists: an empty POST (or GET) gets a 422/200/400, not a 404."""
        with self._lock:
            if path not in self._endpoints:
                method = "GET" if path == "/list_datasets" else "POST"
                reply = self.session.request(method, self.url + path, json=None, timeout=60)
                self._endpoints[path] = reply.status_code != 404
            return self._endpoints[path]

    def cannot_run_jupyter(self) -> str | None:
        """``None`` when ``/run_jupyter`` runs a cell, else why not: only a target that says its kernel
        side is not installed (a SandboxError or 500 naming a missing module) is reported; any other
        failure is left to the tests, which then fail."""
        with self._lock:
            if "jupyter" not in self._languages:
                self._languages["jupyter"] = self._probe_jupyter()
            return self._languages["jupyter"]

    def _probe_jupyter(self) -> str | None:
        reply = self.post("/run_jupyter", {"cells": ["1"]}, timeout=180)
        try:
            body = reply.json()
        except ValueError:
            body = None
        if reply.status_code == 200 and isinstance(body, dict) and body.get("status") == "Success":
            return None
        if isinstance(body, dict):
            message = str(body.get("message") or body.get("detail") or "")
        else:
            message = reply.text
        if any(mark in message for mark in MISSING_KERNEL_MARKS):
            first = message.strip().splitlines()[0] if message.strip() else ""
            return f"its kernel side is not installed: {first[:200]}"
        return None

    def cannot_run(self, language: str) -> str | None:
        """``None`` when a hello world in ``language`` prints "hello", else why not."""
        with self._lock:
            if language not in self._languages:
                self._languages[language] = self._probe(language)
            return self._languages[language]

    def _probe(self, language: str) -> str | None:
        code = HELLO.get(language)
        if code is None:
            return "no probe program for this language"
        reply = self.post(
            "/run_code", {"code": code, "language": language, "compile_timeout": 60, "run_timeout": 30}
        )
        if reply.status_code != 200:
            return f"HTTP {reply.status_code}"
        body = reply.json()
        run = body.get("run_result") or {}
        if body.get("status") == "Success" and HELLO_OUTPUT.get(language, "hello") in (
            run.get("stdout") or ""
        ):
            return None
        failed = body.get("compile_result") if run == {} else run
        detail = ((failed or {}).get("stderr") or body.get("message") or "").strip().splitlines()
        return f"status {body.get('status')}: {detail[-1][:120] if detail else 'no output'}"


# -- strict schema checks ------------------------------------------------------------------------


def check_command_result(result: Any, where: str) -> None:
    assert isinstance(result, dict), f"{where}: not an object: {result!r}"
    assert list(result) == COMMAND_KEYS, f"{where}: keys {list(result)} != {COMMAND_KEYS}"
    assert result["status"] in COMMAND_STATUSES, f"{where}.status: {result['status']!r}"
    assert result["execution_time"] is None or isinstance(result["execution_time"], int | float)
    assert result["return_code"] is None or isinstance(result["return_code"], int)
    assert not isinstance(result["return_code"], bool)
    for key in ("stdout", "stderr"):
        assert result[key] is None or isinstance(result[key], str), f"{where}.{key}: {result[key]!r}"
    if result["status"] == "TimeLimitExceeded":
        assert result["return_code"] is None, f"{where}: a timeout has no return code"


def check_run_code_response(body: Any) -> None:
    """Every key, in order, with its type and enum values (contract §2.2)."""
    assert isinstance(body, dict), f"not an object: {body!r}"
    assert list(body) == RUN_CODE_KEYS, f"keys {list(body)} != {RUN_CODE_KEYS}"
    assert body["status"] in RUN_STATUSES, f"status {body['status']!r}"
    assert isinstance(body["message"], str)
    for key in ("compile_result", "run_result"):
        if body[key] is not None:
            check_command_result(body[key], key)
    assert body["executor_pod_name"] is None or isinstance(body["executor_pod_name"], str)
    assert isinstance(body["files"], dict)
    for name, content in body["files"].items():
        assert isinstance(name, str) and isinstance(content, str)
        base64.b64decode(content, validate=True)
    if body["status"] != "SandboxError":
        assert body["message"] == "", "message is empty unless SandboxError"


def check_validation_error(
    reply: requests.Response, expected: list[tuple[str, list[Any]]]
) -> list[dict[str, Any]]:
    """A FastAPI 422: ``detail`` items with these (type, loc), in order; each item well formed."""
    assert reply.status_code == 422, f"HTTP {reply.status_code}: {reply.text[:300]}"
    assert reply.headers.get("Content-Type", "").startswith("application/json")
    detail = reply.json()["detail"]
    assert isinstance(detail, list) and detail, detail
    for item in detail:
        assert list(item)[:4] == VALIDATION_ITEM_KEYS, f"item keys {list(item)}"
        assert isinstance(item["msg"], str) and item["msg"]
        assert isinstance(item["loc"], list) and item["loc"][0] == "body"
        if item["type"] != "json_invalid":
            assert item.get("url", "").startswith("https://errors.pydantic.dev/"), item
    assert [(i["type"], i["loc"]) for i in detail] == expected
    return detail
