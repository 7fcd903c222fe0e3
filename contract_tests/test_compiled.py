"""Languages with a compile step (contract §2.4): compile errors, timeouts, signals."""

from __future__ import annotations

import pytest
from contract_support import Target


@pytest.mark.needs_language("cpp")
def test_cpp_compile_error_skips_the_run(target: Target) -> None:
    body = target.run_code("int main() { return x; }", language="cpp")
    assert body["status"] == "Failed"
    assert body["run_result"] is None
    compiled = body["compile_result"]
    assert (compiled["status"], compiled["return_code"]) == ("Finished", 1)
    assert "error" in compiled["stderr"]


@pytest.mark.needs_language("cpp")
def test_cpp_compile_timeout(target: Target) -> None:
    # bits/stdc++.h takes far longer than 50 ms to compile; a bare main() can beat it on a fast host.
    body = target.run_code(
        "#include <bits/stdc++.h>\nint main() { return 0; }", language="cpp", compile_timeout=0.05
    )
    assert body["status"] == "Failed"
    assert body["run_result"] is None
    assert (body["compile_result"]["status"], body["compile_result"]["return_code"]) == (
        "TimeLimitExceeded",
        None,
    )


@pytest.mark.needs_language("cpp")
def test_cpp_segfault_is_minus_11(target: Target) -> None:
    body = target.run_code("int main() { int *p = 0; return *p; }", language="cpp")
    assert body["compile_result"]["return_code"] == 0
    assert body["run_result"]["return_code"] == -11
    assert body["status"] == "Failed"


@pytest.mark.needs_language("cpp")
def test_cpp_stdin(target: Target) -> None:
    code = (
        "#include <iostream>\nint main() { int a, b; std::cin >> a >> b; std::cout << a + b << std::endl; }"
    )
    assert target.run_code(code, language="cpp", stdin="2 40")["run_result"]["stdout"] == "42\n"


@pytest.mark.needs_language("java")
def test_java_compile_error(target: Target) -> None:
    body = target.run_code(
        "public class Main { public static void main(String[] a) { int x = ; } }", language="java"
    )
    assert body["status"] == "Failed"
    assert body["run_result"] is None
    assert body["compile_result"]["return_code"] == 1


@pytest.mark.needs_language("rust")
def test_rust_panic(target: Target) -> None:
    body = target.run_code('fn main() { panic!("boom"); }', language="rust")
    assert body["run_result"]["return_code"] == 101
    assert "boom" in body["run_result"]["stderr"]


def test_scala_without_object_is_a_sandbox_error(target: Target) -> None:
    # Checked before any toolchain runs, so every deployment answers the same.
    body = target.run_code("class A", language="scala")
    assert body["status"] == "SandboxError"
    compiled = body["compile_result"]
    assert (compiled["status"], compiled["return_code"], compiled["stderr"]) == (
        "Error",
        1,
        "Object name not found.",
    )
    assert body["message"] == "Object name not found."
    assert body["run_result"] is None
