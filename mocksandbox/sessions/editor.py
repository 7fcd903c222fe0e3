"""``str_replace_editor`` with OpenHands' semantics and messages (``openhands_aci``'s ``OHEditor``).

``view`` (a file with ``cat -n`` numbering, optionally a ``view_range``; a directory two levels deep
without hidden entries), ``create`` (never over an existing file), ``str_replace`` (``old_str`` must
occur exactly once), ``insert`` (after line ``insert_line``, 0 for the top) and ``undo_edit`` (the
last edit of a file, up to 10 back). Errors read ``ERROR:\\n<message>`` as OpenHands sends them.

The editor works on the session's real files and speaks the agent's paths (see
:mod:`mocksandbox.sessions.paths`); the undo history is kept in a file, so that it survives a restart.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mocksandbox.sessions.paths import PathMap

SNIPPET_CONTEXT_WINDOW = 4
MAX_RESPONSE_LEN_CHAR = 16000
MAX_HISTORY_PER_FILE = 10
MAX_FILE_SIZE_MB = 10
COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")
FILE_CONTENT_TRUNCATED_NOTICE = (
    "<response clipped><NOTE>To save on context only part of this file has been shown to you. You "
    "should retry this tool after you have searched inside the file with `grep -n` in order to find "
    "the line numbers of what you are looking for.</NOTE>"
)
DIRECTORY_CONTENT_TRUNCATED_NOTICE = (
    "<response clipped><NOTE>To save on context only part of this directory has been shown to you. "
    "You should use `ls -la` instead to view large directories incrementally.</NOTE>"
)


class ToolError(Exception):
    """An editor error; its message is what the agent reads after ``ERROR:``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _invalid(parameter: str, value: Any, hint: str | None = None) -> ToolError:
    base = f"Invalid `{parameter}` parameter: {value}."
    return ToolError(f"{base} {hint}" if hint else base)


def _missing(command: str, parameter: str) -> ToolError:
    return ToolError(f"Parameter `{parameter}` is required for command: {command}.")


def maybe_truncate(content: str, notice: str, limit: int = MAX_RESPONSE_LEN_CHAR) -> str:
    return content if len(content) <= limit else content[:limit] + notice


def make_output(snippet: str, description: str, start_line: int = 1) -> str:
    """``cat -n`` style numbering, as OpenHands shows file content."""
    snippet = maybe_truncate(snippet, FILE_CONTENT_TRUNCATED_NOTICE)
    numbered = "\n".join(f"{i + start_line:6}\t{line}" for i, line in enumerate(snippet.split("\n")))
    return f"Here's the result of running `cat -n` on {description}:\n{numbered}\n"


class Editor:
    """One session's editor: real files under ``paths.root``, agent paths in and out."""

    def __init__(
        self,
        paths: PathMap,
        history_file: Path,
        workspace_root: str,
        made: Callable[[Path], None] | None = None,
    ) -> None:
        self.paths = paths
        self.history_file = history_file
        #: The agent's working directory, for "Maybe you meant ...?" on a relative path.
        self.workspace_root = workspace_root
        #: Called with each file or dir the editor makes (the topmost of new dirs): the session's
        #: commands may then change it (``SessionManager._give_to_commands``).
        self.made = made
        self._lock = threading.Lock()

    # -- entry point ----------------------------------------------------------------------------

    def run(self, params: dict[str, Any]) -> str:
        """Run one call (parameters already parsed); the text the agent sees, errors included."""
        with self._lock:
            try:
                return self._dispatch(params)
            except ToolError as exc:
                return f"ERROR:\n{self.paths.to_agent(exc.message)}"

    def _dispatch(self, params: dict[str, Any]) -> str:
        command = params.get("command")
        path_text = params.get("path")
        if command not in COMMANDS:
            raise ToolError(
                f"Unrecognized command {command}. The allowed commands for the str_replace_editor "
                f"tool are: {', '.join(COMMANDS)}"
            )
        if not isinstance(path_text, str):
            raise _missing(str(command), "path")
        shown = str(Path(path_text)) if path_text else path_text
        real = self._validate_path(str(command), shown)
        if command == "view":
            return self._view(real, shown, params.get("view_range"))
        if command == "create":
            file_text = params.get("file_text")
            if file_text is None:
                raise _missing(command, "file_text")
            new = real if not real.parent.exists() else None
            while new is not None and not new.parent.exists():
                new = new.parent
            real.parent.mkdir(parents=True, exist_ok=True)
            existed = real.exists()
            self._write(real, shown, file_text)
            if self.made is not None and (new is not None or not existed):
                self.made(new if new is not None else real)
            self._push_history(real, file_text)
            return f"File created successfully at: {shown}"
        if command == "str_replace":
            old_str = params.get("old_str")
            if old_str is None:
                raise _missing(command, "old_str")
            new_str = params.get("new_str")
            if new_str == old_str:
                raise _invalid(
                    "new_str",
                    new_str,
                    "No replacement was performed. `new_str` and `old_str` must be different.",
                )
            return self._str_replace(real, shown, old_str, new_str or "")
        if command == "insert":
            insert_line = params.get("insert_line")
            if insert_line is None:
                raise _missing(command, "insert_line")
            new_str = params.get("new_str")
            if new_str is None:
                raise _missing(command, "new_str")
            return self._insert(real, shown, int(insert_line), new_str)
        return self._undo(real, shown)

    # -- paths ----------------------------------------------------------------------------------

    def _validate_path(self, command: str, shown: str) -> Path:
        if not shown.startswith("/"):
            hint = "The path should be an absolute path, starting with `/`."
            suggestion = f"{self.workspace_root.rstrip('/')}/{shown}"
            suggested_real = self.paths.real_path(suggestion)
            if suggested_real is not None and suggested_real.exists():
                hint += f" Maybe you meant {suggestion}?"
            raise _invalid("path", shown, hint)
        real = self.paths.real_path(shown)
        if real is None:
            if command != "view":
                raise _invalid(
                    "path",
                    shown,
                    "Only files under /workspace and /tmp can be changed in this sandbox.",
                )
            real = Path(shown)
        if command == "create" and (real.exists() or real.is_symlink()):
            raise _invalid(
                "path",
                shown,
                f"File already exists at: {shown}. Cannot overwrite files using command `create`.",
            )
        if command != "create" and not real.exists():
            raise _invalid("path", shown, f"The path {shown} does not exist. Please provide a valid path.")
        if command != "view" and real.is_dir():
            raise _invalid(
                "path",
                shown,
                f"The path {shown} is a directory and only the `view` command can be used on directories.",
            )
        return real

    # -- file access ----------------------------------------------------------------------------

    def _check_file(self, real: Path, shown: str) -> None:
        if not real.is_file():
            return
        size = real.stat().st_size
        if size > MAX_FILE_SIZE_MB * 1024 * 1024:
            raise ToolError(
                f"File validation failed for {shown}: File is too large ({size / 1024 / 1024:.1f}MB). "
                f"Maximum allowed size is {MAX_FILE_SIZE_MB}MB."
            )
        with real.open("rb") as handle:
            if b"\0" in handle.read(8192):
                raise ToolError(
                    f"File validation failed for {shown}: File appears to be binary and this file type "
                    "cannot be read or edited by this tool."
                )

    def _read(self, real: Path, shown: str) -> str:
        self._check_file(real, shown)
        try:
            with real.open(encoding="utf-8", newline="") as handle:
                return handle.read()
        except UnicodeDecodeError:
            raise ToolError(
                "The editor only supports UTF-8 encoding files, please use bash commands for files "
                f"with other encoding: {shown}"
            ) from None
        except OSError as exc:
            raise ToolError(f"Ran into {exc} while trying to read {shown}") from None

    def _write(self, real: Path, shown: str, text: str) -> None:
        try:
            with real.open("w", encoding="utf-8", newline="") as handle:
                handle.write(text)
        except OSError as exc:
            raise ToolError(f"Ran into {exc} while trying to write to {shown}") from None

    # -- commands -------------------------------------------------------------------------------

    def _view(self, real: Path, shown: str, view_range: Any) -> str:
        if real.is_dir():
            if view_range:
                raise _invalid(
                    "view_range",
                    view_range,
                    "The `view_range` parameter is not allowed when `path` points to a directory.",
                )
            return self._view_dir(real, shown)
        content = self._read(real, shown)
        if not view_range:
            return make_output(content, shown)
        if (
            not isinstance(view_range, list)
            or len(view_range) != 2
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in view_range)
        ):
            raise _invalid("view_range", view_range, "It should be a list of two integers.")
        lines = content.splitlines(keepends=True)
        num_lines = len(lines)
        start, end = view_range
        if start < 1 or start > num_lines:
            raise _invalid(
                "view_range",
                view_range,
                f"Its first element `{start}` should be within the range of lines of the file: "
                f"{[1, num_lines]}.",
            )
        warning = None
        if end == -1:
            end = num_lines
        elif end > num_lines:
            warning = f"We only show up to {num_lines} since there's only {num_lines} lines in this file"
            end = num_lines
        if end < start:
            raise _invalid(
                "view_range",
                view_range,
                f"Its second element `{end}` should be greater than or equal to the first element `{start}`.",
            )
        snippet = "\n".join("".join(lines[start - 1 : end]).splitlines())
        output = make_output(snippet, shown, start)
        if warning:
            output += f"\nNOTE: {warning}\n"
        return output

    def _view_dir(self, real: Path, shown: str) -> str:
        hidden = 0
        entries: list[str] = [shown]
        try:
            children = sorted(os.listdir(real))
        except OSError as exc:
            raise ToolError(f"Ran into {exc} while trying to read {shown}") from None
        for name in children:
            if name.startswith("."):
                hidden += 1
                continue
            entries.append(f"{shown.rstrip('/')}/{name}")
            child = real / name
            if child.is_dir():
                try:
                    grandchildren = os.listdir(child)
                except OSError:
                    grandchildren = []
                entries.extend(
                    f"{shown.rstrip('/')}/{name}/{sub}" for sub in grandchildren if not sub.startswith(".")
                )
        formatted = []
        for entry in sorted(entries):
            entry_real = self.paths.real_path(entry) or Path(entry)
            formatted.append(f"{entry}/" if entry_real.is_dir() else entry)
        listing = maybe_truncate("\n".join(formatted), DIRECTORY_CONTENT_TRUNCATED_NOTICE)
        message = (
            f"Here's the files and directories up to 2 levels deep in {shown}, excluding hidden items:\n"
            + listing
        )
        if hidden:
            message += (
                f"\n\n{hidden} hidden files/directories in this directory are excluded. "
                f"You can use 'ls -la {shown}' to see them."
            )
        return message

    def _str_replace(self, real: Path, shown: str, old_str: str, new_str: str) -> str:
        content = self._read(real, shown)
        starts = []
        position = content.find(old_str)
        while position != -1:
            starts.append(position)
            position = content.find(old_str, position + 1)
        if not starts:
            raise ToolError(
                f"No replacement was performed, old_str `{old_str}` did not appear verbatim in {shown}."
            )
        if len(starts) > 1:
            lines = sorted({content.count("\n", 0, start) + 1 for start in starts})
            raise ToolError(
                "No replacement was performed. "
                f"Multiple occurrences of old_str `{old_str}` in lines {lines}. Please ensure it is unique."
            )
        index = starts[0]
        new_content = content[:index] + new_str + content[index + len(old_str) :]
        self._write(real, shown, new_content)
        self._push_history(real, content)
        replacement_line = content.count("\n", 0, index)  # 0-based
        start_line = max(0, replacement_line - SNIPPET_CONTEXT_WINDOW)
        end_line = replacement_line + SNIPPET_CONTEXT_WINDOW + new_str.count("\n")
        snippet = "\n".join(new_content.split("\n")[start_line : end_line + 1])
        return (
            f"The file {shown} has been edited. "
            + make_output(snippet, f"a snippet of {shown}", start_line + 1)
            + "Review the changes and make sure they are as expected. Edit the file again if necessary."
        )

    def _insert(self, real: Path, shown: str, insert_line: int, new_str: str) -> str:
        content = self._read(real, shown)
        lines = content.split("\n")
        num_lines = len(content.splitlines())
        if insert_line < 0 or insert_line > num_lines:
            raise _invalid(
                "insert_line",
                insert_line,
                f"It should be within the range of allowed values: {[0, num_lines]}",
            )
        new_lines = new_str.split("\n")
        new_content = "\n".join(lines[:insert_line] + new_lines + lines[insert_line:])
        self._write(real, shown, new_content)
        self._push_history(real, content)
        snippet = "\n".join(
            lines[max(0, insert_line - SNIPPET_CONTEXT_WINDOW) : insert_line]
            + new_lines
            + lines[insert_line : insert_line + SNIPPET_CONTEXT_WINDOW]
        )
        return (
            f"The file {shown} has been edited. "
            + make_output(
                snippet, "a snippet of the edited file", max(1, insert_line - SNIPPET_CONTEXT_WINDOW + 1)
            )
            + "Review the changes and make sure they are as expected (correct indentation, no duplicate "
            "lines, etc). Edit the file again if necessary."
        )

    def _undo(self, real: Path, shown: str) -> str:
        history = self._load_history()
        key = str(real)
        stack = history.get(key) or []
        if not stack:
            raise ToolError(f"No edit history found for {shown}.")
        previous = stack.pop()
        self._save_history(history)
        self._write(real, shown, previous)
        return f"Last edit to {shown} undone successfully. {make_output(previous, shown)}"

    # -- undo history (a JSON file: real path -> earlier contents, oldest first) -----------------

    def _load_history(self) -> dict[str, list[str]]:
        try:
            data = json.loads(self.history_file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save_history(self, history: dict[str, list[str]]) -> None:
        self.history_file.parent.mkdir(parents=True, exist_ok=True)
        temp = self.history_file.with_suffix(".tmp")
        temp.write_text(json.dumps(history), encoding="utf-8")
        temp.replace(self.history_file)

    def _push_history(self, real: Path, content: str) -> None:
        history = self._load_history()
        stack = history.setdefault(str(real), [])
        stack.append(content)
        del stack[:-MAX_HISTORY_PER_FILE]
        self._save_history(history)
