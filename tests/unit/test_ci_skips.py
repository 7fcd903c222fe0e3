"""CI's skips (``tests/ci_skips.py``): where every part is required, a skip off its list fails."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TESTS = """
import pytest

def test_a_missing_part():
    pytest.skip("no ipykernel for the server's interpreter")

@pytest.mark.skipif(True, reason="cgroup v1 pids/memory/freezer controllers are not writable here")
def test_a_missing_protection():
    pass

def test_an_optional_import():
    pytest.importorskip("a_module_nobody_has")

def test_a_toolchain_on_the_list():
    pytest.skip("toolchain binary not on PATH nor in the runtime dir: swiftc")

@pytest.mark.xfail(reason="known")
def test_an_expected_failure():
    assert False
"""


@pytest.mark.parametrize("required", [True, False])
def test_a_skip_off_the_list_fails_where_every_part_is_required(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, required: bool
) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("MOCKSANDBOX_REQUIRE_ALL", "1" if required else "0")
    pytester.makeconftest("from ci_skips import pytest_runtest_makereport  # noqa: F401\n")
    pytester.makepyfile(TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:mocksandbox")
    if required:
        # (A mark's skip is its setup's: failing there, it counts as an error.)
        result.assert_outcomes(failed=2, errors=1, skipped=1, xfailed=1)
        result.stdout.fnmatch_lines(["*not on the list of what CI's machine cannot have*no ipykernel*"])
    else:
        result.assert_outcomes(skipped=4, xfailed=1)
