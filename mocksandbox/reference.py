"""The reference pages of the documentation, generated from the code (``docs/_gen/reference.py``
writes them when the site is built): every setting from :class:`~mocksandbox.settings.Settings`
(its meaning from the ``#:`` comment above the field), with the ``serve`` option and the
environment variable that set it; every command and option from the argument parser. Nothing here
is written by hand, so a setting or an option added in code is documented with no second edit."""

from __future__ import annotations

import argparse
import inspect
import re
from dataclasses import dataclass
from typing import Any

from pydantic_core import PydanticUndefined

from mocksandbox.settings import ENV_PREFIX, Settings

#: Settings given in the environment as one string: how its items are separated there.
_LIST_SEPARATORS = {"allowed_hosts": ",", "run_env_keep": ",", "instances_dirs": ":", "datasets_dirs": ":"}


@dataclass(frozen=True)
class SettingDoc:
    """One setting, as the reference shows it."""

    name: str
    type: str
    default: str
    option: str | None
    env: str
    meaning: str


def field_comments(model: type) -> dict[str, str]:
    """The ``#:`` comment lines just above each field of ``model``'s class body, joined."""
    lines = inspect.getsource(model).splitlines()
    body_indent = next((len(line) - len(line.lstrip()) for line in lines[1:] if line.strip()), 4)
    field = re.compile(rf"^ {{{body_indent}}}(\w+)\s*:")
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = field.match(line)
        if match is not None and pending:
            comments[match.group(1)] = " ".join(pending)
        if stripped:
            pending = []
    return comments


def _type_name(annotation: Any) -> str:
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    text = text.replace("typing.", "").replace("NoneType", "None")
    text = re.sub(r"Literal\[(.*)\]", lambda m: " | ".join(p.strip() for p in m.group(1).split(",")), text)
    # (" or ", not "|": a table cell cannot hold a pipe inside code.)
    return text.replace(" | ", " or ")


def _default_text(name: str) -> str:
    field = Settings.model_fields[name]
    if field.default is PydanticUndefined:
        if field.default_factory in (list, dict):
            return "none"
        return "computed (see meaning)" if field.default_factory is not None else "required"
    value = field.default
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)) and not value:
        return "none"
    return f"`{value}`"


def serve_option_strings() -> dict[str, str]:
    """Setting name -> the ``serve`` option that sets it (``--isolation``)."""
    from mocksandbox.cli import SERVE_OPTIONS, build_parser

    serve = _subcommands(build_parser())["serve"]
    by_dest: dict[str, str] = {}
    for action in serve._actions:
        if action.option_strings:
            by_dest[action.dest] = " / ".join(action.option_strings)
    return {setting: by_dest[dest] for setting, dest in SERVE_OPTIONS.items() if dest in by_dest}


def _option_help() -> dict[str, str]:
    """Setting name -> the help of the ``serve`` option that sets it."""
    from mocksandbox.cli import SERVE_OPTIONS, build_parser

    serve = _subcommands(build_parser())["serve"]
    helps = {action.dest: _help_text(action) for action in serve._actions if action.option_strings}
    return {setting: helps.get(dest, "") for setting, dest in SERVE_OPTIONS.items()}


def setting_docs() -> list[SettingDoc]:
    """Every setting, in the order the model declares them; its meaning is the comment above the
    field, else its option's help."""
    comments = field_comments(Settings)
    options = serve_option_strings()
    helps = _option_help()
    docs = []
    for name, field in Settings.model_fields.items():
        env = ENV_PREFIX + name.upper()
        separator = _LIST_SEPARATORS.get(name)
        if separator:
            env += f" (items separated by `{separator}`)"
        docs.append(
            SettingDoc(
                name=name,
                type=_type_name(field.annotation),
                default=_default_text(name),
                option=options.get(name),
                env=env,
                meaning=comments.get(name) or field.description or helps.get(name, ""),
            )
        )
    return docs


def _cell(text: str) -> str:
    """Text fit for one Markdown table cell: Sphinx roles become code, pipes are escaped."""
    text = re.sub(r":(?:class|mod|meth|func|attr|data):`~?([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    return text.replace("|", "\\|").replace("\n", " ")


def settings_reference_markdown() -> str:
    """The settings page: how settings are read, then one row per setting."""
    lines = [
        "---",
        "hide: [toc]",  # the table wants the page's width
        "---",
        "",
        "# Settings",
        "",
        "Everything `mocksandbox serve` (and the pytest plugin's mock) can be told. This page is",
        "generated from the settings model (`mocksandbox/settings.py`) and the command's parser when",
        "the site is built: it lists every setting there is.",
        "",
        "Settings come from, lowest precedence first: the defaults below, a config file",
        "(`--config FILE`: `.toml`, `.yaml` or `.json`; top-level keys or a `[server]` table), the",
        f"`{ENV_PREFIX}<NAME>` environment variables, and the command-line options. A setting with no",
        "option is set in a config file or the environment.",
        "",
        "| setting | option | environment | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for doc in setting_docs():
        option = f"`{doc.option}`" if doc.option else ""
        env_name, _, env_note = doc.env.partition(" ")
        env = f"`{env_name}`" + (f" {env_note}" if env_note else "")
        lines.append(
            f"| `{doc.name}` | {option} | {env} | {_cell(doc.default)} | {_cell(doc.meaning)} "
            f"(type: `{_cell(doc.type)}`) |"
        )
    return "\n".join(lines) + "\n"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _subcommand_help(parser: argparse.ArgumentParser) -> dict[str, str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {choice.dest: choice.help or "" for choice in action._choices_actions}
    return {}


def _option_text(action: argparse.Action) -> str:
    names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.metavar or action.dest}`"
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        value = "{" + ",".join(str(c) for c in action.choices) + "}"
    elif action.nargs == 0:
        value = ""
    else:
        metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
        value = metavar if action.option_strings else ""
    return names + (f" `{value}`" if value else "")


def _help_text(action: argparse.Action) -> str:
    text = action.help or ""
    if text == argparse.SUPPRESS:
        return ""
    if "%(" in text:
        try:
            text = text % {**vars(action), "prog": "mocksandbox"}
        except (KeyError, TypeError, ValueError):
            pass
    return text


def _command_section(name: str, parser: argparse.ArgumentParser, summary: str, level: int) -> list[str]:
    usage = parser.format_usage().strip().removeprefix("usage: ")
    lines = [f"{'#' * level} `{name}`", ""]
    if summary:
        lines += [summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else "."), ""]
    if parser.description and parser.description.strip() != summary:
        lines += [inspect.cleandoc(parser.description), ""]
    lines += ["```text", usage, "```", ""]
    for group in parser._action_groups:
        actions = [
            a
            for a in group._group_actions
            if a.help != argparse.SUPPRESS
            and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
        ]
        if not actions:
            continue
        title = group.title or "options"
        lines += [f"**{title[0].upper() + title[1:]}**", "", "| option | meaning |", "|---|---|"]
        for action in actions:
            lines.append(f"| {_cell(_option_text(action))} | {_cell(_help_text(action))} |")
        lines.append("")
    children = _subcommands(parser)
    helps = _subcommand_help(parser)
    for child_name, child in children.items():
        lines += _command_section(f"{name} {child_name}", child, helps.get(child_name, ""), level + 1)
    return lines


def cli_reference_markdown() -> str:
    """The command-line page: every command, its usage and its options, from the parser."""
    from mocksandbox.cli import build_parser

    parser = build_parser()
    lines = [
        "# Command line",
        "",
        "Every `mocksandbox` command and option. This page is generated from the command's argument",
        "parser when the site is built; `mocksandbox COMMAND --help` prints the same.",
        "",
        "```text",
        parser.format_usage().strip().removeprefix("usage: "),
        "```",
        "",
    ]
    helps = _subcommand_help(parser)
    for name, child in _subcommands(parser).items():
        lines += _command_section(f"mocksandbox {name}", child, helps.get(name, ""), 2)
    return "\n".join(lines) + "\n"
