"""Every language of the enum is accepted; each one the target can run prints hello (§2.7)."""

from __future__ import annotations

import pytest
from contract_support import HELLO, HELLO_OUTPUT, Target

ENUM = [
    "python",
    "cpp",
    "nodejs",
    "go",
    "go_test",
    "java",
    "php",
    "csharp",
    "bash",
    "typescript",
    "sql",
    "rust",
    "cuda",
    "lua",
    "R",
    "perl",
    "D_ut",
    "ruby",
    "scala",
    "julia",
    "pytest",
    "junit",
    "kotlin_script",
    "jest",
    "verilog",
    "python_gpu",
    "lean",
    "swift",
    "racket",
]


@pytest.mark.parametrize("language", ENUM)
def test_every_enum_value_is_accepted(target: Target, language: str) -> None:
    # An empty program: never a 422, always one of the three statuses.
    body = target.run_code("", language=language, compile_timeout=60, run_timeout=30)
    assert body["status"] in ("Success", "Failed", "SandboxError")


@pytest.mark.parametrize("language", sorted(HELLO))
def test_hello_world(target: Target, language: str) -> None:
    reason = target.cannot_run(language)
    if reason:
        pytest.skip(f"the target cannot run {language}: {reason}")
    body = target.run_code(HELLO[language], language=language, compile_timeout=60, run_timeout=30)
    assert body["status"] == "Success"
    assert HELLO_OUTPUT.get(language, "hello") in body["run_result"]["stdout"]


def test_missing_toolchain_is_rc_127(target: Target) -> None:
    """A language whose toolchain the target lacks answers the shell's rc 127, not a SandboxError."""
    for language in ("julia", "kotlin_script", "racket", "swift", "csharp", "lean"):
        body = target.run_code(HELLO.get(language, ""), language=language, compile_timeout=60)
        failed = body["run_result"] or body["compile_result"]
        if failed and failed["return_code"] == 127:
            assert body["status"] == "Failed"
            assert "not found" in failed["stderr"]
            return
    pytest.skip("the target has every toolchain probed here")
