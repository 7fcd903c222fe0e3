"""SandboxFusion's own dataset tests, sent over HTTP to ``mocksandbox serve`` (opt-in).

Needs what this project does not ship, given through the environment:

* ``MOCKSANDBOX_SF_TREE``: a SandboxFusion checkout (its ``sandbox/tests/datasets`` and their
  ``samples``, its ``assets``);
* ``MOCKSANDBOX_SF_PYTHON``: an interpreter with SandboxFusion's dependencies plus pytest 7,
  pytest-asyncio 0.23 and httpx 0.26;
* ``MOCKSANDBOX_SF_PLUGIN_DIR``: the folder of ``sf_remote_client.py``, the pytest plugin that swaps
  the tests' in-process ``TestClient(app)`` for an HTTP client on ``SF_TARGET_URL``;
* optionally ``MOCKSANDBOX_SF_BASELINE``: the JUnit XML of the same tests run against SandboxFusion
  itself; every test that passed there must pass here. Without it the run must pass at least
  ``MOCKSANDBOX_SF_MIN_PASSED`` tests (default 100; 123 of 150 pass on SandboxFusion on a host with
  this project's toolchains).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

TREE = os.environ.get("MOCKSANDBOX_SF_TREE")
PYTHON = os.environ.get("MOCKSANDBOX_SF_PYTHON")
PLUGIN_DIR = os.environ.get("MOCKSANDBOX_SF_PLUGIN_DIR")

pytestmark = pytest.mark.skipif(
    not (TREE and PYTHON and PLUGIN_DIR),
    reason="needs a SandboxFusion tree, its Python and the HTTP plugin: set MOCKSANDBOX_SF_TREE, "
    "MOCKSANDBOX_SF_PYTHON and MOCKSANDBOX_SF_PLUGIN_DIR (see the module docstring)",
)


def outcomes(junit: Path) -> dict[str, bool]:
    """Test id → passed, from a JUnit XML file."""
    found = {}
    for case in ET.parse(junit).iter("testcase"):
        failed = any(child.tag in ("failure", "error", "skipped") for child in case)
        found[f"{case.get('classname')}::{case.get('name')}"] = not failed
    return found


def test_sandboxfusion_dataset_tests_pass_on_the_mock(tmp_path: Path) -> None:
    assert TREE and PYTHON and PLUGIN_DIR
    tree = Path(TREE)
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "mocksandbox.cli", "serve", "--port", "0"),
            *(
                "--datasets",
                str(tree / "sandbox/tests/datasets/samples"),
                "--dataset-assets",
                str(tree / "assets"),
            ),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None
        match = re.search(r"serving on (http://\S+)", server.stdout.readline())
        assert match, "the server did not start"
        junit = tmp_path / "mock.xml"
        environment = {**os.environ, "SF_TARGET_URL": match.group(1), "PYTHONPATH": PLUGIN_DIR}
        run = subprocess.run(
            [
                *(
                    PYTHON,
                    "-m",
                    "pytest",
                    "-p",
                    "sf_remote_client",
                    "-o",
                    "addopts=",
                    "-p",
                    "no:cacheprovider",
                ),
                *("-q", "sandbox/tests/datasets", f"--junitxml={junit}"),
            ],
            cwd=tree,
            env=environment,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert junit.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
    mock = outcomes(junit)
    baseline = os.environ.get("MOCKSANDBOX_SF_BASELINE")
    if baseline:
        lost = sorted(
            name for name, passed in outcomes(Path(baseline)).items() if passed and not mock.get(name)
        )
        assert not lost, f"pass on SandboxFusion, not on the mock: {lost}"
    else:
        minimum = int(os.environ.get("MOCKSANDBOX_SF_MIN_PASSED", "100"))
        assert sum(mock.values()) >= minimum, run.stdout[-3000:]
