"""str_replace_editor: OpenHands' semantics and messages, on a session's files, in agent paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from mocksandbox.sessions.editor import Editor
from mocksandbox.sessions.paths import PathMap

REPO = "/workspace/acme__demo__1.0"


@pytest.fixture
def editor(tmp_path: Path) -> Editor:
    repo = tmp_path / "workspace" / "acme__demo__1.0"
    (repo / "demo").mkdir(parents=True)
    (repo / ".git").mkdir()
    (repo / "demo" / "core.py").write_text(
        "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
    )
    (repo / "README.md").write_text("demo\n")
    (tmp_path / "tmp").mkdir()
    return Editor(PathMap(tmp_path), tmp_path / "ctl" / "history.json", REPO)


def run(editor: Editor, **params: object) -> str:
    return editor.run(dict(params))


def test_view_file_with_cat_n_numbering(editor: Editor) -> None:
    assert run(editor, command="view", path=f"{REPO}/demo/core.py") == (
        f"Here's the result of running `cat -n` on {REPO}/demo/core.py:\n"
        "     1\tdef add(a, b):\n     2\t    return a - b\n     3\t\n     4\t\n"
        "     5\tdef sub(a, b):\n     6\t    return a - b\n     7\t\n"
    )
    assert run(editor, command="view", path=f"{REPO}/demo/core.py", view_range=[5, -1]) == (
        f"Here's the result of running `cat -n` on {REPO}/demo/core.py:\n"
        "     5\tdef sub(a, b):\n     6\t    return a - b\n"
    )
    out = run(editor, command="view", path=f"{REPO}/demo/core.py", view_range=[6, 99])
    assert out.endswith("NOTE: We only show up to 6 since there's only 6 lines in this file\n")
    out = run(editor, command="view", path=f"{REPO}/demo/core.py", view_range=[9, 10])
    assert out == (
        "ERROR:\nInvalid `view_range` parameter: [9, 10]. Its first element `9` should be within the "
        "range of lines of the file: [1, 6]."
    )


def test_view_directory_two_levels_without_hidden_entries(editor: Editor) -> None:
    assert run(editor, command="view", path=REPO) == (
        f"Here's the files and directories up to 2 levels deep in {REPO}, excluding hidden items:\n"
        f"{REPO}/\n{REPO}/README.md\n{REPO}/demo/\n{REPO}/demo/core.py\n\n"
        f"1 hidden files/directories in this directory are excluded. You can use 'ls -la {REPO}' to see them."
    )


def test_str_replace_needs_one_exact_occurrence(editor: Editor) -> None:
    path = f"{REPO}/demo/core.py"
    assert run(editor, command="str_replace", path=path, old_str="return a * b", new_str="x") == (
        f"ERROR:\nNo replacement was performed, old_str `return a * b` did not appear verbatim in {path}."
    )
    assert run(editor, command="str_replace", path=path, old_str="return a - b", new_str="return a + b") == (
        "ERROR:\nNo replacement was performed. Multiple occurrences of old_str `return a - b` in lines "
        "[2, 6]. Please ensure it is unique."
    )
    out = run(
        editor,
        command="str_replace",
        path=path,
        old_str="def add(a, b):\n    return a - b",
        new_str="def add(a, b):\n    return a + b",
    )
    assert out.startswith(
        f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet of {path}:\n"
        "     1\tdef add(a, b):\n     2\t    return a + b\n"
    )
    assert out.endswith(
        "Review the changes and make sure they are as expected. Edit the file again if necessary."
    )
    assert "return a + b" in (editor.paths.root / "workspace/acme__demo__1.0/demo/core.py").read_text()
    same = run(editor, command="str_replace", path=path, old_str="x", new_str="x")
    assert "`new_str` and `old_str` must be different" in same


def test_insert_create_and_undo(editor: Editor) -> None:
    path = f"{REPO}/demo/core.py"
    real = editor.paths.root / "workspace/acme__demo__1.0/demo/core.py"
    original = real.read_text()
    out = run(editor, command="insert", path=path, insert_line=0, new_str='"""Arithmetic."""')
    assert out.startswith(
        f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet"
    )
    assert real.read_text() == '"""Arithmetic."""\n' + original
    assert "It should be within the range of allowed values: [0, 7]" in run(
        editor, command="insert", path=path, insert_line=99, new_str="x"
    )
    assert run(editor, command="undo_edit", path=path).startswith(f"Last edit to {path} undone successfully.")
    assert real.read_text() == original
    assert run(editor, command="undo_edit", path=path) == f"ERROR:\nNo edit history found for {path}."

    new = f"{REPO}/demo/extra/util.py"
    assert (
        run(editor, command="create", path=new, file_text="X = 1\n") == f"File created successfully at: {new}"
    )
    assert run(editor, command="create", path=new, file_text="X = 2\n") == (
        f"ERROR:\nInvalid `path` parameter: {new}. File already exists at: {new}. "
        "Cannot overwrite files using command `create`."
    )
    assert run(editor, command="create", path="/tmp/repro.py", file_text="print(1)").startswith(
        "File created"
    )
    assert (editor.paths.root / "tmp" / "repro.py").read_text() == "print(1)"


def test_path_errors(editor: Editor) -> None:
    assert run(editor, command="view", path="demo/core.py") == (
        "ERROR:\nInvalid `path` parameter: demo/core.py. The path should be an absolute path, starting "
        f"with `/`. Maybe you meant {REPO}/demo/core.py?"
    )
    assert run(editor, command="view", path=f"{REPO}/nope.py") == (
        f"ERROR:\nInvalid `path` parameter: {REPO}/nope.py. The path {REPO}/nope.py does not exist. "
        "Please provide a valid path."
    )
    assert "only the `view` command can be used on directories" in run(
        editor, command="str_replace", path=f"{REPO}/demo", old_str="a", new_str="b"
    )
    assert "Only files under /workspace and /tmp can be changed" in run(
        editor, command="create", path="/etc/evil.conf", file_text="x"
    )
    assert "Parameter `old_str` is required for command: str_replace." in run(
        editor, command="str_replace", path=f"{REPO}/README.md"
    )


def test_binary_files_are_refused(editor: Editor) -> None:
    (editor.paths.root / "workspace/acme__demo__1.0/blob.bin").write_bytes(b"\x00\x01\x02")
    assert "File appears to be binary" in run(editor, command="view", path=f"{REPO}/blob.bin")


def test_undo_history_survives_a_new_editor(editor: Editor) -> None:
    path = f"{REPO}/README.md"
    run(editor, command="str_replace", path=path, old_str="demo", new_str="Demo")
    again = Editor(editor.paths, editor.history_file, REPO)
    assert run(again, command="undo_edit", path=path).startswith("Last edit")
    assert (editor.paths.root / "workspace/acme__demo__1.0/README.md").read_text() == "demo\n"
