"""How one cell's IOPub messages become its result (pure: no kernel)."""

from __future__ import annotations

from mocksandbox.jupyter.outputs import CellOutputs


def test_streams_concatenate_per_name() -> None:
    outputs = CellOutputs()
    outputs.feed("stream", {"name": "stdout", "text": "a"})
    outputs.feed("stream", {"name": "stderr", "text": "E"})
    outputs.feed("stream", {"name": "stdout", "text": "b\n"})
    result = outputs.result()
    assert (result.stdout, result.stderr, result.display, result.error) == ("ab\n", "E", [], [])


def test_values_and_displays_keep_their_mime_bundles_in_order() -> None:
    outputs = CellOutputs()
    outputs.feed("display_data", {"data": {"text/plain": "<Figure>", "image/png": "iVBO"}, "metadata": {}})
    outputs.feed("execute_result", {"data": {"text/plain": "42"}, "metadata": {}, "execution_count": 3})
    assert outputs.result().display == [{"text/plain": "<Figure>", "image/png": "iVBO"}, {"text/plain": "42"}]


def test_error_keys_in_sandboxfusion_order() -> None:
    outputs = CellOutputs()
    outputs.feed(
        "error",
        {"ename": "RuntimeError", "evalue": "boom", "traceback": ["line 1", "line 2"], "engine_info": {}},
    )
    [error] = outputs.result().error
    assert list(error) == ["traceback", "ename", "evalue"]
    assert error == {"traceback": ["line 1", "line 2"], "ename": "RuntimeError", "evalue": "boom"}


def test_clear_output_clears_now_or_at_next_output() -> None:
    outputs = CellOutputs()
    outputs.feed("stream", {"name": "stdout", "text": "old"})
    outputs.feed("clear_output", {"wait": False})
    assert outputs.result().stdout == ""
    outputs.feed("stream", {"name": "stdout", "text": "kept until"})
    outputs.feed("clear_output", {"wait": True})
    assert outputs.result().stdout == "kept until"
    outputs.feed("execute_result", {"data": {"text/plain": "1"}})
    result = outputs.result()
    assert (result.stdout, result.display) == ("", [{"text/plain": "1"}])


def test_update_display_data_replaces_the_named_display() -> None:
    outputs = CellOutputs()
    outputs.feed("display_data", {"data": {"text/plain": "0%"}, "transient": {"display_id": "bar"}})
    outputs.feed("display_data", {"data": {"text/plain": "other"}})
    outputs.feed("update_display_data", {"data": {"text/plain": "100%"}, "transient": {"display_id": "bar"}})
    outputs.feed("update_display_data", {"data": {"text/plain": "?"}, "transient": {"display_id": "unknown"}})
    assert outputs.result().display == [{"text/plain": "100%"}, {"text/plain": "other"}]


def test_other_messages_are_ignored() -> None:
    outputs = CellOutputs()
    for msg_type in ("status", "execute_input", "comm_open", "stream"):
        outputs.feed(msg_type, {"name": "weird", "text": "x", "execution_state": "busy", "code": "1"})
    result = outputs.result()
    assert (result.stdout, result.stderr, result.display, result.error) == ("", "", [], [])


def test_streams_are_capped_per_name_and_the_cap_restarts_after_clear() -> None:
    outputs = CellOutputs(max_stream_chars=5)
    outputs.feed("stream", {"name": "stdout", "text": "abc"})
    outputs.feed("stream", {"name": "stdout", "text": "defgh"})
    outputs.feed("stream", {"name": "stderr", "text": "123456"})
    outputs.feed("stream", {"name": "stdout", "text": "more"})
    assert (outputs.result().stdout, outputs.result().stderr) == ("abcde", "12345")
    outputs.feed("clear_output", {"wait": False})
    outputs.feed("stream", {"name": "stdout", "text": "xyz123"})
    assert outputs.result().stdout == "xyz12"
