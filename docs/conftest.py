"""Every example in the documentation runs, against a live mock (Sybil collects ``docs/**/*.md``).

How a fenced block is run, by its language:

- ``python``: executed in order with the page's other Python blocks, in one namespace per page.
  A block whose first line is ``# test_NAME.py`` or ``# conftest.py`` is a file of a test suite
  instead: it is written to the page's own directory and, for a test file, run there with
  ``python -m pytest`` (the mocksandbox plugin loaded, as a user's suite has it); it must pass.
- ``bash``: run by ``bash -euo pipefail`` in the page's own directory, with this interpreter's
  ``bin`` first on ``PATH``. A line that starts a server (``mocksandbox serve ...``) starts it in
  the background on a free port, waits until it answers, and leaves it running for the rest of the
  block (stopped when the block ends, and it must stop cleanly).
- anything else (``text``, ``json``, ``yaml``, ``toml``, ``console``): shown, not run.

In both languages ``127.0.0.1:8080`` and ``localhost:8080``, the address the docs use, are the
live mock's (the session's in-process server, reset before each page; in a ``bash`` block after a
``mocksandbox serve`` line, that server's). A block that cannot run here says why, before it:
``<!-- skip: next "needs a Ray cluster" -->``. A slow one (a local Ray instance, tens of seconds)
runs in CI (``CI`` set) or with ``MOCKSANDBOX_DOCS_SLOW=1``, and is skipped in a local ``make test``:
``<!-- skip: next if(not SLOW_EXAMPLES, reason="...") -->``.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, SkipParser

#: The address the documentation's examples use; rewritten to the live mock's.
DOCS_ADDRESS = re.compile(r"(?:127\.0\.0\.1|localhost):8080\b")
#: A test-suite file block: its first line names the file.
SUITE_FILE = re.compile(r"^#\s*((?:test_\w+|conftest)\.py)\s*$")
#: A line that starts a long-running server.
SERVER_LINE = re.compile(r"^(\s*)mocksandbox\s+serve\b(.*)$")
#: Seconds one block may run (a pytest file included).
BLOCK_TIMEOUT_S = 240

BIN = str(Path(sys.executable).parent)

# Defined for every bash block: `mocksandbox serve ...` lines call docs_serve instead.
BASH_PRELUDE = textwrap.dedent(
    r"""
    __docs_servers=()
    __docs_logs=()
    __docs_free_port='import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
    __docs_stop() {
      local i pid status failed=0
      for i in "${!__docs_servers[@]}"; do
        pid=${__docs_servers[$i]} status=0
        # SIGTERM, as a service manager stops it (a background job of a script ignores SIGINT).
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" || status=$?
        if [ "$status" -ne 0 ] && [ "$status" -ne 143 ]; then
          echo "docs: the server (pid $pid) stopped with status $status" >&2
          cat "${__docs_logs[$i]}" >&2 || true
          failed=1
        fi
        rm -f "${__docs_logs[$i]}"  # (every server's log, a failed one's too: nothing left in /tmp)
      done
      [ "$failed" = 0 ] || exit 1
    }
    trap __docs_stop EXIT
    docs_serve() {
      # The example's own --port (and its value) goes: a free port is used instead.
      local args=() skip=0 a log pid
      for a in "$@"; do
        if [ "$skip" = 1 ]; then skip=0; continue; fi
        case "$a" in --port) skip=1; continue;; --port=*) continue;; esac
        args+=("$a")
      done
      DOCS_PORT=$(python -c "$__docs_free_port")
      log=$(mktemp "${TMPDIR:-/tmp}/docs-serve-XXXXXX")
      mocksandbox serve "${args[@]}" --port "$DOCS_PORT" > "$log" 2>&1 &
      pid=$!
      __docs_servers+=("$pid")
      __docs_logs+=("$log")
      for _ in $(seq 600); do
        # Up: it answers, and its banner is out (a fleet answers before it is done starting).
        if curl -sf -o /dev/null --max-time 1 "http://127.0.0.1:$DOCS_PORT/v1/ping" \
            && grep -q "serving on" "$log"; then
          return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
          echo "docs: 'mocksandbox serve $*' exited before it answered:" >&2
          cat "$log" >&2
          exit 1
        fi
        sleep 0.1
      done
      echo "docs: 'mocksandbox serve $*' did not answer within 60 s:" >&2
      cat "$log" >&2
      exit 1
    }
    """
)


def _run_group(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``command`` in a process group of its own, so that a block that runs past
    ``BLOCK_TIMEOUT_S`` goes with everything it started (servers in the background included)."""
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                stdout, stderr = process.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        raise AssertionError(f"{' '.join(command[:3])}: still running after {BLOCK_TIMEOUT_S} s") from None
    try:  # whatever the block left running in the background goes too
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _page_dir(example: Example) -> Path:
    """The page's own directory; made, and the mock reset, at the page's first example (so each
    page starts from a clean mock: its journal, faults and cap)."""
    namespace = example.namespace
    if "_docs_page_dir" not in namespace:
        namespace["mocksandbox_core"].reset()
        factory: pytest.TempPathFactory = namespace["tmp_path_factory"]
        namespace["_docs_page_dir"] = str(factory.mktemp("docs-page"))
    return Path(namespace["_docs_page_dir"])


def _live_address(example: Example) -> str:
    return str(example.namespace["mocksandbox_url"]).removeprefix("http://")


def evaluate_python(example: Example) -> None:
    """A ``python`` block: the page's namespace, or a test-suite file (see the module's text)."""
    page = _page_dir(example)
    source = DOCS_ADDRESS.sub(_live_address(example), str(example.parsed))
    first = source.lstrip().splitlines()[0] if source.strip() else ""
    named = SUITE_FILE.match(first)
    if named is None:
        # Padded so that a traceback's line numbers are the page's.
        padded = "\n" * example.line + source
        exec(compile(padded, example.path, "exec"), example.namespace)
        return
    target = page / named.group(1)
    target.write_text(source)
    if named.group(1) == "conftest.py":
        return
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    result = _run_group(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-x",
         named.group(1)],
        page,
        env,
    )  # fmt: skip
    if result.returncode != 0:
        raise AssertionError(
            f"{example.path}:{example.line}: the test file {named.group(1)} failed "
            f"(pytest exit {result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-2000:]}"
        )


def bash_script(source: str, live_address: str) -> str:
    """The script a ``bash`` block runs: servers it starts are managed, the docs' address is live."""
    lines = []
    for line in source.splitlines():
        started = SERVER_LINE.match(line)
        if started is not None and not line.rstrip().endswith("&"):
            line = f"{started.group(1)}docs_serve{started.group(2)}"
        lines.append(line)
    body = "\n".join(lines)
    # Before a managed server starts, the docs' address is the session's mock; after, that server's.
    body = DOCS_ADDRESS.sub("127.0.0.1:${DOCS_PORT}", body)
    port = live_address.rsplit(":", 1)[1]
    return f"DOCS_PORT={shlex.quote(port)}\n{BASH_PRELUDE}\n{body}\n"


def evaluate_bash(example: Example) -> None:
    """A ``bash`` block, run in the page's directory (see the module's text)."""
    script = bash_script(str(example.parsed), _live_address(example))
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "PYTHONDONTWRITEBYTECODE": "1"}
    result = _run_group(["bash", "-euo", "pipefail", "-c", script], _page_dir(example), env)
    if result.returncode != 0:
        raise AssertionError(
            f"{example.path}:{example.line}: the bash example failed (exit {result.returncode}):\n"
            f"{str(example.parsed).strip()}\n--- stdout\n{result.stdout[-4000:]}\n--- stderr\n"
            f"{result.stderr[-4000:]}"
        )


def _setup(namespace: dict[str, object]) -> None:
    namespace["SLOW_EXAMPLES"] = bool(os.environ.get("CI")) or os.environ.get("MOCKSANDBOX_DOCS_SLOW") == "1"


pytest_collect_file = Sybil(
    parsers=[
        CodeBlockParser(language="python", evaluator=evaluate_python),
        CodeBlockParser(language="bash", evaluator=evaluate_bash),
        SkipParser(),
    ],
    patterns=["*.md"],
    fixtures=["mocksandbox_url", "mocksandbox_core", "tmp_path_factory"],
    setup=_setup,
).pytest()


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A page's examples share a namespace and a directory: with xdist they stay on one worker, in
    # order (make test runs --dist loadgroup).
    for item in items:
        path = getattr(item, "path", None)
        if path is not None and path.suffix == ".md":
            item.add_marker(pytest.mark.xdist_group(f"docs:{path.name}"))
