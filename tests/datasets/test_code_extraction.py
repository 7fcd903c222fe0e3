"""Code extraction as SandboxFusion's evaluators do it (no sockets, no subprocesses)."""

from __future__ import annotations

import pytest

from mocksandbox.datasets.extraction import (
    CodeBlock,
    default_extract_helper,
    extract_best_block,
    extract_code_from_freeform_completion,
    extract_code_from_freeform_completion_v2,
    extract_custom_code,
    extract_fenced_code,
    extract_heuristic_code,
    extract_incomplete_fenced_code,
    language_of_info,
    remove_entrypoints,
)


@pytest.mark.parametrize(
    ("info", "language"),
    [
        ("python", "python"),
        ("py", "python"),
        ("c++", "cpp"),
        ("JS", "nodejs"),
        ("Verilog", "verilog"),
        ("ts", ""),
    ],
)
def test_language_of_info(info: str, language: str) -> None:
    assert language_of_info(info) == language


def test_fenced_and_incomplete_blocks() -> None:
    text = "a\n```python\nx = 1\n\n```\nb\n```cpp\nint y;\n```"
    assert [(b.language, b.code) for b in extract_fenced_code(text)] == [
        ("python", "x = 1"),
        ("cpp", "int y;"),
    ]
    cut = "```python\nprint(1)\nprint(2"
    assert [b.code for b in extract_incomplete_fenced_code(cut)] == ["print(1)\nprint(2"]


def test_heuristics_per_language() -> None:
    text = "Here:\nimport os\ndef f():\n    return 1\n\nThanks"
    assert [b.code for b in extract_heuristic_code(text, "python")] == ["import os\ndef f():\n    return 1\n"]
    assert [b.code for b in extract_heuristic_code("x\nSELECT a FROM t;", "sql")] == ["SELECT a FROM t"]
    assert [b.code for b in extract_heuristic_code("\n\necho hi\n", "bash")] == ["echo hi\n"]
    assert extract_heuristic_code("whatever", "go") == []


def test_default_helper_prefers_priority_then_language() -> None:
    text = "```cpp\nint main(){}\n```\n```python\nprint(1)\n```"
    assert default_extract_helper(text, "python") == "print(1)"
    assert default_extract_helper(text, "java") == "int main(){}"
    assert default_extract_helper("nothing", "python") == ""
    assert extract_best_block("def g():\n    return 0\n", "python") == (
        "def g():\n    return 0\n",
        "heuristic",
    )


def test_custom_blocks_and_their_errors() -> None:
    logic = "submit_code_blocks([CodeBlock(priority=99, language='python', code=completion.upper())])"
    assert extract_best_block("x", "python", logic) == ("X", None)
    assert extract_custom_code("x", "submit_code_blocks([])") == []
    with pytest.raises(AssertionError, match="must be class CodeBlock"):
        extract_custom_code("x", "submit_code_blocks(['nope'])")
    with pytest.raises(ZeroDivisionError):
        extract_custom_code("x", "1/0")
    assert CodeBlock(30, "python", "a") == CodeBlock(priority=30, language="python", code="a")


def test_freeform_v1() -> None:
    text = '```python\ndef f():\n    pass\nif __name__ == "__main__":\n    f()\n```\n```python\nx\n```'
    assert extract_code_from_freeform_completion(text, "python", first_block_only=True) == (
        "def f():\n    pass",
        "fenced",
    )
    joined, kind = extract_code_from_freeform_completion("```\na\n```\n```\nb\n```")
    assert (joined, kind) == ("a\n\nb", "fenced")
    assert extract_code_from_freeform_completion("plain words", "python") == ("", "empty")
    assert (
        extract_code_from_freeform_completion("```cpp\nint f();\nint main() {}\n```", "cpp")[0] == "int f();"
    )


def test_freeform_v2_repairs_and_postprocesses() -> None:
    llama = "```\npython\nprint(1)\n```"
    assert extract_code_from_freeform_completion_v2(llama, "python", True) == ("print(1)", "fenced")
    verilog = "```verilog\nmodule top_module (input a, output b);\nassign b = a;\nendmodule\n```"
    assert (
        extract_code_from_freeform_completion_v2(verilog, "verilog", True)[0]
        == "\nassign b = a;\n\nendmodule"
    )
    go = "```go\npackage main\nfunc add(a, b int) int { return a + b }\nfunc main() { println(1) }\n```"
    assert "func main" not in extract_code_from_freeform_completion_v2(go, "go", True)[0]
    other = "```cpp\nint x;\n```"
    assert (
        extract_code_from_freeform_completion_v2(other, "python", True, exactly_match=True)[1]
        == "incomplete_fenced"
    )


def test_remove_entrypoints() -> None:
    assert remove_entrypoints('x = 1\nif __name__ == "__main__":\n    main()', "python") == "x = 1"
    assert remove_entrypoints("package main\nfunc f() {}", "go") == "\nfunc f() {}"
    assert remove_entrypoints("a\n# Example usage\nb") == "a"
