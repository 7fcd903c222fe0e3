"""What ``mocksandbox serve`` says at start-up: a banner that fits a screen (where it serves, what
holds in one line, the runtime, every warning, datasets as a count), with everything else behind
``serve --verbose``, ``mocksandbox doctor`` and ``mocksandbox datasets``."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_process import start_serve, stop_serve

from mocksandbox.cli import main
from mocksandbox.core import MockSandbox
from mocksandbox.serving.banner import Banner, sandbox_banner
from mocksandbox.settings import load_settings

#: About a screen: the banner's lines, its first and "press Ctrl-C" included.
MOST_LINES = 12


@pytest.fixture(scope="module")
def both() -> Iterator[tuple[list[str], list[str]]]:
    """The banner of ``mocksandbox serve`` as it starts by default, and with ``--verbose``."""
    banners = []
    for verbose in (False, True):
        server = start_serve(verbose=verbose)
        banners.append([line.rstrip("\n") for line in server.banner])
        stop_serve(server.process)
    yield banners[0], banners[1]


def test_the_banner_fits_a_screen(both: tuple[list[str], list[str]]) -> None:
    short, verbose = both
    text = "\n".join(short)
    assert len(short) <= MOST_LINES + len([line for line in short if "WARNING" in line]), text
    assert "serving on http://127.0.0.1:" in short[0]
    (holds,) = [line for line in short if line.startswith("  isolation: ")]
    assert "protections" in holds and "mocksandbox doctor" in holds
    assert any(line.startswith("  python: CPython ") for line in short), text
    assert any(line.startswith("  runtime: ") and "languages" in line for line in short), text
    datasets = len(next(line for line in verbose if line.startswith("  datasets: aider")).split(", "))
    assert f"  datasets: {datasets} (mocksandbox datasets lists them" in text
    assert "mocksandbox serve --verbose" in short[-2] and short[-1] == "  press Ctrl-C to stop"
    # What the screenful leaves to --verbose (and doctor).
    for detail in (
        "hidden from runs:",
        "process budget:",
        "memory budget:",
        "swedev isolation:",
        "aider_benchmark_v1",
    ):
        assert detail not in text and detail in "\n".join(verbose), detail


def test_every_warning_is_in_both(both: tuple[list[str], list[str]]) -> None:
    short, verbose = both
    assert [line for line in verbose if "WARNING" in line] == [line for line in short if "WARNING" in line]


def test_warnings_of_a_host_that_gives_less(tmp_path: Path) -> None:
    """Protections ``auto`` could not get, and user code on the server's own interpreter: each
    warning of the full banner is in the short one too, word for word."""
    settings = load_settings(overrides={"tmp_root": str(tmp_path), "python": sys.executable, "pod_name": "p"})
    sandbox = MockSandbox.create(settings)
    try:
        sandbox.engine.isolation = dataclasses.replace(
            sandbox.engine.isolation,
            run_uid=None,
            run_as_reason="no user namespaces here",
            syscall_filter=False,
            syscall_filter_reason="libseccomp is missing",
        )
        banner = sandbox_banner(sandbox, settings)
    finally:
        sandbox.close()
    assert isinstance(banner, Banner)
    warnings = [line for line in banner.verbose if "WARNING" in line]
    assert len(warnings) == 3 and "no user namespaces here" in warnings[0]
    assert "libseccomp is missing" in warnings[1]
    # User code on this interpreter, and how to give it its own.
    assert "user code shares this server's environment" in warnings[2]
    assert "mocksandbox runtime install --languages python" in warnings[2]
    assert warnings == [line for line in banner.short if "WARNING" in line]
    short = "\n".join(banner.short)
    # A screenful, and a line more for each warning (with the URL's line and "press Ctrl-C").
    assert len(banner.short) + 2 <= MOST_LINES + short.count("WARNING"), short


def test_doctor_holds_what_the_banner_leaves_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) in (0, 1)
    out = capsys.readouterr().out
    assert "protection" in out and "holds" in out
    for detail in ("confinement:", "isolation:", "hidden from runs:", "process budget:", "memory budget:"):
        assert f"\n  {detail}" in out, detail
    assert "python runtime: CPython" in out and "runtime: " in out


def test_datasets_lists_what_the_banner_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["datasets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["dataset", "class", "here"]
    assert lines[1].split()[:2] == ["aider_benchmark_v1", "AiderBenchmarkDataset"]
    assert "humaneval_sample HumanEvalDataset 5 rows" in [" ".join(line.split()) for line in lines]
    (summary,) = [line for line in lines if " datasets, " in line]
    table = lines[1 : lines.index(summary)]
    assert int(summary.split()[0]) == len(table)
    assert all(line.startswith("note: ") for line in lines[lines.index(summary) + 1 :])
