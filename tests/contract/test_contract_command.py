"""`mocksandbox contract`: suite wiring, differential mode, and the Docker launcher (with a fake)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mocksandbox.cli import main
from mocksandbox.contract.command import EXIT_NO_DOCKER
from mocksandbox.contract.differential import compare, corpus_cases, generated_cases
from mocksandbox.contract.docker_launcher import NoDockerEngine, running_image
from mocksandbox.core import MockSandbox
from mocksandbox.serving.single import ServerThread


@pytest.fixture(scope="module")
def second_mock() -> Iterator[ServerThread]:
    box = MockSandbox.create()
    server = ServerThread(box, "127.0.0.1", 0).start()
    yield server
    server.stop()
    box.close()


def test_suite_runs_against_a_url_and_writes_junit(mocksandbox_url: str, tmp_path: Path) -> None:
    junit = tmp_path / "contract.xml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mocksandbox.cli",
            "contract",
            "--url",
            mocksandbox_url,
            "--junit",
            str(junit),
            "--",
            "-k",
            "ping or 404",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "contract summary" in done.stdout
    assert "protocol & errors" in done.stdout
    assert "<testsuite" in junit.read_text()


def test_differential_identical_targets(mocksandbox_url: str, second_mock: ServerThread) -> None:
    cases = corpus_cases() + generated_cases(12, seed=5)
    differences = compare(mocksandbox_url, second_mock.url, cases)
    assert differences == []


def test_differential_finds_and_reports_differences(
    mocksandbox, mocksandbox_url: str, second_mock: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    mocksandbox.add_fault(
        match={"body_contains": "sys.exit"}, action={"type": "sandbox_error", "message": "down"}
    )
    code = main(
        ["contract", "--url", mocksandbox_url, "--reference-url", second_mock.url, "--generated", "4"]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "status" in out and "SandboxError" in out
    assert "cases identical" in out


def test_reference_url_needs_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["contract", "--reference-url", "http://127.0.0.1:1"]) == 2
    assert "needs --url" in capsys.readouterr().err


def test_generated_cases_are_deterministic() -> None:
    assert generated_cases(8, seed=1) == generated_cases(8, seed=1)
    assert generated_cases(8, seed=1) != generated_cases(8, seed=2)


class FakeContainer:
    def __init__(self) -> None:
        self.attrs = {
            "NetworkSettings": {"Ports": {"8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": "49999"}]}}
        }
        self.removed = False

    def reload(self) -> None:
        pass

    def remove(self, force: bool = False) -> None:
        self.removed = force


class FakeContainers:
    def __init__(self) -> None:
        self.started: list[tuple[str, dict[str, Any]]] = []
        self.container = FakeContainer()

    def run(self, image: str, **kwargs: Any) -> FakeContainer:
        self.started.append((image, kwargs))
        return self.container


class FakeDocker:
    def __init__(self, reachable: bool = True) -> None:
        self.reachable = reachable
        self.containers = FakeContainers()

    def ping(self) -> bool:
        if not self.reachable:
            raise ConnectionError("Cannot connect to the Docker daemon")
        return True


def test_launcher_starts_waits_and_removes() -> None:
    fake = FakeDocker()
    polls = iter([False, False, True])
    sleeps: list[float] = []
    with running_image(
        "img:tag", client_factory=lambda: fake, poll=lambda url: next(polls), sleep=sleeps.append
    ) as url:
        assert url == "http://127.0.0.1:49999"
        assert not fake.containers.container.removed
    image, options = fake.containers.started[0]
    assert image == "img:tag"
    assert options["ports"] == {"8080/tcp": ("127.0.0.1", None)}  # loopback only
    assert sleeps == [1.0, 1.0]
    assert fake.containers.container.removed


def test_launcher_removes_the_container_when_it_never_gets_ready() -> None:
    fake = FakeDocker()
    with (
        pytest.raises(TimeoutError),
        running_image(
            "img", client_factory=lambda: fake, poll=lambda url: False, sleep=lambda s: None, ready_timeout=0
        ),
    ):
        pass
    assert fake.containers.container.removed


def test_launcher_without_an_engine() -> None:
    with (
        pytest.raises(NoDockerEngine),
        running_image("img", client_factory=lambda: FakeDocker(reachable=False)),
    ):
        pass


def test_cli_without_an_engine_exits_with_its_own_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import mocksandbox.contract.docker_launcher as launcher

    monkeypatch.setattr(launcher, "default_client_factory", lambda: FakeDocker(reachable=False))
    monkeypatch.setattr(
        launcher.running_image,
        "__defaults__",
        (launcher.DEFAULT_IMAGE, launcher.default_client_factory, 300.0, None, launcher.time.sleep),
    )
    assert main(["contract", "--docker"]) == EXIT_NO_DOCKER
    assert "no Docker engine" in capsys.readouterr().err
