"""Differential mode: the same requests to two deployments, and a table of what differs.

Answers are normalised before comparing: execution times dropped, temp paths, interpreter paths
and pod names replaced by placeholders (see :mod:`mocksandbox.contract.corpus`).
"""

from __future__ import annotations

import base64
import json
import random
import string
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import requests

from mocksandbox.contract.corpus import load_corpus, normalize_result, normalize_text, request_parts


@dataclass(frozen=True)
class Case:
    """One request sent to both targets."""

    name: str
    method: str
    path: str
    body: bytes | None
    content_type: str | None


@dataclass(frozen=True)
class Difference:
    case: str
    field: str
    ours: Any
    reference: Any


def corpus_cases(names: Iterable[str] = ("run_code",)) -> list[Case]:
    """The shipped corpus as cases (expectations are not used here: the reference is)."""
    cases = []
    for corpus in names:
        for entry in load_corpus(corpus):
            method, path, body, content_type = request_parts(entry["request"])
            cases.append(Case(entry["name"], method, path, body, content_type))
    return cases


def generated_cases(count: int, seed: int = 0) -> list[Case]:
    """Programs with known shapes, varied by a seeded generator: text, exit codes, stdin, files."""
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + " \t\n" + "éß✓日本🙂"
    cases = []
    for number in range(count):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        kind = number % 4
        if kind == 0:
            request: dict[str, Any] = {"code": f"print({text!r})", "language": "python"}
        elif kind == 1:
            request = {"code": f"import sys\nsys.exit({rng.randint(0, 255)})", "language": "python"}
        elif kind == 2:
            request = {
                "code": "import sys\nprint(sys.stdin.read()[::-1])",
                "language": "python",
                "stdin": text,
            }
        else:
            data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
            request = {
                "code": "print(len(open('in.bin', 'rb').read()))",
                "language": "python",
                "files": {"in.bin": base64.b64encode(data).decode()},
                "fetch_files": ["in.bin"],
            }
        body = json.dumps(request).encode()
        cases.append(Case(f"generated-{number}", "POST", "/run_code", body, "application/json"))
    return cases


def normalize(status: int, body: Any) -> dict[str, Any]:
    """What is compared of one answer."""
    view: dict[str, Any] = {"http_status": status}
    if isinstance(body, dict) and "run_result" in body:
        view["status"] = body.get("status")
        view["message"] = normalize_text(body.get("message"), drop_caret_lines=True)
        view["compile_result"] = normalize_result(body.get("compile_result"))
        view["run_result"] = normalize_result(body.get("run_result"))
        view["files"] = body.get("files")
    elif isinstance(body, dict) and "detail" in body and isinstance(body["detail"], list):
        view["detail"] = [(i.get("type"), i.get("loc")) for i in body["detail"] if isinstance(i, dict)]
    else:
        view["body"] = body
    return view


def _send(session: requests.Session, base: str, case: Case, timeout: float) -> dict[str, Any]:
    headers = {"Content-Type": case.content_type} if case.content_type else {}
    try:
        reply = session.request(
            case.method, base + case.path, data=case.body, headers=headers, timeout=timeout
        )
    except requests.RequestException as exc:
        return {"http_status": None, "error": type(exc).__name__}
    try:
        body: Any = reply.json()
    except ValueError:
        body = reply.text
    return normalize(reply.status_code, body)


def compare(
    ours_url: str,
    reference_url: str,
    cases: list[Case],
    timeout: float = 120.0,
    workers: int = 4,
    progress: Callable[[int, int], None] | None = None,
) -> list[Difference]:
    """Send every case to both targets (in parallel) and list the normalised differences."""

    def both(case: Case) -> list[Difference]:
        with requests.Session() as session:
            ours = _send(session, ours_url.rstrip("/"), case, timeout)
            theirs = _send(session, reference_url.rstrip("/"), case, timeout)
        return [
            Difference(case.name, key, ours.get(key, "<absent>"), theirs.get(key, "<absent>"))
            for key in sorted(set(ours) | set(theirs))
            if ours.get(key, "<absent>") != theirs.get(key, "<absent>")
        ]

    differences: list[Difference] = []
    with ThreadPoolExecutor(workers) as pool:
        for done, found in enumerate(pool.map(both, cases), start=1):
            differences.extend(found)
            if progress is not None:
                progress(done, len(cases))
    return differences


def _short(value: Any, width: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def format_table(differences: list[Difference], total: int) -> Iterator[str]:
    """The differences as a table, then a one-line verdict."""
    if differences:
        yield f"{'case':<34} {'field':<16} {'ours':<62} reference"
        for diff in differences:
            yield f"{diff.case:<34} {diff.field:<16} {_short(diff.ours):<62} {_short(diff.reference)}"
    cases_differing = len({d.case for d in differences})
    yield f"{total - cases_differing}/{total} cases identical; {cases_differing} differ"
