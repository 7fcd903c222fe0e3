"""Real servers on loopback for the cassette tests: a live upstream (the mock itself, standing in for
a SandboxFusion deployment), the recording proxy in front of it, and replaying servers."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from mocksandbox.recording.cassette import CassetteWriter
from mocksandbox.recording.forward import Forwarder
from mocksandbox.recording.proxy import ProxyThread
from mocksandbox.recording.recorder import Recorder
from mocksandbox.serving.single import ServerThread, running_server
from mocksandbox.settings import load_settings


@pytest.fixture
def http() -> Iterator[requests.Session]:
    """A client that never goes through an environment proxy: every byte stays on loopback."""
    session = requests.Session()
    session.trust_env = False
    yield session
    session.close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[ServerThread]:
    """A live deployment to record (the mock, with no pod name, as a local SandboxFusion)."""
    with running_server(load_settings(overrides={"port": 0, "pod_name": None})) as server:
        yield server


@contextmanager
def recording(upstream_url: str, cassette: Path, redact: tuple[str, ...] = ()) -> Iterator[str]:
    """A recording proxy in front of ``upstream_url`` writing ``cassette``; yields its URL."""
    recorder = Recorder(Forwarder(upstream_url), CassetteWriter(cassette, uuid.uuid4().hex), redact)
    with ProxyThread(recorder) as proxy:
        yield proxy.url


@contextmanager
def replaying(cassette: Path, mode: str = "strict", **overrides: Any) -> Iterator[ServerThread]:
    """A mock server answering from ``cassette``."""
    settings = load_settings(
        overrides={
            "port": 0,
            "pod_name": None,
            "replay_file": str(cassette),
            "replay_mode": mode,
            **overrides,
        }
    )
    with running_server(settings) as server:
        yield server


@dataclass
class CliProcess:
    """A ``mocksandbox`` command serving in the foreground: its URL and process."""

    url: str
    process: subprocess.Popen[str]
    banner: list[str]

    def stop(self) -> str:
        """Ctrl-C, as a user stops it; the rest of its output."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            out, _ = self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
        return out


@contextmanager
def cli_server(*args: str) -> Iterator[CliProcess]:
    """``python -m mocksandbox.cli ARGS``, read up to its "press Ctrl-C" line; stopped after."""
    process = subprocess.Popen(
        [sys.executable, "-m", "mocksandbox.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "NO_PROXY": "127.0.0.1"},
    )
    assert process.stdout is not None
    banner: list[str] = []
    while not banner or "press Ctrl-C" not in banner[-1]:
        line = process.stdout.readline()
        if not line:
            process.wait()
            pytest.fail(f"mocksandbox {args[0]} did not start:\n" + "".join(banner))
        banner.append(line)
    match = re.search(r"serving on (http://\S+)", "".join(banner))
    assert match, banner
    served = CliProcess(match.group(1), process, banner)
    try:
        yield served
    finally:
        served.stop()
