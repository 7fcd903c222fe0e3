"""What a user of an installed package meets (issue 17), through the Flask test client and the CLI:

* ``/start_instance`` takes ``instance_hash`` (int or decimal string) or ``instance_id``, exactly one,
  and answers anything else with FastAPI's 422 ``detail``;
* the sample instances ship inside the package;
* ``/run_jupyter`` without the ``jupyter`` extra answers a SandboxError that names the extra;
* a command whose extra is missing says so in one line, exit code 2, no traceback.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

import mocksandbox
from mocksandbox import cli, extras
from mocksandbox.core import MockSandbox
from mocksandbox.sessions.instances import SHIPPED_INSTANCES_DIR, InstanceRegistry, instance_hash
from mocksandbox.settings import Settings
from mocksandbox.web import create_app

PAGEKIT = "acme__pagekit-17"


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MockSandbox]:
    box = MockSandbox.create(Settings(pod_name=None, state_dir=str(tmp_path_factory.mktemp("state"))))
    yield box
    box.close()


@pytest.fixture(scope="module")
def app(box: MockSandbox) -> Flask:
    return create_app(box)


@pytest.fixture
def client(app: Flask, box: MockSandbox) -> Iterator[FlaskClient]:
    yield app.test_client()
    errors = box.take_errors()
    assert not errors, f"unexpected server errors: {[e.traceback for e in errors]}"


# -- /start_instance -------------------------------------------------------------------------------


def _session_instance(client: FlaskClient, sid: str) -> str:
    return str(client.get(f"/_mock/sessions/{sid}").get_json()["instance_id"])


@pytest.mark.parametrize(
    "body",
    [
        {"instance_id": PAGEKIT},
        {"instance_hash": instance_hash(PAGEKIT)},
        {"instance_hash": str(instance_hash(PAGEKIT))},
        {"instance_hash": PAGEKIT},  # the old convenience: an id in the hash field
    ],
    ids=["instance_id", "hash-int", "hash-str", "id-in-hash-field"],
)
def test_start_instance_by_hash_or_by_id(client: FlaskClient, body: dict[str, Any]) -> None:
    reply = client.post("/start_instance", json=body)
    assert reply.status_code == 200, reply.get_data(as_text=True)
    sid = reply.get_json()["sid"]
    assert isinstance(sid, str) and sid.isdigit()
    assert _session_instance(client, sid) == PAGEKIT
    assert client.post("/postprocess", json={"sid": sid}).status_code == 200


def test_an_unknown_instance_id_is_404_naming_it(client: FlaskClient) -> None:
    reply = client.post("/start_instance", json={"instance_id": "nobody__nothing-1"})
    assert reply.status_code == 404
    assert reply.get_json()["detail"].startswith("unknown instance_id 'nobody__nothing-1': ")
    assert "/_mock/instances" in reply.get_json()["detail"]


@pytest.mark.parametrize(
    "body",
    [{}, {"instance_hash": None}, {"instance_id": None}, {"instance_id": PAGEKIT, "instance_hash": 1}],
    ids=["neither", "null-hash", "null-id", "both"],
)
def test_neither_or_both_is_one_422_item_at_the_body(client: FlaskClient, body: dict[str, Any]) -> None:
    reply = client.post("/start_instance", json=body)
    assert reply.status_code == 422
    [item] = reply.get_json()["detail"]
    assert list(item) == ["type", "loc", "msg", "input", "ctx", "url"]
    assert item["type"] == "value_error" and item["loc"] == ["body"]
    assert item["msg"].startswith("Value error, give exactly one of instance_hash")
    assert item["input"] == body
    assert item["url"] == "https://errors.pydantic.dev/2.6/v/value_error"


@pytest.mark.parametrize(
    ("body", "locs"),
    [
        ({"instance_id": 17}, [["body", "instance_id"]]),
        ({"instance_id": ["a"]}, [["body", "instance_id"]]),
        (
            {"instance_hash": [1]},
            [["body", "instance_hash", "int"], ["body", "instance_hash", "str"]],
        ),
        ("acme__pagekit-17", [["body"]]),
    ],
    ids=["id-int", "id-list", "hash-list", "not-an-object"],
)
def test_wrong_types_are_422_with_fastapi_items(
    client: FlaskClient, body: Any, locs: list[list[str]]
) -> None:
    reply = client.post("/start_instance", json=body)
    assert reply.status_code == 422
    detail = reply.get_json()["detail"]
    assert [item["loc"] for item in detail] == locs
    assert all(item["url"].startswith("https://errors.pydantic.dev/") for item in detail)


def test_the_samples_ship_inside_the_package() -> None:
    package_dir = Path(mocksandbox.__file__).resolve().parent
    assert package_dir / "sessions" / "samples" == SHIPPED_INSTANCES_DIR
    ids = [inst.instance_id for inst in InstanceRegistry.from_paths([]).all()]
    assert ids == [
        "acme__pagekit-17",
        "pyver__semverlite-88",
        "sciutils__unitconv-311",
        "textutils__slugger-42",
    ]


# -- /run_jupyter without the extra ----------------------------------------------------------------


def test_run_jupyter_without_the_extra_names_it(client: FlaskClient, monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name in ("zmq", "jupyter_client", "ipykernel") else real_find_spec(name, package)

    monkeypatch.setattr(extras.importlib.util, "find_spec", find_spec)
    reply = client.post("/run_jupyter", json={"cells": ["1"]})
    assert reply.status_code == 200
    answer = reply.get_json()
    assert list(answer) == ["status", "message", "driver", "cells", "executor_pod_name", "files"]
    assert answer["status"] == "SandboxError"
    assert answer["message"] == (
        "/run_jupyter needs jupyter_client and ipykernel, and jupyter_client is not installed: "
        "pip install 'mocksandbox[jupyter]'"
    )
    assert (answer["driver"], answer["cells"], answer["files"]) == (None, [], {})
    # Validation comes first: a bad body is still the 422 it always is.
    assert client.post("/run_jupyter", json={"cells": ["1"], "kernel": "julia"}).status_code == 422


def test_another_interpreter_without_ipykernel_is_named(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    reason = extras.jupyter_missing(str(python))
    assert reason == (
        f"/run_jupyter needs ipykernel in the kernels' interpreter {python}, which cannot import it: "
        f"{python} -m pip install ipykernel"
    )
    assert extras.jupyter_missing(sys.executable) is None  # this venv has the extra


# -- commands whose extra is missing -------------------------------------------------------------


def test_a_command_without_its_extra_says_which_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        extras.importlib.util,
        "find_spec",
        lambda name, package=None: None if name == "hypothesis" else real_find_spec(name, package),
    )
    assert cli.main(["contract", "--url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert (
        err == "mocksandbox: 'mocksandbox contract' needs hypothesis: pip install 'mocksandbox[contract]'\n"
    )


def test_an_optional_import_deep_in_a_command_is_one_line_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def handler(args: object) -> int:
        raise ModuleNotFoundError("No module named 'ray'", name="ray")

    def broken(args: object) -> int:
        raise ModuleNotFoundError("No module named 'mocksandbox_nope'", name="mocksandbox_nope")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser.set_defaults(handler=handler)
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        for sub in action.choices.values():  # type: ignore[union-attr]
            sub.set_defaults(handler=handler)
    assert cli.main(["rollout", "x.json"]) == 2
    assert capsys.readouterr().err == (
        "mocksandbox: 'mocksandbox rollout' needs ray: pip install 'mocksandbox[ray]'\n"
    )
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        for sub in action.choices.values():  # type: ignore[union-attr]
            sub.set_defaults(handler=broken)
    with pytest.raises(ModuleNotFoundError):  # not an extra's module: a real error, kept as it is
        cli.main(["rollout", "x.json"])


def test_version_from_one_place() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mocksandbox", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert out == f"mocksandbox {mocksandbox.__version__}\n"
    from importlib.metadata import version

    assert version("mocksandbox") == mocksandbox.__version__
