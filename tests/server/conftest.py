"""Shared by the client compatibility tests: a real server, loopback-only clients, the official
client pointed at the server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mocksandbox.server import ServerThread, running_server
from mocksandbox.settings import Settings

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    """A real server on a free loopback port, with no pod name (as outside SandboxFusion's cloud)."""
    with running_server(Settings(pod_name=None)) as srv:
        yield srv


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients use ``requests``/``aiohttp`` with the environment's proxies: keep every byte on loopback."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


@pytest.fixture
def sf_endpoint(server: ServerThread) -> Iterator[str]:
    """The official client pointed at the mock with ``set_endpoint``; its module state restored after."""
    from sandbox_fusion import config as sf_config
    from sandbox_fusion import set_endpoint

    saved = (sf_config.SANDBOX_ENDPOINT, sf_config.DATASET_ENDPOINT)
    set_endpoint(server.url + "/")  # the client strips a trailing slash
    try:
        yield server.url
    finally:
        sf_config.SANDBOX_ENDPOINT, sf_config.DATASET_ENDPOINT = saved


@dataclass
class ServeProcess:
    """A ``mocksandbox serve`` process started inside a cgroup, as a container would place it."""

    url: str
    process: subprocess.Popen[str]
    banner: list[str]


@pytest.fixture
def serve_in_cgroup() -> Iterator[Callable[[Path, Path], ServeProcess]]:
    """Start ``mocksandbox serve --port 0`` in a cgroup (``cgroup.procs`` of the dir given), with
    its runs' temp dirs in a dir given; stopped (Ctrl-C, then killed) after the test."""
    started: list[subprocess.Popen[str]] = []

    def start(cgroup: Path, runs_dir: Path) -> ServeProcess:
        env = {**os.environ, "MOCKSANDBOX_TMP_ROOT": str(runs_dir), "NO_PROXY": "127.0.0.1"}
        # The shell moves itself into the cgroup, then becomes the server: everything it starts
        # (launcher, relays, runs) is charged there from the first instruction.
        command = f'echo $$ > {cgroup}/cgroup.procs && exec "$0" -m mocksandbox.cli serve --port 0'
        process = subprocess.Popen(
            ["/bin/sh", "-c", command, sys.executable],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        started.append(process)
        banner: list[str] = []
        url = None
        assert process.stdout is not None
        while url is None:
            line = process.stdout.readline()
            if not line:
                pytest.fail(f"server did not start:\n{''.join(banner)}")
            banner.append(line)
            if " serving on " in line:
                url = line.rsplit(" ", 1)[1].strip()
        while not banner[-1].startswith("  press Ctrl-C"):
            banner.append(process.stdout.readline())
        return ServeProcess(url, process, banner)

    yield start
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
