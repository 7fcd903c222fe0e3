"""``runtime install``: planning, dry runs, rights, idempotence; no network, no system change.

The planner is given a made-up :class:`Host` (which binaries and Debian packages exist, root or
not); steps that only write files (Go module files, links) run for real in a temp runtime dir.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from mocksandbox.cli import main
from mocksandbox.runtime.catalog import GO_DEBIAN_PACKAGES, LANGUAGE_NEEDS
from mocksandbox.runtime.install import (
    APT_INSTALL,
    NODE_PACKAGE_JSON,
    Host,
    InstallError,
    plan_install,
    resolve_languages,
    run_plan,
)
from mocksandbox.runtime.layout import RuntimeDir


def make_host(
    binaries: Sequence[str] = (), packages: Sequence[str] = (), root: bool = True, apt: bool = True
) -> Host:
    return Host(
        is_root=root,
        which=lambda name: f"/usr/bin/{name}" if name in binaries else None,
        installed_packages=lambda wanted: set(wanted) & set(packages),
        has_apt=apt,
    )


def titles(runtime: RuntimeDir, languages: Sequence[str], host: Host) -> list[str]:
    return [step.title for step in plan_install(languages, runtime, host).steps]


def test_resolve_languages() -> None:
    assert resolve_languages(["go", " java "], every=False) == ["go", "java"]
    assert resolve_languages(None, every=True) == list(LANGUAGE_NEEDS)
    with pytest.raises(InstallError, match="unknown language"):
        resolve_languages(["golang"], every=False)
    with pytest.raises(InstallError, match="--all"):
        resolve_languages([], every=False)


def test_missing_toolchain_and_libraries_become_one_apt_step(tmp_path: Path) -> None:
    plan = plan_install(["go", "ruby"], RuntimeDir(tmp_path), make_host())
    apt = plan.steps[0]
    install = apt.commands[-1]
    assert apt.commands[0] == ("apt-get", "update")
    assert install[: len(APT_INSTALL)] == APT_INSTALL
    assert {"golang-go", "ruby", "golang-github-stretchr-testify-dev"} <= set(install)
    assert not apt.blocked


def test_toolchains_already_on_path_are_not_installed(tmp_path: Path) -> None:
    plan = plan_install(["ruby", "php"], RuntimeDir(tmp_path), make_host(binaries=["ruby", "php"]))
    assert plan.steps == []


def test_without_root_the_exact_command_is_printed_and_nothing_runs(tmp_path: Path) -> None:
    plan = plan_install(["lua"], RuntimeDir(tmp_path), make_host(root=False))
    out = io.StringIO()
    assert run_plan(plan, out) == 1
    text = out.getvalue()
    assert "needs root" in text
    assert "sudo apt-get update && sudo apt-get install -y --no-install-recommends lua5.4 lua-unit" in text


def test_without_apt_the_packages_are_named(tmp_path: Path) -> None:
    plan = plan_install(["php"], RuntimeDir(tmp_path), make_host(apt=False))
    assert "no apt-get" in plan.steps[0].blocked and "php-cli" in plan.steps[0].blocked


def test_what_no_source_has_is_reported_not_planned(tmp_path: Path) -> None:
    plan = plan_install(["julia", "swift", "lean", "csharp"], RuntimeDir(tmp_path), make_host())
    assert plan.steps == []
    assert [line.split(":")[0] for line in plan.unavailable] == ["julia", "swift", "lean", "lean (mathlib)", "csharp"]  # fmt: skip


def test_dry_run_lists_commands_and_changes_nothing(tmp_path: Path) -> None:
    runtime = RuntimeDir(tmp_path / "runtime")
    plan = plan_install(["jest", "go", "python"], runtime, make_host(binaries=["node", "npm", "go"]))
    out = io.StringIO()
    assert run_plan(plan, out, dry_run=True) == 0
    text = out.getvalue()
    assert "would run: npm install --no-audit --no-fund --loglevel=error" in text
    assert "-m venv" in text and "pip install --progress-bar off -r" in text
    assert "would write" in text
    assert not runtime.root.exists()


def test_file_steps_run_and_a_second_install_does_nothing(tmp_path: Path) -> None:
    """The Go module files and gopath need no network: install them twice for real."""
    runtime = RuntimeDir(tmp_path / "runtime")
    host = make_host(binaries=["go"], packages=GO_DEBIAN_PACKAGES)
    first = io.StringIO()
    assert run_plan(plan_install(["go", "go_test"], runtime, host), first) == 0
    assert "done" in first.getvalue()
    assert (runtime.go_dir / "go.mod").read_text().startswith("module SeedSandbox")
    assert runtime.gopath.is_dir()
    second = io.StringIO()
    assert run_plan(plan_install(["go"], runtime, host), second) == 0
    assert "already there" in second.getvalue() and "done (" not in second.getvalue()


def test_node_configuration_is_sandboxfusions(tmp_path: Path) -> None:
    """What decides how `npm run test` behaves: jest, no colours, 2 workers, the JSON report."""
    assert NODE_PACKAGE_JSON["scripts"] == {"test": "FORCE_COLOR=0 jest"}
    assert NODE_PACKAGE_JSON["jest"] == {"maxWorkers": 2, "testResultsProcessor": "jest-json-reporter"}
    assert NODE_PACKAGE_JSON["jestJsonReporter"] == {"outputFile": "jest-report.json"}
    runtime = RuntimeDir(tmp_path)
    step = plan_install(["jest"], runtime, make_host(binaries=["node", "npm"])).steps[0]
    assert step.action is not None
    step.action()
    assert json.loads((runtime.node_dir / "package.json").read_text()) == NODE_PACKAGE_JSON
    assert step.done()


def test_shims_link_into_the_runtime_bin(tmp_path: Path) -> None:
    runtime = RuntimeDir(tmp_path)
    steps = plan_install(["typescript"], runtime, make_host(binaries=["node", "npm"])).steps
    shims = [step for step in steps if step.title.startswith("bin/")]
    assert [step.title.split()[0] for step in shims] == ["bin/tsx", "bin/tsc"]
    for step in shims:
        assert step.action is not None
        step.action()
        assert step.done()
    assert (runtime.bin_dir / "tsx").readlink() == Path("../node/node_modules/.bin/tsx")


def test_cli_dry_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runtime = tmp_path / "runtime"
    assert main(["runtime", "install", "--languages", "go", "--runtime-dir", str(runtime), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"runtime dir: {runtime}" in out and "go.mod" in out
    assert not runtime.exists()


def test_cli_rejects_unknown_languages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runtime", "install", "--languages", "cobol", "--runtime-dir", str(tmp_path)]) == 2
    assert "unknown language(s): cobol" in capsys.readouterr().err
