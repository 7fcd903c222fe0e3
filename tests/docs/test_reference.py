"""The reference pages are generated from the code, and nothing in the code is missing from them."""

from __future__ import annotations

import argparse

from mocksandbox.cli import SERVE_FLAGS, SERVE_OPTIONS, build_parser, serve_overrides
from mocksandbox.reference import (
    _subcommands,
    cli_reference_markdown,
    field_comments,
    setting_docs,
    settings_reference_markdown,
)
from mocksandbox.settings import Settings

#: serve's options that set no setting of their own (they pick a file, a serving shape, or how much
#: the banner says).
NOT_SETTINGS = {"help", "config", "ray", "replicas", "proxy_location", "ingress", "verbose"}


def _serve_parser() -> argparse.ArgumentParser:
    return _subcommands(build_parser())["serve"]


def test_every_setting_is_on_the_settings_page_with_its_variable_option_and_meaning() -> None:
    page = settings_reference_markdown()
    docs = {doc.name: doc for doc in setting_docs()}
    assert set(docs) == set(Settings.model_fields)
    for name, doc in docs.items():
        assert f"| `{name}` |" in page, name
        assert f"`MOCKSANDBOX_{name.upper()}`" in page, name
        assert doc.meaning.strip(), f"setting {name} has no meaning: add a #: comment above the field"
        if name in SERVE_OPTIONS:
            assert doc.option and doc.option in page, name


def test_the_meaning_comes_from_the_comment_above_the_field() -> None:
    comments = field_comments(Settings)
    assert comments["isolation"].startswith("What a run can see and touch")
    assert "host" not in comments  # no comment: its option's help is used
    assert (
        next(d for d in setting_docs() if d.name == "host").meaning == "address to bind (default 127.0.0.1)"
    )


def test_serve_options_and_settings_agree() -> None:
    dests = {action.dest for action in _serve_parser()._actions}
    assert set(SERVE_OPTIONS) <= set(Settings.model_fields)
    assert set(SERVE_OPTIONS.values()) <= dests
    assert set(SERVE_FLAGS) <= set(SERVE_OPTIONS.values())
    # A new serve option either sets a setting (and is then documented with it) or is named here.
    unmapped = dests - set(SERVE_OPTIONS.values()) - NOT_SETTINGS
    assert unmapped == set(), f"serve options that set no setting: {unmapped}"


def test_serve_overrides_leave_what_was_not_given_and_flags_set_their_setting() -> None:
    parser = build_parser()
    nothing = serve_overrides(parser.parse_args(["serve"]))
    assert all(value is None for value in nothing.values()), {
        k: v for k, v in nothing.items() if v is not None
    }
    given = serve_overrides(
        parser.parse_args(
            ["serve", "--no-control-api", "--no-pin-workers", "--access-log", "--queue-timeout", "2"]
        )
    )
    assert given["control_api"] is False and given["pin_workers"] is False
    assert given["access_log"] is True and given["queue_timeout_s"] == 2.0


def test_every_command_and_option_is_on_the_cli_page() -> None:
    page = cli_reference_markdown()

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        assert f"`{name}`" in page, name
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}`" in page, f"{name} {option}"
        for child_name, child in _subcommands(parser).items():
            walk(child, f"{name} {child_name}")

    for command, parser in _subcommands(build_parser()).items():
        walk(parser, f"mocksandbox {command}")
