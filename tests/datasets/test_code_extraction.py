"""Code extraction from completions: each kind of block, the two selection rules, custom logic."""

from __future__ import annotations

import pytest

from mocksandbox.datasets.extraction import (
    CodeBlock,
    CustomExtractionError,
    extract_best_block,
    extract_custom_code,
    extract_fenced_code,
    extract_first_block,
    extract_heuristic_code,
    extract_incomplete_fenced_code,
    language_of_info,
)

# -- fenced ---------------------------------------------------------------------------------------


def test_fenced_block_with_info_string() -> None:
    [block] = extract_fenced_code("Here:\n```python\ndef f():\n    return 1\n```\nDone.")
    assert block == CodeBlock(30, "python", "def f():\n    return 1")


def test_fenced_blocks_in_order_and_languages_by_alias() -> None:
    completion = "```py\na = 1\n```\ntext\n```c++\nint x;\n```\n```\nplain\n```"
    blocks = extract_fenced_code(completion)
    assert [(b.language, b.code) for b in blocks] == [("python", "a = 1"), ("cpp", "int x;"), ("", "plain")]


def test_blank_lines_before_the_closing_fence_are_dropped() -> None:
    [block] = extract_fenced_code("```python\nx = 1\n\n\n```")
    assert block.code == "x = 1"


def test_indented_closing_fence_ends_the_block() -> None:
    [block] = extract_fenced_code("```python\nx = 1\n    ```\nafter")
    assert block.code == "x = 1"


@pytest.mark.parametrize(
    ("info", "language"),
    [
        ("python", "python"),
        (" Python3 ", "python"),
        ("js", "nodejs"),
        ("c#", "csharp"),
        ("sh", "bash"),
        ("x", ""),
    ],
)
def test_language_of_info(info: str, language: str) -> None:
    assert language_of_info(info) == language


# -- incomplete fenced ------------------------------------------------------------------------------


def test_incomplete_fenced_takes_the_rest() -> None:
    [block] = extract_incomplete_fenced_code("Sure!\n```python\ndef f(x):\n    return x +")
    assert block == CodeBlock(20, "python", "def f(x):\n    return x +")


def test_no_fence_no_incomplete_block() -> None:
    assert extract_incomplete_fenced_code("no code here") == []


# -- heuristic -----------------------------------------------------------------------------------


def test_python_heuristic_takes_definitions_with_their_imports() -> None:
    completion = (
        "I would write:\n\nimport math\nfrom typing import List\ndef area(r):\n    return math.pi * r * r\n"
        "That is all.\nclass Box:\n    size = 1\n"
    )
    blocks = extract_heuristic_code(completion, "python")
    assert [b.code for b in blocks] == [
        "import math\nfrom typing import List\ndef area(r):\n    return math.pi * r * r\n",
        "class Box:\n    size = 1\n",
    ]
    assert {b.priority for b in blocks} == {10}


def test_python_heuristic_skips_blank_lines_and_needs_a_body() -> None:
    assert (
        extract_heuristic_code("def f(x):\n\n    return x\n", "python")[0].code == "def f(x):\n    return x\n"
    )
    assert extract_heuristic_code("def f(x): return x\n", "python") == []


def test_bash_heuristic_is_every_non_blank_line() -> None:
    [block] = extract_heuristic_code("echo 1\n\n  ls -l\n", "bash")
    assert block.code == "echo 1\n  ls -l\n"


def test_no_heuristic_for_other_languages() -> None:
    assert extract_heuristic_code("int main() {\n  return 0;\n}\n", "cpp") == []


# -- first block (MBPP, free-form) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "code", "kind"),
    [
        ("```python\na = 1\n```\n```python\nb = 2\n```", "a = 1", "fenced"),
        ("```\r\nx = 1\r\n```", "x = 1", "fenced"),
        ("```python\ndef f():\n    pass", "def f():\n    pass", "incomplete_fenced"),
        ("def f():\n    return 2\n", "def f():\n    return 2\n", "heuristic"),
        ("I cannot solve this.", "", "empty"),
        ("", "", "empty"),
    ],
    ids=["fenced-first", "crlf", "incomplete", "heuristic", "prose", "nothing"],
)
def test_extract_first_block(completion: str, code: str, kind: str) -> None:
    assert extract_first_block(completion, "python") == (code, kind)


def test_first_block_cuts_the_main_guard_for_python() -> None:
    completion = '```python\ndef f():\n    return 1\n\nif __name__ == "__main__":\n    print(f())\n```'
    assert extract_first_block(completion, "python") == ("def f():\n    return 1", "fenced")
    assert extract_first_block(completion, "bash")[0].endswith("print(f())")


# -- best block (online judges) -------------------------------------------------------------------


def test_best_block_prefers_the_target_language_among_the_best_kind() -> None:
    completion = "```cpp\nint main(){}\n```\n```python\nprint(1)\n```"
    assert extract_best_block(completion, "python") == ("print(1)", "fenced")
    assert extract_best_block(completion, "cpp") == ("int main(){}", "fenced")
    assert extract_best_block(completion, "java") == ("int main(){}", "fenced")  # else the first


def test_best_block_fenced_beats_heuristic() -> None:
    completion = "def g():\n    return 0\n```python\nprint(2)\n```"
    assert extract_best_block(completion, "python") == ("print(2)", "fenced")


def test_best_block_falls_back_to_heuristic_then_empty() -> None:
    assert extract_best_block("def g():\n    return 0\n", "python") == (
        "def g():\n    return 0\n",
        "heuristic",
    )
    assert extract_best_block("nothing at all", "python") == ("", "empty")


# -- custom logic -----------------------------------------------------------------------------------


def test_custom_logic_can_outrank_every_built_in_kind() -> None:
    logic = "submit_code_blocks([CodeBlock(priority=40, language='python', code=completion.upper())])"
    assert extract_best_block("```python\nx\n```", "python", logic) == ("```PYTHON\nX\n```", None)


def test_custom_logic_sees_the_helpers() -> None:
    logic = "submit_code_blocks(extract_fenced_code(completion) + extract_heuristic_code(completion, 'bash'))"
    blocks = extract_custom_code("```sh\nls\n```", logic)
    assert [b.priority for b in blocks] == [30, 10]


def test_custom_logic_must_submit_code_blocks() -> None:
    with pytest.raises(CustomExtractionError, match="must be class CodeBlock"):
        extract_custom_code("x", "submit_code_blocks(['not a block'])")


def test_custom_logic_errors_are_reported_with_their_message() -> None:
    with pytest.raises(CustomExtractionError, match="division by zero") as info:
        extract_custom_code("x", "1 / 0")
    assert isinstance(info.value.__cause__, ZeroDivisionError)
