"""Shared test configuration. Keep it small: fixtures belong next to the tests that use them."""

from __future__ import annotations

import sys
from pathlib import Path

# Helpers such as `corpus_tools` live in this directory and are imported by name (there is no
# tests/__init__.py); make that work under every pytest import mode.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)
