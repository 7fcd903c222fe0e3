"""Turning one cell's IOPub messages into a :class:`CellRunResult`, as a notebook runner records them.

Streams are concatenated per name; ``execute_result`` and ``display_data`` add their mime bundle to
``display`` (``update_display_data`` replaces the bundle it names); ``error`` adds ``{traceback,
ename, evalue}`` (the key order SandboxFusion answers with); ``clear_output`` clears what the cell has
shown so far, or, with ``wait``, clears it when the next output arrives. Each stream keeps at most
``max_stream_chars`` characters (the rest is dropped, as ``/run_code`` drops output past its cap).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mocksandbox.jupyter.models import CellRunResult


class CellOutputs:
    """The outputs of one cell so far."""

    def __init__(self, max_stream_chars: int | None = None) -> None:
        self._max_stream_chars = max_stream_chars
        self._stream_chars = {"stdout": 0, "stderr": 0}
        self._streams: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._display: list[dict[str, Any]] = []
        self._display_ids: dict[str, int] = {}
        self._errors: list[dict[str, Any]] = []
        self._clear_on_next_output = False

    def feed(self, msg_type: str, content: Mapping[str, Any]) -> None:
        """Take one IOPub message addressed to this cell; other message types are ignored."""
        if msg_type == "clear_output":
            if content.get("wait"):
                self._clear_on_next_output = True
            else:
                self._clear()
            return
        if msg_type == "update_display_data":
            index = self._display_ids.get(_display_id(content) or "")
            if index is not None:
                self._display[index] = dict(content.get("data", {}))
            return
        if msg_type not in ("stream", "execute_result", "display_data", "error"):
            return
        if self._clear_on_next_output:
            self._clear()
        if msg_type == "stream":
            name = content.get("name")
            if name in self._streams:
                self._append_stream(name, str(content.get("text", "")))
        elif msg_type == "error":
            self._errors.append(
                {
                    "traceback": list(content.get("traceback", [])),
                    "ename": content.get("ename", ""),
                    "evalue": content.get("evalue", ""),
                }
            )
        else:
            display_id = _display_id(content)
            if display_id:
                self._display_ids[display_id] = len(self._display)
            self._display.append(dict(content.get("data", {})))

    def _append_stream(self, name: str, text: str) -> None:
        if self._max_stream_chars is not None:
            text = text[: max(0, self._max_stream_chars - self._stream_chars[name])]
        self._stream_chars[name] += len(text)
        if text:
            self._streams[name].append(text)

    def _clear(self) -> None:
        self._clear_on_next_output = False
        for name, parts in self._streams.items():
            parts.clear()
            self._stream_chars[name] = 0
        self._display.clear()
        self._display_ids.clear()
        self._errors.clear()

    def result(self) -> CellRunResult:
        return CellRunResult(
            stdout="".join(self._streams["stdout"]),
            stderr="".join(self._streams["stderr"]),
            display=list(self._display),
            error=list(self._errors),
        )


def _display_id(content: Mapping[str, Any]) -> str | None:
    transient = content.get("transient")
    if isinstance(transient, Mapping):
        value = transient.get("display_id")
        return str(value) if value is not None else None
    return None
