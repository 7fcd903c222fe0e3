"""The cassette shipped in the package, recorded through ``mocksandbox record`` from SandboxFusion
469de08 run locally (see fixtures/cassettes/README.md): every exchange replays byte for byte."""

from __future__ import annotations

from pathlib import Path

import requests
from conftest import replaying

import mocksandbox.recording
from mocksandbox.recording.cassette import read_cassette

SHIPPED = Path(mocksandbox.recording.__file__).parent / "samples" / "sandboxfusion-469de08.jsonl"


def test_the_shipped_cassette_replays_every_exchange(http: requests.Session) -> None:
    exchanges = read_cassette(SHIPPED)
    assert {e.upstream["server"] for e in exchanges} == {"uvicorn"}  # SandboxFusion's server
    languages = {e.request.json_field("language") for e in exchanges if e.status == 200}
    assert {"python", "cpp", "java", "bash", "rust", "scala", "racket"} <= languages
    with replaying(SHIPPED, "strict") as replay:
        for exchange in exchanges:
            request = exchange.request
            headers = {"Content-Type": request.content_type} if request.content_type else {}
            url = replay.url + request.path + (f"?{request.query}" if request.query else "")
            answer = http.request(request.method, url, data=request.body, headers=headers, timeout=60)
            assert (answer.status_code, answer.content) == (exchange.status, exchange.body), exchange.source
        assert replay.sandbox.take_errors() == []
        assert all(entry.replayed for entry in replay.sandbox.requests())
