"""Read the request corpora in ``fixtures/corpus`` and compare answers with what they expect.

Plain functions over JSON data: the same helpers serve the Flask test client in the project's
tests and the HTTP clients of the differential contract mode.

A corpus is JSON Lines, one case per line::

    {"name": "success",                      # unique, used as the test id
     "source": "§2.4 Success",                # where the contract documents it
     "toolchain": "g++",                      # optional: skip unless this binary is on PATH
     "toolchain_absent": "dotnet",            # optional: skip if this binary IS on PATH
     "note": "...",                           # optional: why the case is built as it is
     "request": {"method": "POST", "path": "/run_code",
                 "json": {...}}               # a JSON body (Content-Type: application/json), or
                 # "body": "<raw text>", "content_type": "<type>" | null   (null: no Content-Type)
     "expect": {"http_status": 200,
                "status": ..., "message": ..., "files": {...},        # a /run_code answer:
                "compile_result": null | {"status", "return_code", "stdout", "stderr"},
                "run_result": null | {...},
                # or "detail": [...]       the 422 items, verbatim
                # or "body": <JSON>        the whole body, verbatim
                # and optionally "content_type": "application/json"
               }}

Expected texts are the contract's verbatim texts; they contain the temp paths and interpreter
details of the machine they were recorded on. :func:`normalize_text` maps both sides to the same
placeholders before comparing, and ``execution_time`` is never compared.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: ``fixtures/corpus`` of the checkout; the package reaches it through the ``corpus`` symlink
#: beside this module, which wheels carry as a real directory.
CORPUS_DIR = Path(__file__).resolve().parent / "corpus"

RESULT_KEYS = ("status", "return_code", "stdout", "stderr")

# A code file with a random tempfile name in a temp dir made by tempfile (``tmp`` + 8 characters
# of [a-z0-9_]), under any parent: ``/tmp/tmpdw3m0zaa/tmpu138rp_a.py`` -> ``<TMP>/<CODE>.py``.
_TMP_FILE = re.compile(r"(?:/[\w.\-]+)*?/tmp[a-z0-9_]{8}/tmp[a-z0-9_]{8}(?![a-z0-9_])")
# Any other such temp dir: ``/tmp/tmpdw3m0zaa`` -> ``<TMP>``.
_TMP_DIR = re.compile(r"(?:/[\w.\-]+)*?/tmp[a-z0-9_]{8}(?![a-z0-9_])")
# The dynamic loader names the interpreter as it was invoked and the library it failed on.
_LOADER_FAILURE = re.compile(
    r"^\S*?(python[\d.]*): error while loading shared libraries: [^:\s]+:", re.MULTILINE
)
# An absolute path to a Python interpreter, as a whole word (``/usr/bin/python3.11``).
_INTERPRETER = re.compile(r"(?<![\w/.])/(?:[\w.\-]+/)*python(?:\d+(?:\.\d+)*)?(?![\w/.\-])")
# The standard library of some Python version (``/usr/lib/python3.10/``).
_STDLIB = re.compile(r"(?<![\w/.])/(?:[\w.\-]+/)*lib/python3\.\d+/")
# Python 3.11+ marks the failing expression with lines of ``^`` and ``~`` that 3.10 does not print.
_CARET_LINE = re.compile(r"^[ \t]*[\^~][\^~ \t]*$")
# Compilers quote with typographic quotes under a UTF-8 locale and with ASCII ones under C.
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'"})


def load_corpus(name: str = "run_code", directory: Path | None = None) -> list[dict[str, Any]]:
    """All cases of ``<directory or fixtures/corpus>/<name>.jsonl``, in file order."""
    path = (directory or CORPUS_DIR) / f"{name}.jsonl"
    cases = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                cases.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
    return cases


def skip_reason(case: Mapping[str, Any]) -> str | None:
    """Why ``case`` cannot run on this machine (a toolchain it needs or must not find), or None."""
    needed = case.get("toolchain")
    if needed and shutil.which(needed) is None:
        return f"{case['name']}: needs {needed!r} on PATH"
    absent = case.get("toolchain_absent")
    if absent and shutil.which(absent) is not None:
        return f"{case['name']}: expects {absent!r} to be missing (rc 127), but it is on PATH"
    return None


def request_parts(request: Mapping[str, Any]) -> tuple[str, str, bytes | None, str | None]:
    """``(method, path, body, content_type)`` of a corpus request; content_type None means no header."""
    method = request.get("method", "POST")
    path = request.get("path", "/run_code")
    if "json" in request:
        body = json.dumps(request["json"], ensure_ascii=False).encode("utf-8")
        return method, path, body, "application/json"
    if "body" in request:
        return method, path, request["body"].encode("utf-8"), request.get("content_type")
    return method, path, None, request.get("content_type")


def normalize_text(text: str | None, *, drop_caret_lines: bool = False) -> str | None:
    """``text`` with temp paths, interpreter paths and locale quotes replaced by placeholders.

    ``/tmp/tmpdw3m0zaa/tmpu138rp_a.py`` -> ``<TMP>/<CODE>.py``; ``/usr/bin/python3: error while
    loading shared libraries: libc.so.6:`` -> ``python: error while loading shared libraries: <LIB>:``;
    other interpreter paths -> ``python``; standard library dirs -> ``<STDLIB>/``. With
    ``drop_caret_lines``, lines made only of ``^``/``~`` and blanks are removed (3.11+ tracebacks).
    """
    if text is None:
        return None
    text = _TMP_FILE.sub("<TMP>/<CODE>", text)
    text = _TMP_DIR.sub("<TMP>", text)
    text = _LOADER_FAILURE.sub("python: error while loading shared libraries: <LIB>:", text)
    text = _STDLIB.sub("<STDLIB>/", text)
    text = _INTERPRETER.sub("python", text)
    text = text.translate(_QUOTES)
    if drop_caret_lines:
        text = "".join(
            line for line in text.splitlines(keepends=True) if not _CARET_LINE.match(line.rstrip("\r\n"))
        )
    return text


def normalize_result(result: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A CommandRunResult reduced to what is compared: no execution_time, texts normalised."""
    if result is None:
        return None
    return {
        "status": result.get("status"),
        "return_code": result.get("return_code"),
        "stdout": normalize_text(result.get("stdout")),
        "stderr": normalize_text(result.get("stderr"), drop_caret_lines=True),
    }


def normalize_answer(
    expect: Mapping[str, Any], http_status: int, content_type: str | None, body: Any
) -> dict[str, Any]:
    """The parts of an answer that ``expect`` names, normalised the way ``expect`` is."""
    answer: dict[str, Any] = {"http_status": http_status}
    if "content_type" in expect:
        answer["content_type"] = content_type
    if not isinstance(body, dict):
        answer["body"] = body
        return answer
    for key in expect:
        if key in ("http_status", "content_type"):
            continue
        if key == "body":
            answer["body"] = body
        elif key in ("compile_result", "run_result"):
            answer[key] = normalize_result(body.get(key))
        elif key == "message":
            answer[key] = normalize_text(body.get(key), drop_caret_lines=True)
        else:
            answer[key] = body.get(key, "<absent>")
    return answer


def normalize_expect(expect: Mapping[str, Any]) -> dict[str, Any]:
    """``expect`` with its texts normalised like an answer's."""
    normalized = dict(expect)
    for key in ("compile_result", "run_result"):
        if key in normalized:
            normalized[key] = normalize_result(normalized[key])
    if "message" in normalized:
        normalized["message"] = normalize_text(normalized["message"], drop_caret_lines=True)
    return normalized


def _detail_view(detail: Any, exact: bool) -> Any:
    if exact or not isinstance(detail, list):
        return detail
    return [
        {"type": item.get("type"), "loc": item.get("loc")} if isinstance(item, dict) else item
        for item in detail
    ]


def compare_answer(
    expect: Mapping[str, Any],
    http_status: int,
    content_type: str | None,
    body: Any,
    *,
    exact_detail: bool = True,
) -> list[str]:
    """Differences between ``expect`` and an answer, one readable line each; empty means it matches.

    Compared: HTTP status; status, message, files (keys in order); compile/run result status,
    return code, stdout and stderr up to temp paths and interpreter versions; 422 items (all of
    them, or with ``exact_detail=False`` only their types and locations); whole bodies.
    """
    want = normalize_expect(expect)
    got = normalize_answer(expect, http_status, content_type, body)
    if "detail" in want:
        want["detail"] = _detail_view(want["detail"], exact_detail)
        got["detail"] = _detail_view(got.get("detail"), exact_detail)
    problems = []
    for key, wanted in want.items():
        actual = got.get(key, "<absent>")
        if key == "files" and isinstance(wanted, dict) and isinstance(actual, dict):
            same = list(wanted.items()) == list(actual.items())
        else:
            same = wanted == actual
        if not same:
            problems.append(f"{key}: expected {wanted!r}, got {actual!r}")
    return problems


def describe_mismatch(case: Mapping[str, Any], problems: Iterable[str], body: Any) -> str:
    """An assertion message naming the case, each difference and the raw answer."""
    lines = [f"case {case['name']!r} ({case.get('source', '?')}) does not match:"]
    lines += [f"  - {problem}" for problem in problems]
    lines.append(f"  raw answer: {json.dumps(body, ensure_ascii=False)}")
    return "\n".join(lines)
