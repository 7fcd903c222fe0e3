"""Dirs of a test's own that runs see: for canaries and host files a test puts in a run's view.

Not under /tmp (``tmp_path``'s), which every run of isolation ``lite`` finds empty but for its own
files, as in a fresh container: a check that a run cannot change or read a canary there could not
fail. (A plain module beside the tests: pytest puts this directory on ``sys.path``.)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Where they are made: a dir every host has, that runs see and the server does not hide.
VISIBLE_ROOT = "/var/tmp"


def visible_dir(prefix: str) -> Path:
    """A new dir under :data:`VISIBLE_ROOT` (the caller removes it)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=VISIBLE_ROOT))


@contextmanager
def python_without_pytest() -> Iterator[str]:
    """A fresh venv's interpreter (this project's Python, without pytest) in a :func:`visible_dir`,
    removed after: a swedev backend or session whose tests cannot run."""
    base = visible_dir("no-pytest-")
    try:
        venv = base / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        yield str(venv / "bin" / "python")
    finally:
        shutil.rmtree(base, ignore_errors=True)
