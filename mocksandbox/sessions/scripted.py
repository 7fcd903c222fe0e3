"""Scripted agents for client tests: actions with a known outcome, written as a model writes them.

Drive a rollout against the mock with episodes whose reward you know in advance::

    from mocksandbox.sessions.scripted import diff_block, function_call, gold_editor_calls

    function_call("execute_bash", command="cd /workspace/acme__pagekit__1.2 && pytest -q")
    diff_block(instance.patch)            # solves the instance: reward 1.0
    gold_editor_calls(instance)           # the same fix as str_replace_editor calls
    function_call("finish")
"""

from __future__ import annotations

import difflib
import shutil
import tempfile
from pathlib import Path

from mocksandbox.sessions.gitops import apply_patch, changed_paths
from mocksandbox.sessions.instances import Instance


def function_call(function: str, reasoning: str = "", **params: object) -> str:
    """An OpenHands function call (``<function=...>``), multi-line values on lines of their own."""
    lines = [reasoning] if reasoning else []
    lines.append(f"<function={function}>")
    for name, value in params.items():
        text = str(value)
        if "\n" in text:
            lines.append(f"<parameter={name}>\n{text}\n</parameter>")
        else:
            lines.append(f"<parameter={name}>{text}</parameter>")
    lines.append("</function>")
    return "\n".join(lines)


def diff_block(patch: str, reasoning: str = "Here is my fix.") -> str:
    """``patch`` in a fenced ```diff block, which ``/process_action`` applies."""
    return f"{reasoning}\n\n```diff\n{patch}```\n"


def patched_files(instance: Instance, patch: str) -> dict[str, tuple[str, str]]:
    """Path -> (content at the base state, content once ``patch`` is applied)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "repo"
        shutil.copytree(instance.source, work)
        result = apply_patch(work, patch, ceiling=Path(tmp))
        if not result.ok:
            raise ValueError(f"the patch does not apply to {instance.instance_id}: {result.output}")
        files = {}
        for path in changed_paths(patch):
            before = instance.source / path
            after = work / path
            files[path] = (
                before.read_text() if before.is_file() else "",
                after.read_text() if after.is_file() else "",
            )
        return files


def editor_calls(instance: Instance, patch: str) -> list[str]:
    """``patch`` as ``str_replace_editor`` calls, as a model would make them: one ``str_replace`` per
    changed block of lines (with the least context that makes ``old_str`` unique), a ``create`` per
    new file."""
    calls = []
    for path, (old, new) in patched_files(instance, patch).items():
        agent_path = f"{instance.workspace_path}/{path}"
        if not (instance.source / path).exists():
            calls.append(
                function_call("str_replace_editor", command="create", path=agent_path, file_text=new)
            )
            continue
        old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
        matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
        changes = [op for op in matcher.get_opcodes() if op[0] != "equal"]
        for _, i1, i2, j1, j2 in reversed(changes):  # bottom up: the blocks above still match
            context = 1
            while True:
                a1, a2 = max(0, i1 - context), min(len(old_lines), i2 + context)
                old_str = "".join(old_lines[a1:a2])
                # The parser strips values, as OpenHands does: the stripped text must be unique.
                if old.count(old_str.strip()) == 1 or (a1 == 0 and a2 == len(old_lines)):
                    break
                context += 1
            new_str = "".join(old_lines[a1:i1] + new_lines[j1:j2] + old_lines[i2:a2])
            calls.append(
                function_call(
                    "str_replace_editor",
                    f"I will change {path}.",
                    command="str_replace",
                    path=agent_path,
                    old_str=old_str,
                    new_str=new_str,
                )
            )
    return calls


def gold_editor_calls(instance: Instance) -> list[str]:
    """The instance's gold patch as ``str_replace_editor`` calls."""
    return editor_calls(instance, instance.patch)
