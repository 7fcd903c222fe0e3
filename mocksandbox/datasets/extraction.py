"""Finding the program in a model's completion, the way SandboxFusion's evaluators do.

Three kinds of block, each with a priority:

* **fenced** (30): a complete Markdown block, three backticks and an optional info string on the
  opening line, the code, then three backticks after a line break (blank lines before them
  dropped);
* **incomplete fenced** (20): everything after an opening fence line, to the end (a completion cut
  off by its token limit; a complete block matches too);
* **heuristic** (10): no fence needed. Python: top-level ``def``/``class`` blocks with the
  ``import``/``from``/comment lines right above them; SQL: ``SELECT``/``WITH`` statements; bash: the
  whole completion without blank lines; other languages: none.

Evaluators combine them in one of three ways, as in SandboxFusion:

* :func:`default_extract_helper` pools every kind plus ``custom_extract_logic`` blocks, keeps those
  of the highest priority and takes the first in the target language, else the first;
* :func:`extract_code_from_freeform_completion` (``v1``) takes fenced blocks, else incomplete, else
  heuristic ones, joins them (or takes the first) and trims entry points per language;
* :func:`extract_code_from_freeform_completion_v2` does the same with fixes for malformed fences
  and a per-language post-processing (:func:`postprocess_completion_v2`).

Behaviour, alias tables and regular expressions follow SandboxFusion's ``sandbox/utils/extraction.py``
(Apache-2.0, Copyright 2024 Bytedance Ltd.), reimplemented here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mocksandbox.datasets.models import ExtractedType

#: Priorities of the built-in kinds; custom blocks may use any number.
FENCED_PRIORITY = 30
INCOMPLETE_FENCED_PRIORITY = 20
HEURISTIC_PRIORITY = 10

#: Info strings models write after a fence, by the language they name (SandboxFusion's table,
#: including its language names that are not sandbox languages: ``D``, ``c``, ``html``, ...).
LANGUAGE_ALIASES: dict[str, tuple[str, ...]] = {
    "python": ("python", "Python", "py", "Python3", "python3", "PY"),
    "cpp": ("cpp", "c++", "C++", "Cpp", "CPP"),
    "nodejs": ("javascript", "Javascript", "JavaScript", "JS", "js"),
    "go": ("go", "Go"),
    "java": ("java", "Java"),
    "php": ("php", "PHP"),
    "csharp": ("csharp", "c#", "C#"),
    "bash": ("bash", "Bash", "BASH", "sh", "shell"),
    "typescript": ("typescript",),
    "rust": ("rust", "Rust", "rs"),
    "sql": ("sql", "SQL", "Sql"),
    "D": ("D", "d"),
    "julia": ("julia", "Julia", "jl"),
    "lua": ("lua", "Lua"),
    "perl": ("perl", "Perl", "PERL"),
    "R": ("R", "r"),
    "ruby": ("ruby", "Ruby"),
    "scala": ("scala", "Scala"),
    "kotlin": ("kotlin", "Kotlin"),
    "c": ("c", "C"),
    "html": ("html", "Html", "HTML"),
    "javascript": ("javascript", "Javascript", "JavaScript"),
    "verilog": ("verilog", "Verilog", "VERILOG"),
    "racket": ("racket",),
    "swift": ("swift",),
}
# Later entries win, as in SandboxFusion's dict comprehension ("javascript" names `javascript`).
_LANGUAGE_BY_ALIAS = {alias: language for language, aliases in LANGUAGE_ALIASES.items() for alias in aliases}

_FENCED = re.compile(r"```([^\n]*)\n(.*?)\n\s*```", re.DOTALL | re.MULTILINE)
_INCOMPLETE_FENCED = re.compile(r"```([^\n]*)\n(.*)", re.DOTALL | re.MULTILINE)
_PY_DEFINITIONS = re.compile(
    r"(?:^(?:import|from|#)[^\n]+\n)*^(?:def|class) [^\n]+\n(?:\s+[^\n]+\n)+", re.MULTILINE
)
_SQL_STATEMENTS = re.compile(r"^\s*(?:select|with\s[^\n]+as)[^;]*", re.MULTILINE | re.IGNORECASE)


@dataclass
class CodeBlock:
    """A candidate program: where it came from (``priority``), its language (``""`` unknown), its text."""

    priority: int
    language: str
    code: str


def language_of_info(info: str) -> str:
    """The language an info string (``py``, ``c++``, ...) names, or ``""``."""
    return _LANGUAGE_BY_ALIAS.get(info.strip(), "")


def extract_fenced_code(completion: str) -> list[CodeBlock]:
    """Every complete fenced block, in order."""
    return [
        CodeBlock(FENCED_PRIORITY, language_of_info(info), code) for info, code in _FENCED.findall(completion)
    ]


def extract_incomplete_fenced_code(completion: str) -> list[CodeBlock]:
    """The text after the first opening fence line, to the end."""
    return [
        CodeBlock(INCOMPLETE_FENCED_PRIORITY, language_of_info(info), code)
        for info, code in _INCOMPLETE_FENCED.findall(completion)
    ]


def _without_blank_lines(text: str) -> str:
    return "\n".join(line for line in text.split("\n") if line.strip() != "") + "\n"


def extract_heuristic_code(completion: str, language: str = "") -> list[CodeBlock]:
    """Unfenced code: Python definitions, SQL statements, or a whole bash script."""
    if language == "python":
        found = _PY_DEFINITIONS.findall(_without_blank_lines(completion))
        return [CodeBlock(HEURISTIC_PRIORITY, "python", code) for code in found]
    if language == "sql":
        found = _SQL_STATEMENTS.findall(_without_blank_lines(completion))
        return [CodeBlock(HEURISTIC_PRIORITY, "sql", code) for code in found]
    if language == "bash":
        return [CodeBlock(HEURISTIC_PRIORITY, "bash", _without_blank_lines(completion))]
    return []


def extract_custom_code(completion: str, logic: str) -> list[CodeBlock]:
    """Run ``custom_extract_logic`` (Python, in this process, as SandboxFusion does) and collect what
    it passes to ``submit_code_blocks``. Its names: ``completion``, ``CodeBlock``,
    ``submit_code_blocks``, ``extract_fenced_code``, ``extract_heuristic_code``. Whatever it raises
    reaches the caller (SandboxFusion's answer is then a 500 with that message)."""
    blocks: list[CodeBlock] = []

    def submit_code_blocks(candidates: list[CodeBlock]) -> None:
        for block in candidates:
            if not isinstance(block, CodeBlock):
                raise AssertionError("extrace code type must be class CodeBlock")  # sic, as SandboxFusion
            blocks.append(block)

    names: dict[str, Any] = {
        "completion": completion,
        "CodeBlock": CodeBlock,
        "submit_code_blocks": submit_code_blocks,
        "extract_fenced_code": extract_fenced_code,
        "extract_heuristic_code": extract_heuristic_code,
    }
    exec(compile(logic, "<custom_extract_logic>", "exec"), names)
    return blocks


def default_extract_helper(
    completion: str, language: str = "", custom_extract_logic: str | None = None
) -> str:
    """Pool fenced, heuristic, incomplete fenced and custom blocks; keep those of the highest
    priority; take the first in ``language``, else the first; ``""`` when there is none."""
    blocks = extract_fenced_code(completion)
    blocks += extract_heuristic_code(completion, language)
    blocks += extract_incomplete_fenced_code(completion)
    if custom_extract_logic is not None:
        blocks += extract_custom_code(completion, custom_extract_logic)
    if not blocks:
        return ""
    best = max(block.priority for block in blocks)
    top = [block for block in blocks if block.priority == best]
    return next((block for block in top if block.language == language), top[0]).code


def extract_best_block(
    completion: str, language: str = "", custom_logic: str | None = None
) -> tuple[str, ExtractedType | None]:
    """:func:`default_extract_helper` plus the kind of the block taken (``None`` for a custom block
    of another priority, ``"empty"`` when there is no block)."""
    blocks = extract_fenced_code(completion)
    blocks += extract_heuristic_code(completion, language)
    blocks += extract_incomplete_fenced_code(completion)
    if custom_logic is not None:
        blocks += extract_custom_code(completion, custom_logic)
    if not blocks:
        return "", "empty"
    best = max(block.priority for block in blocks)
    top = [block for block in blocks if block.priority == best]
    chosen = next((block for block in top if block.language == language), top[0])
    kinds: dict[int, ExtractedType] = {
        FENCED_PRIORITY: "fenced",
        INCOMPLETE_FENCED_PRIORITY: "incomplete_fenced",
        HEURISTIC_PRIORITY: "heuristic",
    }
    return chosen.code, kinds.get(chosen.priority)


def _cut_at(code: str, marker: str, strip: bool = True) -> str:
    if marker in code:
        code = code[: code.index(marker)]
        return code.strip() if strip else code
    return code


def remove_entrypoints(code: str, language: str = "") -> str:
    """Cut a Python ``__main__`` guard or a C++ ``int main()`` and what follows, drop Go's
    ``package main``, and cut at ``# Example usage``."""
    if language == "python":
        code = _cut_at(code, 'if __name__ == "__main__":')
    elif language == "cpp":
        code = _cut_at(code, "int main()")
    elif language == "go":
        code = code.replace("package main", "")
    return _cut_at(code, "# Example usage")


def _select_blocks(
    completion: str, language: str, adjust: bool, **options: Any
) -> tuple[list[CodeBlock], ExtractedType]:
    """Fenced blocks (narrowed by ``is_fewshot_task`` and ``exactly_match``), else incomplete
    fenced, else heuristic ones; with the kind found."""
    blocks = extract_fenced_code(completion)
    if adjust:
        blocks = _adjust_code_blocks(blocks, language)
    if options.get("is_fewshot_task") is True:
        # A few-shot answer is followed by made-up next questions: keep up to the first block in the
        # language (else the first untagged one).
        first_in_language = next((i for i, b in enumerate(blocks) if b.language == language), -1)
        first_untagged = next((i for i, b in enumerate(blocks) if b.language == ""), -1)
        first = first_untagged if first_in_language == -1 else first_in_language
        if first != -1:
            blocks = blocks[: first + 1]
    if options.get("exactly_match") is True and language:
        if adjust:
            wanted = LANGUAGE_ALIASES.get(language, ())
            blocks = [b for b in blocks if b.language in wanted]
        else:
            others = {
                alias for name, aliases in LANGUAGE_ALIASES.items() if name != language for alias in aliases
            }
            blocks = [b for b in blocks if b.language not in others]
    if blocks:
        return blocks, "fenced"
    blocks = extract_incomplete_fenced_code(completion)
    if blocks:
        return blocks, "incomplete_fenced"
    blocks = extract_heuristic_code(completion, language)
    if blocks:
        return blocks, "heuristic"
    return [], "empty"


def _join_blocks(blocks: list[CodeBlock], first_block_only: bool, options: dict[str, Any]) -> str:
    index = options.get("code_block_idx")
    if index is not None:
        try:
            return str(blocks[index].code).replace("\r", "")
        except (IndexError, TypeError):
            return ""
    if first_block_only:
        return blocks[0].code.replace("\r", "") if blocks else ""
    return "\n\n".join(block.code for block in blocks).replace("\r", "")


def _adjust_code_blocks(blocks: list[CodeBlock], language: str) -> list[CodeBlock]:
    # Llama 3 sometimes writes the language on the line after a bare fence.
    if language == "" or language not in LANGUAGE_ALIASES:
        return blocks
    for block in blocks:
        lines = block.code.splitlines()
        if block.language == "" and lines and lines[0].strip() in LANGUAGE_ALIASES[language]:
            block.language = language
            block.code = "\n".join(lines[1:])
    return blocks


def extract_code_from_freeform_completion(
    completion: str, language: str = "", first_block_only: bool = False, **options: Any
) -> tuple[str, ExtractedType]:
    """SandboxFusion's first free-form extraction: ``(code, extracted_type)``. Options:
    ``is_fewshot_task``, ``exactly_match``, ``code_block_idx``, ``remove_asserts``, ``entry_point``
    and ``declaration`` (Java)."""
    blocks, kind = _select_blocks(completion, language, adjust=False, **options)
    code = _join_blocks(blocks, first_block_only, options)
    if language == "python":
        if options.get("remove_asserts") is True:
            code = "\n".join(line for line in code.split("\n") if not line.startswith("assert "))
        code = _cut_at(code, 'if __name__ == "__main__":')
    elif language == "cpp":
        code = _cut_at(code, "int main()")
    elif language == "java":
        code = _java_solution_class(code, options)
    elif language == "go":
        code = code.replace("package main", "")
    return _cut_at(code, "# Example usage"), kind


def _java_solution_class(code: str, options: dict[str, Any], drop_public_solution: bool = False) -> str:
    if "public class Main {\n" in code:
        code = code.replace("public class Main {\n", "class Solution {\n")
        code = code.replace("public static void main(String[] args)", "")
    if drop_public_solution and "public class Solution {" in code:
        code = code.replace("public class Solution {", "class Solution {")
    entry_point = options.get("entry_point")
    if "class Solution" not in code and entry_point:
        for line in code.split("\n"):
            if entry_point in line:
                code = code.replace(line, "class Solution {\n" + line) + "\n}"
                break
    for line in str(options.get("declaration", "")).split("\n"):
        if "import" in line:
            code = line + "\n" + code
    return code


def extract_code_from_freeform_completion_v2(
    completion: str,
    language: str = "",
    first_block_only: bool = False,
    no_removal: bool = False,
    **options: Any,
) -> tuple[str, ExtractedType]:
    """SandboxFusion's second free-form extraction (``autoeval-v5``): malformed fences repaired,
    then :func:`postprocess_completion_v2` unless ``is_ut``. Options as for v1, plus
    ``inner_function_only`` (Java, C#)."""
    original = completion
    completion = completion.replace("```\n```", "```")
    blocks, kind = _select_blocks(completion, language, adjust=True, **options)
    code = _join_blocks(blocks, first_block_only, options)
    if options.get("is_ut") is not True:
        code = postprocess_completion_v2(code, language, no_removal, original, **options)
    return _cut_at(code, "# Example usage"), kind


def find_inner_function_body(signature_pattern: str, code: str) -> tuple[int, int] | None:
    """Start and end of the first function whose signature (ending in ``{``) matches, found by
    counting braces; ``None`` if there is none or its braces do not balance."""
    match = re.search(signature_pattern, code, re.DOTALL | re.MULTILINE)
    if match is None:
        return None
    depth = 1
    index = None
    for index in range(match.end(), len(code)):
        if code[index] == "{":
            depth += 1
        elif code[index] == "}":
            depth -= 1
        if depth == 0:
            break
    if index is None or depth != 0:
        return None
    return match.start(), index + 1


def postprocess_completion_v2(
    code: str, language: str, no_removal: bool, original: str, **options: Any
) -> str:
    """Per-language trimming after v2 extraction: entry points, wrapper classes and modules."""
    inner_function_only = options.get("inner_function_only") is True
    if language == "python":
        lines = code.splitlines()
        guard = next((i for i, line in enumerate(lines) if "__name__" in line and "__main__" in line), None)
        code = "\n".join(lines if guard is None else lines[:guard])
        if options.get("remove_asserts") is True:
            code = "\n".join(line for line in code.splitlines() if not line.startswith("assert "))
    elif language in ("cpp", "c"):
        code = _cut_at(code, "int main()")
    elif language == "java":
        if inner_function_only:
            body = find_inner_function_body(
                r"(public|private|protected)\s+(static\s+)(.*?)\((.*?)\)\s*{", code
            )
            if body is not None:
                code = code[body[0] : body[1]]
        else:
            code = _java_solution_class(code, options, drop_public_solution=True)
    elif language == "go":
        if not no_removal:
            code = code.replace("package main", "")
        body = find_inner_function_body(r"func\s+main\(.*?\)\s*{", code)
        if body is not None:
            code = code[: body[0]] + code[body[1] :]
    elif language == "scala":
        found = re.findall(r"object\s+\w+(\s+extends\s+\w+)?\s*\n*\{(.*)\}", code, re.DOTALL | re.MULTILINE)
        if found:
            code = found[0][1]
    elif language == "verilog":
        found = re.findall(r"module\s+\w+\s+\((.*?)\);(.*?)endmodule", code, re.DOTALL | re.MULTILINE)
        if found:
            code = found[0][1] + "\nendmodule"
        if code == "":
            code = original
    elif language == "csharp":
        if inner_function_only:
            body = find_inner_function_body(
                r"(public|private|protected|internal)\s+(static\s+)(.*?)\((.*?)\)\s*{", code
            )
            if body is not None:
                code = code[body[0] : body[1]]
    elif language == "kotlin":
        body = find_inner_function_body(r"fun\s+main\(.*?\)\s*{", code)
        if body is not None:
            code = code[: body[0]] + code[body[1] :]
    return code
