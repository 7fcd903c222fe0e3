"""Settings: config files (toml/yaml/json), MOCKSANDBOX_* variables, overrides, and clear errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from mocksandbox.settings import Settings, SettingsError, load_settings


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults(tmp_path: Path) -> None:
    # (An empty runtime dir: one with a Python venv would give the user interpreter instead.)
    settings = load_settings(environ={"MOCKSANDBOX_RUNTIME_DIR": str(tmp_path)})
    assert (settings.host, settings.port) == ("127.0.0.1", 8080)
    assert settings.runtime_dir == str(tmp_path)
    assert settings.python == sys.executable
    assert settings.tmp_root is None
    assert settings.confinement == "auto"
    assert settings.pydantic_docs_version == "2.6"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("c.toml", 'port = 9001\nhost = "0.0.0.0"\nmax-output-bytes = 4096\n'),
        ("c.toml", '[server]\nport = 9001\nhost = "0.0.0.0"\nmax_output_bytes = 4096\n'),
        ("c.yaml", "port: 9001\nhost: 0.0.0.0\nmax_output_bytes: 4096\n"),
        ("c.yml", "server:\n  port: 9001\n  host: 0.0.0.0\n  max-output-bytes: 4096\n"),
        ("c.json", json.dumps({"port": 9001, "host": "0.0.0.0", "max_output_bytes": 4096})),
    ],
    ids=["toml", "toml-server-table", "yaml", "yml-server-table", "json"],
)
def test_config_file_formats(tmp_path: Path, name: str, text: str) -> None:
    settings = load_settings(write(tmp_path, name, text), environ={})
    assert (settings.port, settings.host, settings.max_output_bytes) == (9001, "0.0.0.0", 4096)


def test_empty_yaml_file_means_defaults(tmp_path: Path) -> None:
    assert load_settings(write(tmp_path, "c.yaml", ""), environ={}).port == 8080


def test_environment_variables_are_coerced() -> None:
    settings = load_settings(
        environ={
            "MOCKSANDBOX_PORT": "9002",
            "MOCKSANDBOX_ACCESS_LOG": "true",
            "MOCKSANDBOX_MAX_TIMEOUT_S": "2.5",
            "MOCKSANDBOX_TMP_ROOT": "/var/tmp",
            "OTHER_PORT": "1",
        }
    )
    assert (settings.port, settings.access_log, settings.max_timeout_s) == (9002, True, 2.5)
    assert settings.tmp_root == "/var/tmp"


def test_precedence_defaults_file_environment_overrides(tmp_path: Path) -> None:
    config = write(tmp_path, "c.toml", 'port = 1001\nhost = "10.0.0.1"\npod_name = "from-file"\n')
    environ = {"MOCKSANDBOX_PORT": "1002", "MOCKSANDBOX_POD_NAME": "from-env"}
    assert load_settings(config, environ={}).port == 1001
    assert load_settings(config, environ=environ).port == 1002
    both = load_settings(config, overrides={"port": 1003, "host": None}, environ=environ)
    assert both.port == 1003
    assert both.host == "10.0.0.1"  # a None override means "not given"
    assert both.pod_name == "from-env"


def test_reads_os_environ_unless_given_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOCKSANDBOX_PORT", "1234")
    assert load_settings().port == 1234
    assert load_settings(environ={}).port == 8080


def test_unknown_key_in_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"invalid settings: prot: Extra inputs are not permitted"):
        load_settings(write(tmp_path, "c.toml", "prot = 9000\n"), environ={})


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"overrides": {"port": 70000}}, "port"),
        ({"overrides": {"confinement": "docker"}}, "confinement"),
        ({"overrides": {"max_output_bytes": 10}}, "max_output_bytes"),
        ({"environ": {"MOCKSANDBOX_PORT": "eighty"}}, "port"),
        ({"environ": {"MOCKSANDBOX_MAX_TIMEOUT_S": "0"}}, "max_timeout_s"),
    ],
)
def test_bad_values_name_the_setting(kwargs: dict[str, Any], field: str) -> None:
    kwargs.setdefault("environ", {})
    with pytest.raises(SettingsError, match=rf"^invalid settings: {field}: "):
        load_settings(**kwargs)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("c.ini", "port=1", r"use \.toml, \.yaml, \.yml or \.json"),
        ("c.toml", "port = = 1", r"is not valid"),
        ("c.yaml", "port: [1", r"is not valid"),
        ("c.json", "{port: 1}", r"is not valid"),
        ("c.yaml", "- port\n- 1\n", r"must hold a table/mapping"),
        ("c.json", "[1, 2]", r"must hold a table/mapping"),
    ],
)
def test_bad_config_files(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(SettingsError, match=message) as caught:
        load_settings(path, environ={})
    assert str(path) in str(caught.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"cannot read config file .*nope\.toml: No such file"):
        load_settings(tmp_path / "nope.toml", environ={})


def test_settings_error_is_a_value_error() -> None:
    assert issubclass(SettingsError, ValueError)


def test_frozen_and_replace_validates() -> None:
    settings = Settings(pod_name=None)
    with pytest.raises(ValidationError):
        settings.port = 1  # type: ignore[misc]
    changed = settings.replace(port=0)
    assert (changed.port, settings.port) == (0, 8080)
    with pytest.raises(SettingsError, match="port"):
        settings.replace(port=-1)
    with pytest.raises(SettingsError, match="bogus"):
        settings.replace(bogus=1)
