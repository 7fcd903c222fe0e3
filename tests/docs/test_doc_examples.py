"""The documentation's examples are tests: one broken on purpose fails the suite, and the README's
examples are among those run (each appears in a page of the site)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)

PAGE = '''# A page

```python
import requests
answer = requests.post("http://127.0.0.1:8080/run_code", json={"code": "print(1)", "language": "python"})
assert answer.json()["run_result"]["stdout"] == "1\\n"
```

```python
assert answer.json()["run_result"]["stdout"] == "2\\n", "broken on purpose"
```

```bash
curl -s localhost:8080/run_code -H 'Content-Type: application/json' \\
     -d '{"code": "print(1)", "language": "python"}' | grep -q '"stdout":"1\\\\n"'
```

```bash
mocksandbox serve --port 8080 --no-such-option
```

```python
# test_broken.py
import requests

def test_the_third_request_fails(mocksandbox):
    mocksandbox.fail(status=503, first=1)
    ok = requests.post(mocksandbox.run_code_url, json={"code": "print(1)", "language": "python"})
    assert ok.status_code == 200, "broken on purpose: the first request is the one that fails"
```

<!-- skip: next "cannot run here" -->
```bash
exit 1
```

```text
not run
```
'''


def test_a_broken_example_fails_the_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest((ROOT / "docs" / "conftest.py").read_text())
    pytester.makefile(".md", page=PAGE)
    logs = pytester.mkdir("tmp")  # where the blocks' servers log (TMPDIR): emptied, a failed one's too
    monkeypatch.setenv("TMPDIR", str(logs))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "page.md", timeout=600)
    assert [p.name for p in logs.iterdir() if p.name.startswith("docs-serve-")] == []
    outcomes = result.parseoutcomes()
    assert (outcomes.get("passed"), outcomes.get("failed"), outcomes.get("skipped")) == (3, 3, 1), outcomes  # (the skip directive is an example too)
    output = result.stdout.str()
    assert "broken on purpose" in output
    assert "--no-such-option" in output  # a serve line that does not start fails its block
    assert "test_broken.py failed" in output


def _blocks(text: str, languages: tuple[str, ...] = ("python", "bash")) -> list[str]:
    return [body.strip() for language, body in FENCE.findall(text) if language in languages]


def test_the_readme_is_short_and_its_examples_run_in_the_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 160, "the README is the front page: details belong on the site"
    pages = "\n".join(path.read_text() for path in (ROOT / "docs").rglob("*.md"))
    tested = set(_blocks(pages))
    examples = _blocks(readme)
    assert examples, "the README shows no example"
    missing = [block for block in examples if block not in tested]
    assert missing == [], f"README examples that no docs page runs (copy them into one): {missing}"
