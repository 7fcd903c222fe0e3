"""Finding the program in a model's completion, the way SandboxFusion's evaluators do.

Three kinds of block, best first:

* **fenced**: a complete Markdown block, three backticks and an optional info string on the opening
  line, the code, then a line of three backticks (trailing blank lines before it are dropped);
* **incomplete fenced**: an opening fence that is never closed (a completion cut off by its token
  limit): everything after the opening line;
* **heuristic**: no fence at all. Python: top-level ``def``/``class`` blocks with the ``import``,
  ``from`` and comment lines right above them; bash: every non-blank line; other languages: none.

When nothing is found the code is ``""`` and the kind is ``empty``. Two selection rules exist, as
in SandboxFusion: :func:`extract_first_block` takes the first block of the best kind present (its
MBPP and free-form evaluators), :func:`extract_best_block` pools every kind plus custom blocks and
prefers blocks of the target language among those of the highest priority (its online-judge ones).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mocksandbox.datasets.models import ExtractedType

#: Priorities of the built-in kinds; custom blocks may use any number.
FENCED_PRIORITY = 30
INCOMPLETE_FENCED_PRIORITY = 20
HEURISTIC_PRIORITY = 10

_KIND_BY_PRIORITY: dict[int, ExtractedType] = {
    FENCED_PRIORITY: "fenced",
    INCOMPLETE_FENCED_PRIORITY: "incomplete_fenced",
    HEURISTIC_PRIORITY: "heuristic",
}

# Info strings models write after the fence, by the language name the sandbox uses.
_INFO_STRINGS: dict[str, tuple[str, ...]] = {
    "python": ("python", "Python", "py", "PY", "python3", "Python3"),
    "cpp": ("cpp", "c++", "C++", "Cpp", "CPP"),
    "nodejs": ("javascript", "Javascript", "JavaScript", "js", "JS"),
    "typescript": ("typescript", "ts"),
    "go": ("go", "Go", "golang"),
    "java": ("java", "Java"),
    "csharp": ("csharp", "c#", "C#", "cs"),
    "php": ("php", "PHP"),
    "bash": ("bash", "Bash", "BASH", "sh", "shell"),
    "rust": ("rust", "Rust", "rs"),
    "sql": ("sql", "SQL", "Sql"),
    "julia": ("julia", "Julia", "jl"),
    "lua": ("lua", "Lua"),
    "perl": ("perl", "Perl", "PERL"),
    "R": ("R", "r"),
    "ruby": ("ruby", "Ruby", "rb"),
    "scala": ("scala", "Scala"),
    "kotlin_script": ("kotlin", "Kotlin", "kt"),
    "swift": ("swift", "Swift"),
    "racket": ("racket", "Racket"),
    "verilog": ("verilog", "Verilog", "VERILOG"),
    "D_ut": ("d", "D"),
    "lean": ("lean", "Lean", "lean4"),
}
_LANGUAGE_BY_INFO = {info: language for language, infos in _INFO_STRINGS.items() for info in infos}

# Lazy code so that a block ends at its first closing fence; `\s*` lets blank lines precede it.
_FENCED = re.compile(r"```(?P<info>[^\n]*)\n(?P<code>.*?)\n\s*```", re.DOTALL)
# Greedy: the rest of the completion after an opening fence line.
_INCOMPLETE_FENCED = re.compile(r"```(?P<info>[^\n]*)\n(?P<code>.*)", re.DOTALL)
_PY_HEADER = re.compile(r"(?:import|from|#).")
_PY_DEFINITION = re.compile(r"(?:def|class) ")


@dataclass
class CodeBlock:
    """A candidate program: where it came from (``priority``), its language (``""`` unknown), its text."""

    priority: int
    language: str
    code: str


def language_of_info(info: str) -> str:
    """The sandbox language an info string (``py``, ``c++``, ...) names, or ``""``."""
    return _LANGUAGE_BY_INFO.get(info.strip(), "")


def extract_fenced_code(completion: str) -> list[CodeBlock]:
    """Every complete fenced block, in order."""
    return [
        CodeBlock(FENCED_PRIORITY, language_of_info(m["info"]), m["code"])
        for m in _FENCED.finditer(completion)
    ]


def extract_incomplete_fenced_code(completion: str) -> list[CodeBlock]:
    """The text after the first opening fence, to the end (also matches a complete block)."""
    return [
        CodeBlock(INCOMPLETE_FENCED_PRIORITY, language_of_info(m["info"]), m["code"])
        for m in _INCOMPLETE_FENCED.finditer(completion)
    ]


def _non_blank_lines(text: str) -> list[str]:
    return [line for line in text.split("\n") if line.strip()]


def _python_definitions(text: str) -> list[str]:
    """Top-level ``def``/``class`` blocks with a body, each with the header lines right above it."""
    lines = _non_blank_lines(text)
    blocks: list[str] = []
    index = 0
    while index < len(lines):
        start = index
        while index < len(lines) and _PY_HEADER.match(lines[index]):
            index += 1
        if index < len(lines) and _PY_DEFINITION.match(lines[index]):
            end = index + 1
            while end < len(lines) and lines[end][:1].isspace():
                end += 1
            if end > index + 1:  # a definition needs an indented body
                blocks.append("\n".join(lines[start:end]) + "\n")
                index = end
                continue
        index = max(index, start + 1)
    return blocks


def extract_heuristic_code(completion: str, language: str = "") -> list[CodeBlock]:
    """Unfenced code: Python definitions, or a whole bash script; nothing for other languages."""
    if language == "python":
        return [CodeBlock(HEURISTIC_PRIORITY, "python", code) for code in _python_definitions(completion)]
    if language == "bash":
        lines = _non_blank_lines(completion)
        return [CodeBlock(HEURISTIC_PRIORITY, "bash", "\n".join(lines) + "\n")] if lines else []
    return []


class CustomExtractionError(Exception):
    """``custom_extract_logic`` raised or submitted something that is not a :class:`CodeBlock`."""


def extract_custom_code(completion: str, logic: str) -> list[CodeBlock]:
    """Run ``custom_extract_logic`` (Python, in this process, as SandboxFusion does) and collect what
    it passes to ``submit_code_blocks``. Its names: ``completion``, ``CodeBlock``,
    ``submit_code_blocks``, ``extract_fenced_code``, ``extract_heuristic_code``."""
    blocks: list[CodeBlock] = []

    def submit_code_blocks(candidates: list[CodeBlock]) -> None:
        for block in candidates:
            if not isinstance(block, CodeBlock):
                raise CustomExtractionError("extract code type must be class CodeBlock")
            blocks.append(block)

    names: dict[str, Any] = {
        "completion": completion,
        "CodeBlock": CodeBlock,
        "submit_code_blocks": submit_code_blocks,
        "extract_fenced_code": extract_fenced_code,
        "extract_heuristic_code": extract_heuristic_code,
    }
    try:
        exec(compile(logic, "<custom_extract_logic>", "exec"), names)
    except CustomExtractionError:
        raise
    except Exception as exc:  # the client's code: whatever it raises is its answer (HTTP 500)
        raise CustomExtractionError(str(exc)) from exc
    return blocks


def _python_entry_point_trimmed(code: str) -> str:
    marker = 'if __name__ == "__main__":'
    if marker in code:
        code = code[: code.index(marker)].strip()
    return code


def extract_first_block(completion: str, language: str = "") -> tuple[str, ExtractedType]:
    """The first block of the best kind found (fenced, else incomplete fenced, else heuristic), with
    carriage returns removed and, for Python, a ``__main__`` guard cut off; ``("", "empty")`` if none."""
    finders: list[tuple[ExtractedType, Callable[[], list[CodeBlock]]]] = [
        ("fenced", lambda: extract_fenced_code(completion)),
        ("incomplete_fenced", lambda: extract_incomplete_fenced_code(completion)),
        ("heuristic", lambda: extract_heuristic_code(completion, language)),
    ]
    for kind, find in finders:
        blocks = find()
        if blocks:
            code = blocks[0].code.replace("\r", "")
            return (_python_entry_point_trimmed(code) if language == "python" else code), kind
    return "", "empty"


def extract_best_block(
    completion: str, language: str = "", custom_logic: str | None = None
) -> tuple[str, ExtractedType | None]:
    """Pool fenced, heuristic, incomplete fenced and custom blocks; keep those of the highest
    priority; take the first in ``language``, else the first. The kind is ``None`` for a custom block
    of another priority, ``"empty"`` when there is no block at all."""
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
    return chosen.code, _KIND_BY_PRIORITY.get(chosen.priority)
