"""Generated malformed and extreme requests against a real server on loopback (hypothesis).

Every endpoint that reads a body (SandboxFusion's, swedev's, the ``/_mock/`` ones) and the GET ones
get wrong types, huge and deeply nested values, NaN/Infinity tokens, lone surrogates (as ``\\udXXX``
escapes, or encoded as they are: invalid UTF-8 that Python's json reads all the same), truncated
JSON, invalid bytes, empty bodies, other content types and stray fields. For each request:

* an answer comes, within a client timeout derived from the body's own timeouts (capped by the
  server's ``max_timeout_s``), and the server still answers a new connection afterwards;
* it is valid JSON (UTF-8, no NaN or Infinity tokens), with a JSON content type;
* it is 5xx only where SandboxFusion answers 5xx (:func:`contract_allows_5xx`), and the server
  recorded no unexpected exception (``MockSandbox.take_errors``);
* the journal of what was asked still describes itself as valid JSON.

At the end ``print(6*7)`` still answers ``"42\\n"``.

The short run is part of the default suite: a fixed number of examples per group, derandomized, so
CI sees the same requests every time (about 10 s on two cores). The long run draws many more, at
random, including every language and a few /run_jupyter bodies that start real kernels::

    MOCKSANDBOX_FUZZ_LONG=1 .venv/bin/pytest tests/server/test_generated_input.py -m fuzz_long \\
        -p no:cacheprovider [--hypothesis-seed=N] [--hypothesis-show-statistics]

(``MOCKSANDBOX_FUZZ_EXAMPLES=N`` sets the examples per group, 1000 by default). A failure prints
the smallest request hypothesis found, raw bytes included.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from mocksandbox.models import ALL_LANGUAGES
from mocksandbox.serving.single import ServerThread, running_server
from mocksandbox.settings import Settings

LONG = os.environ.get("MOCKSANDBOX_FUZZ_LONG") == "1"
LONG_EXAMPLES = int(os.environ.get("MOCKSANDBOX_FUZZ_EXAMPLES", "1000"))
#: The server's cap on every run and compile timeout: no generated program runs longer.
MAX_TIMEOUT_S = 3.0
#: What a request may take beyond its own timeouts (a loaded two-core machine, a cold compiler).
SLACK_S = 20.0

SANDBOXFUSION_POSTS = ("/run_code", "/run_jupyter")
DATASET_POSTS = (
    "/list_ids",
    "/get_prompts",
    "/get_prompt_by_id",
    "/submit",
    "/get_metrics",
    "/get_metrics_function",
)
SWEDEV_POSTS = ("/start_instance", "/process_action", "/postprocess", "/compute_reward")
GETS = (
    "/v1/ping",
    "/list_datasets",
    "/_mock/journal",
    "/_mock/stats",
    "/_mock/faults",
    "/_mock/capacity",
    "/_mock/sessions",
    "/_mock/timeline",
)
#: A path no generated request uses: every fault rule the run adds matches only it.
NEVER_PATH = "/__fuzz_never_requested__"


# -- JSON text with the tokens json.dumps will not write ----------------------------------------------


@dataclass(frozen=True)
class Raw:
    """JSON text written as is (integers past Python's 4300-digit conversion limit, bad tokens)."""

    text: bytes

    def __repr__(self) -> str:  # short: hypothesis shows it in every strategy that holds it
        return (
            f"Raw({self.text!r})"
            if len(self.text) <= 40
            else f"Raw({self.text[:8]!r} + ...{len(self.text)} bytes)"
        )


@dataclass(frozen=True)
class Nest:
    """``value`` inside ``depth`` arrays (``[[[...]]]``) or objects (``{"a":{"a":...}}``)."""

    value: Any
    depth: int
    kind: str


def dump(value: Any, raw_utf8: bool) -> bytes:
    """``value`` as JSON text: NaN and infinities as bare tokens; strings ASCII with ``\\udXXX``
    escapes, or (``raw_utf8``) UTF-8 with surrogates encoded as they are (invalid UTF-8)."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Nest):
        opener, closer = (b"[", b"]") if value.kind == "list" else (b'{"a":', b"}")
        return opener * value.depth + dump(value.value, raw_utf8) + closer * value.depth
    if isinstance(value, float) and not math.isfinite(value):
        return b"NaN" if math.isnan(value) else (b"Infinity" if value > 0 else b"-Infinity")
    if isinstance(value, str):
        if raw_utf8:
            return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
        return json.dumps(value).encode("ascii")
    if isinstance(value, list):
        return b"[" + b",".join(dump(item, raw_utf8) for item in value) + b"]"
    if isinstance(value, dict):
        pairs = (dump(str(k), raw_utf8) + b":" + dump(v, raw_utf8) for k, v in value.items())
        return b"{" + b",".join(pairs) + b"}"
    return json.dumps(value).encode("ascii")  # None, bools, ints, finite floats


# -- values -----------------------------------------------------------------------------------------

SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
TEXT = st.one_of(
    st.text(max_size=12),
    st.text(st.one_of(st.characters(), SURROGATES), min_size=1, max_size=6),
    st.sampled_from(["", "NaN", "Infinity", "-Infinity", "1e999", "\x00", "python", "12", "é", "\U0001f600"]),
)
HUGE_TEXT = st.sampled_from([10_000, 300_000, 2_000_000] if LONG else [10_000, 300_000]).map(
    lambda n: "x" * n
)
FLOATS = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e308, -1e308, 5e-324, 1.5]),
    st.floats(allow_nan=True, allow_infinity=True),
)
INTS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63) - 1, 2**64, 10**30]),
    st.just(Raw(b"9" * 4400)),  # past int_max_str_digits: the parser refuses it
)
LEAVES = st.one_of(st.none(), st.booleans(), INTS, FLOATS, TEXT)
JSON_VALUES = st.recursive(
    LEAVES,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(TEXT, children, max_size=4)),
    max_leaves=8,
)
DEEP = st.builds(
    Nest,
    JSON_VALUES,
    st.sampled_from([50, 500, 900, 960, 965, 970, 975, 980, 985, 990, 1000, 2000, 20_000]),
    st.sampled_from(["list", "dict"]),
)
GARBAGE = st.one_of(JSON_VALUES, JSON_VALUES, DEEP, HUGE_TEXT)


def timeouts() -> st.SearchStrategy[Any]:
    values = [
        0.5,
        1,
        0.2,
        "1",
        0,
        -1,
        math.nan,
        math.inf,
        -math.inf,
        "NaN",
        "Infinity",
        1e308,
        -1e308,
        "-inf",
    ]
    return st.sampled_from(values)


SAFE_NAMES = st.one_of(
    st.from_regex(r"[a-z]{1,6}(/[a-z]{1,6})?(\.[a-z]{1,3})?", fullmatch=True),
    st.sampled_from(["", ".", "dir/", "a\x00b", "IGNORE_THIS_FILE.txt", "é.txt", "\ud83d.txt"]),
)
B64 = st.one_of(
    st.binary(max_size=32).map(lambda b: base64.b64encode(b).decode()),
    st.sampled_from(["", "!!!", "aGk", None]),
)


@dataclass(frozen=True)
class Field:
    """A field of a body: its plausible values; a body holds each one, garbage, or nothing."""

    name: str
    good: st.SearchStrategy[Any]


@st.composite
def object_body(draw: st.DrawFn, fields: list[Field]) -> dict[str, Any]:
    """An object of plausible field values (some left out), with up to two of them replaced by
    garbage, and stray fields. Shrinking heads for the plausible body with one thing wrong."""
    body: dict[str, Any] = {}
    for field in fields:
        if draw(st.sampled_from(["good"] * 5 + ["omit"])) == "good":
            body[field.name] = draw(field.good)
    for name in draw(st.lists(st.sampled_from([f.name for f in fields]), max_size=2, unique=True)):
        body[name] = draw(GARBAGE)
    for key, value in draw(st.dictionaries(TEXT, GARBAGE, max_size=2)).items():  # stray fields
        body.setdefault(key, value)
    return body


# -- bodies per endpoint ----------------------------------------------------------------------------

#: Programs that end at once whatever they are run with. Generated text is Python code only: as
#: a shell script or a C file, random text is not worth the risk or the compile time.
SNIPPETS = ["print(6*7)", "", "1/0", "import sys; sys.exit(3)", "print(input())", "x", "echo hi", "exit 3"]
PYTHON_LIKE = {"python", "pytest"}


@st.composite
def run_code_body(draw: st.DrawFn) -> dict[str, Any]:
    languages = list(ALL_LANGUAGES) if LONG else ["python", "bash", "sql", "klingon"]
    body = draw(
        object_body(
            [
                Field("compile_timeout", timeouts()),
                Field("run_timeout", timeouts()),
                Field(
                    "memory_limit_MB",
                    st.sampled_from([-1, 0, 1, 5, 128, 1024, 2**63, 10**20, "64", -(2**63)]),
                ),
                Field("code", st.one_of(st.sampled_from(SNIPPETS), TEXT)),
                Field("stdin", st.one_of(st.none(), TEXT, HUGE_TEXT)),
                Field("language", st.sampled_from(languages)),
                Field("files", st.dictionaries(SAFE_NAMES, B64, max_size=3)),
                Field("fetch_files", st.lists(SAFE_NAMES, max_size=3)),
            ]
        )
    )
    code, language = body.get("code"), body.get("language")
    python_like = isinstance(language, str) and language in PYTHON_LIKE
    if not python_like and isinstance(code, str) and code not in SNIPPETS:
        body["code"] = "x"
    return body


@st.composite
def run_jupyter_body(draw: st.DrawFn) -> dict[str, Any]:
    body = draw(
        object_body(
            [
                Field("cells", st.lists(st.sampled_from(["print(6*7)", "1/0", "x = 1", ""]), max_size=2)),
                Field("cell_timeout", timeouts()),
                Field("total_timeout", timeouts()),
                Field("memory_limit_MB", st.sampled_from([-1, 1024, 1.5])),
                Field("kernel", st.sampled_from(["python3", "ir"])),
                Field("files", st.dictionaries(SAFE_NAMES, B64, max_size=2)),
                Field("fetch_files", st.lists(SAFE_NAMES, max_size=2)),
            ]
        )
    )
    cells = body.get("cells")
    starts_a_kernel = isinstance(cells, list) and all(isinstance(c, str) for c in cells)
    if starts_a_kernel and not (LONG and draw(st.integers(0, 9)) == 0):
        # A kernel costs seconds: in the short run (and most of the long one), a total_timeout that
        # answers before any kernel starts, as NaN (driver error) and <= -10 (no time left) do.
        body["total_timeout"] = draw(st.sampled_from([math.nan, "NaN", -math.inf, -11, -1e308]))
    return body


CONFIGS = st.one_of(
    st.just({}),
    object_body(
        [
            Field("dataset_type", st.sampled_from(["NoSuchClass", "MBPPDataset", ""])),
            Field("language", st.sampled_from(["python", "cpp", "nope"])),
            Field("locale", st.sampled_from(["en", "zh"])),
            Field("is_fewshot", st.booleans()),
            Field("compile_timeout", timeouts()),
            Field("run_timeout", timeouts()),
            Field("custom_extract_logic", st.sampled_from(["", "submit_code_blocks([])", "1/0", "x ="])),
            Field("provided_data", st.one_of(st.just([]), st.dictionaries(TEXT, JSON_VALUES, max_size=3))),
            Field("extra", st.dictionaries(TEXT, JSON_VALUES, max_size=3)),
        ]
    ),
)
DATASET = Field("dataset", st.sampled_from(["mbpp", "nope", "humaneval_python", ""]))
CONFIG = Field("config", CONFIGS)
PROMPT_ID = Field("id", st.one_of(st.sampled_from([11, 12, "12", 99999, -1]), INTS))
COMPLETIONS = [
    "```python\ndef sort_matrix(M):\n    return sorted(M, key=sum)\n```",
    "x",
    "",
    "```python\n1/0\n```",
]
DATASET_BODIES = {
    "/list_ids": [DATASET, CONFIG, Field("offset", INTS), Field("limit", INTS)],
    "/get_prompts": [DATASET, CONFIG, Field("offset", INTS), Field("limit", INTS)],
    "/get_prompt_by_id": [DATASET, CONFIG, PROMPT_ID],
    "/submit": [
        DATASET,
        PROMPT_ID,
        Field("completion", st.one_of(st.sampled_from(COMPLETIONS), TEXT)),
        CONFIG,
    ],
    "/get_metrics": [DATASET, CONFIG, Field("results", st.lists(JSON_VALUES, max_size=2))],
    "/get_metrics_function": [DATASET, CONFIG],
}
SIDS = st.one_of(INTS, TEXT)
SWEDEV_BODIES = {
    "/start_instance": [Field("instance_hash", SIDS)],
    "/process_action": [Field("sid", SIDS), Field("content", TEXT)],
    "/postprocess": [Field("sid", SIDS)],
    "/compute_reward": [Field("sid", SIDS)],
}
FAULT_ACTIONS = object_body(
    [
        Field("type", st.sampled_from(["delay", "status", "sandbox_error", "truncate", "slow_body", "nope"])),
        Field("seconds", FLOATS),
        Field("status", st.one_of(INTS, st.sampled_from([500, 503, 99]))),
        Field("retry_after", FLOATS),
        Field("fraction", FLOATS),
        Field("body", JSON_VALUES),
        Field("headers", st.dictionaries(TEXT, TEXT, max_size=2)),
    ]
)


@st.composite
def fault_body(draw: st.DrawFn) -> Any:
    """A rule, or a list of them, that can match only :data:`NEVER_PATH` if it is valid at all."""

    def one() -> Any:
        rule = draw(
            object_body(
                [
                    Field("action", FAULT_ACTIONS),
                    Field(
                        "schedule",
                        st.dictionaries(st.sampled_from(["first", "every", "window"]), JSON_VALUES),
                    ),
                    Field("name", TEXT),
                ]
            )
        )
        rule["match"] = draw(st.one_of(st.just({"path": NEVER_PATH}), LEAVES.filter(lambda v: v is not None)))
        return rule

    return draw(st.one_of(st.builds(one), st.lists(st.builds(one), max_size=3), GARBAGE))


CAPACITY = [
    Field("max_in_flight", st.sampled_from([1, 0, -1, 2**63, 64, None, "2"])),
    Field("overload", st.sampled_from(["reject", "queue", "x"])),
    Field("queue_timeout_s", FLOATS),
    Field("retry_after_s", FLOATS),
]

CONTENT_TYPES = [
    None,  # no header: FastAPI parses JSON
    "application/json",
    "application/json; charset=utf-8",
    "application/vnd.api+json",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "garbage",
    "",
]


class GeneratedRequest:
    """One request as sent; its repr (in failure reports) shows the raw bytes."""

    def __init__(
        self, method: str, path: str, content_type: str | None, raw: bytes, body: Any = None
    ) -> None:
        self.method = method
        self.path = path
        self.content_type = content_type
        self.raw = raw
        #: The body before it was written as text (its timeouts decide the client's timeout).
        self.body = body

    def __repr__(self) -> str:
        raw = self.raw if len(self.raw) <= 4000 else self.raw[:4000] + b"...(%d bytes)" % len(self.raw)
        return f"GeneratedRequest({self.method} {self.path}, content_type={self.content_type!r}, raw={raw!r})"


@st.composite
def body_bytes(draw: st.DrawFn, body: Any) -> bytes:
    """``body`` as text, or mangled: truncated, invalid bytes, nothing at all."""
    raw = dump(body, raw_utf8=draw(st.booleans()))
    mangle = draw(st.sampled_from(["none"] * 5 + ["truncate", "bad_byte", "replace"]))
    if mangle == "truncate":
        return raw[: draw(st.integers(0, max(len(raw) - 1, 0)))]
    if mangle == "bad_byte":
        at = draw(st.integers(0, len(raw)))
        return raw[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\xed\xa0\x80"])) + raw[at:]
    if mangle == "replace":
        return draw(
            st.one_of(
                st.sampled_from([b"", b" ", b"\x00", b"null", b"\xff\xfe", b"{", b"[1,2]"]),
                st.binary(max_size=40),
            )
        )
    return raw


GROUPS = ["run_code", "run_jupyter", "datasets", "swedev", "control"]


@st.composite
def generated_request(draw: st.DrawFn, group: str) -> GeneratedRequest:
    method = "POST"
    if group == "run_code":
        path, body = "/run_code", draw(st.one_of(run_code_body(), run_code_body(), run_code_body(), GARBAGE))
    elif group == "run_jupyter":
        path, body = "/run_jupyter", draw(st.one_of(run_jupyter_body(), run_jupyter_body(), GARBAGE))
    elif group == "datasets":
        path = draw(st.sampled_from(sorted(DATASET_BODIES)))
        body = draw(st.one_of(object_body(DATASET_BODIES[path]), GARBAGE))
    elif group == "swedev":
        path = draw(st.sampled_from(sorted(SWEDEV_BODIES)))
        body = draw(st.one_of(object_body(SWEDEV_BODIES[path]), GARBAGE))
    else:
        method, path = draw(
            st.sampled_from(
                [
                    ("POST", "/_mock/faults"),
                    ("PUT", "/_mock/capacity"),
                    ("DELETE", "/_mock/faults"),
                    ("POST", "/_mock/reset"),
                ]
                + [("GET", p) for p in GETS]
            )
        )
        if path == "/_mock/faults" and method == "POST":
            body = draw(fault_body())
        elif path == "/_mock/capacity":
            body = draw(st.one_of(object_body(CAPACITY), GARBAGE))
        else:
            body = draw(GARBAGE)
    # Garbage may be a bare `NaN` or a string, which the server must refuse too.
    raw = draw(body_bytes(body))
    content_type = draw(st.sampled_from(CONTENT_TYPES[:3] * 5 + CONTENT_TYPES))
    return GeneratedRequest(method, path, content_type, raw, body)


# -- the oracle ---------------------------------------------------------------------------------------

SANDBOXFUSION_PATHS = {*SANDBOXFUSION_POSTS, *DATASET_POSTS, "/v1/ping", "/list_datasets"}
#: A surrogate as a JSON escape, or encoded as UTF-8 would encode it (invalid UTF-8, which Python's
#: json.loads, and so FastAPI's, decodes with "surrogatepass" all the same).
SURROGATE_IN_BODY = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\xed[\xa0-\xbf][\x80-\xbf]")
SURROGATE_500 = re.compile(
    r"'utf-8' codec can't encode character '\\ud[89a-f][0-9a-f]{2}' in position \d+: surrogates not allowed"
)


def nesting_depth(raw: bytes) -> int:
    """How deep ``[`` and ``{`` nest in ``raw`` (outside strings; close enough for truncated text)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def contract_allows_5xx(request: GeneratedRequest, status: int, answer: Any) -> bool:
    """Whether SandboxFusion answers ``status`` (5xx) with ``answer`` to this request (contract §0, §0.1, §4).

    Its global handler's 500 (``{"detail", "traceback"}``), on its own endpoints only, when a body
    of a non-JSON content type is not UTF-8 (measured), or when the answer cannot be encoded: NaN or an infinity echoed by a 422 (the body holds such a token), a
    lone surrogate (the body holds one, escaped or encoded), or data nested past the encoder's recursion
    limit (a body nested nearly as deep as the parser allows). The dataset endpoints also answer
    400/500 ``{"detail": ...}`` of their own (unknown ids, datasets without data: §4).
    """
    if status != 500 or request.path not in SANDBOXFUSION_PATHS or not isinstance(answer, dict):
        return False
    detail = answer.get("detail")
    if not isinstance(detail, str):
        return False
    if request.path in DATASET_POSTS:
        return True  # the core's DatasetHTTPError; a bug would also be in take_errors()
    if set(answer) != {"detail", "traceback"}:
        return False
    if detail == "Out of range float values are not JSON compliant":
        return b"NaN" in request.raw or b"Infinity" in request.raw
    if SURROGATE_500.fullmatch(detail):
        return SURROGATE_IN_BODY.search(request.raw) is not None
    if detail.startswith("maximum recursion depth exceeded"):
        return nesting_depth(request.raw) >= 900
    if detail.startswith("'utf-8' codec can't decode byte"):
        # A non-UTF-8 body of a non-JSON content type: FastAPI's decoding fails in its handler.
        return not _is_utf8(request.raw) and not _is_json_content_type(request.content_type)
    return False


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _is_json_content_type(content_type: str | None) -> bool:
    if not content_type:
        return True
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def _seconds(value: Any, default: float) -> float:
    """What the server gives a timeout field: NaN nothing, infinity the cap, garbage the default."""
    try:
        seconds = float(value) if value is not None and not isinstance(value, bool) else default
    except (TypeError, ValueError, OverflowError):
        seconds = default
    if math.isnan(seconds):
        return 0.0
    return min(max(seconds, 0.0), MAX_TIMEOUT_S)


def client_timeout(request: GeneratedRequest) -> float:
    """How long the request may take: its own timeouts (capped by the server) plus slack."""
    body = request.body if isinstance(request.body, dict) else {}
    if request.path == "/run_code":
        return SLACK_S + _seconds(body.get("run_timeout"), 10) + _seconds(body.get("compile_timeout"), 10)
    if request.path == "/run_jupyter":
        return SLACK_S + _seconds(body.get("total_timeout"), 45) + 60  # + a kernel's start-up
    if request.path == "/submit":
        return SLACK_S + 10 * MAX_TIMEOUT_S  # a few test cases, each within the cap
    return SLACK_S


# -- the server and the test --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    runs = tmp_path_factory.mktemp("fuzz") / "runs"
    runs.mkdir()
    with running_server(Settings(pod_name=None, tmp_root=str(runs), max_timeout_s=MAX_TIMEOUT_S)) as srv:
        yield srv


def send(srv: ServerThread, request: GeneratedRequest, timeout: float) -> tuple[int, str | None, bytes]:
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        headers = {} if request.content_type is None else {"Content-Type": request.content_type}
        conn.request(request.method, request.path, body=request.raw, headers=headers)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type"), response.read()
    finally:
        conn.close()


def strict_json(raw: bytes) -> Any:
    def reject(token: str) -> Any:
        raise ValueError(f"{token} is not JSON")

    return json.loads(raw.decode("utf-8"), parse_constant=reject)


#: The limit the server lives with outside hypothesis (1000 unless something changed it).
REAL_RECURSION_LIMIT = sys.getrecursionlimit()


@contextmanager
def real_recursion_limit() -> Iterator[None]:
    """Hypothesis raises the recursion limit while it runs a test, and the limit is process-wide:
    the server thread would parse bodies nested deeper than it can anywhere else. Each request is
    sent under the real limit."""
    raised = sys.getrecursionlimit()
    sys.setrecursionlimit(REAL_RECURSION_LIMIT)
    try:
        yield
    finally:
        sys.setrecursionlimit(raised)


def check_one(srv: ServerThread, request: GeneratedRequest) -> None:
    box = srv.sandbox
    note(repr(request))
    timeout = client_timeout(request)
    started = time.monotonic()
    try:
        with real_recursion_limit():
            status, content_type, raw = send(srv, request, timeout)
    except TimeoutError:
        pytest.fail(f"no answer within {timeout:.0f} s to {request!r}")
    elapsed = time.monotonic() - started
    note(f"answer after {elapsed:.2f} s: {status} {content_type} {raw[:2000]!r}")
    event(f"{request.path} -> {status}")  # --hypothesis-show-statistics
    assert elapsed < timeout, f"{elapsed:.1f} s, more than the request's {timeout:.0f} s"
    errors = box.take_errors()
    assert not errors, f"the server raised: {errors[0].traceback}"
    try:
        answer = strict_json(raw)
    except ValueError as exc:
        raise AssertionError(f"not valid JSON ({exc}): {raw[:2000]!r}") from None
    assert content_type == "application/json", content_type
    if status >= 500:
        assert contract_allows_5xx(request, status, answer), f"{status} where SandboxFusion answers no 5xx"
    # The server still answers a new connection, and its journal of this request is valid JSON.
    with real_recursion_limit():
        ping = send(srv, GeneratedRequest("GET", "/v1/ping", None, b""), SLACK_S)
        status, _, raw = send(srv, GeneratedRequest("GET", "/_mock/journal?limit=2", None, b""), SLACK_S)
    assert ping == (200, "application/json", b'"pong"')
    assert status == 200
    strict_json(raw)
    if request.path.startswith("/_mock/"):
        box.reset()  # no fault rule or capacity change outlives its example


def still_answers_42(srv: ServerThread) -> None:
    program = GeneratedRequest(
        "POST", "/run_code", "application/json", b'{"code":"print(6*7)","language":"python","run_timeout":10}'
    )
    status, _, raw = send(srv, program, SLACK_S + 10)
    answer = strict_json(raw)
    assert (status, answer["status"], answer["run_result"]["stdout"]) == (200, "Success", "42\n"), answer
    assert srv.sandbox.take_errors() == []


#: Examples per group in the short run (all groups together take about 10 s on two cores).
SHORT_EXAMPLES = {"run_code": 300, "run_jupyter": 60, "datasets": 150, "swedev": 80, "control": 100}
COMMON = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
}


@pytest.mark.parametrize("group", GROUPS)
def test_generated_input_short(fuzz_server: ServerThread, group: str) -> None:
    @settings(max_examples=SHORT_EXAMPLES[group], derandomize=True, **COMMON)  # type: ignore[arg-type]
    @given(generated_request(group))
    def check(request: GeneratedRequest) -> None:
        check_one(fuzz_server, request)

    check()
    still_answers_42(fuzz_server)


@pytest.mark.fuzz_long
@pytest.mark.timeout(0)
@pytest.mark.skipif(
    not LONG, reason="the long generated-input run: set MOCKSANDBOX_FUZZ_LONG=1 (see the module docstring)"
)
@pytest.mark.parametrize("group", GROUPS)
def test_generated_input_long(fuzz_server: ServerThread, group: str) -> None:
    @settings(max_examples=LONG_EXAMPLES, **COMMON)  # type: ignore[arg-type]
    @given(generated_request(group))
    def check(request: GeneratedRequest) -> None:
        check_one(fuzz_server, request)

    check()
    still_answers_42(fuzz_server)


def test_oracle_examples() -> None:
    """The oracle allows exactly the contract's 500s."""
    nan_500 = {"detail": "Out of range float values are not JSON compliant", "traceback": ["x"]}
    nan_body = GeneratedRequest("POST", "/run_code", None, b'{"code":NaN}')
    assert contract_allows_5xx(nan_body, 500, nan_500)
    assert not contract_allows_5xx(GeneratedRequest("POST", "/run_code", None, b'{"code":1}'), 500, nan_500)
    assert not contract_allows_5xx(
        GeneratedRequest("POST", "/start_instance", None, b'{"a":NaN}'), 500, nan_500
    )
    assert not contract_allows_5xx(nan_body, 502, nan_500)
    surrogate = {
        "detail": "'utf-8' codec can't encode character '\\ud83d' in position 70: surrogates not allowed"
    }
    surrogate["traceback"] = []  # type: ignore[assignment]
    assert contract_allows_5xx(
        GeneratedRequest("POST", "/run_code", None, b'{"code":"\\ud83d"}'), 500, surrogate
    )
    assert not contract_allows_5xx(
        GeneratedRequest("POST", "/run_code", None, b'{"code":"x"}'), 500, surrogate
    )
    assert not contract_allows_5xx(nan_body, 500, {"detail": "Internal Server Error"})
    assert nesting_depth(b'[["[[[", {"a": [1]}]]') == 4
    assert _seconds(math.nan, 10) == 0 and _seconds(math.inf, 10) == MAX_TIMEOUT_S and _seconds("x", 10) == 3
    assert (
        dump({"a": [math.nan, -math.inf, "\ud800", Raw(b"1")]}, raw_utf8=False)
        == b'{"a":[NaN,-Infinity,"\\ud800",1]}'
    )


def test_fuzz_long_marker_is_registered(pytestconfig: pytest.Config) -> None:
    assert any(line.startswith("fuzz_long") for line in pytestconfig.getini("markers"))
