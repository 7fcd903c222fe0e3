"""The pytest plugin's cassettes: ``@pytest.mark.mocksandbox_cassette`` and ``--mocksandbox-record``.

A marked test's server answers from the cassette (``mode``: ``strict``, ``fallback`` or
``prefer-local``). With ``--mocksandbox-record URL``, it forwards the test's requests to the live
deployment at ``URL`` instead and re-records the cassettes the run uses (pytest-recording's
``--record-mode=rewrite``): a cassette's old lines are replaced at the first exchange of the run
and every later one is appended, by any xdist worker of the same run (the writer locks the file
and knows the run by xdist's ``testrunuid``), so tests sharing a cassette all end up in it.

Kept apart from :mod:`mocksandbox.pytest_plugin` so that importing the plugin stays cheap.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mocksandbox.recording.cassette import CassetteError, CassetteWriter
from mocksandbox.recording.forward import Forwarder
from mocksandbox.recording.recorder import Recorder
from mocksandbox.recording.replay import REPLAY_MODES, CassettePlayer

if TYPE_CHECKING:
    from mocksandbox.recording import CassetteHandler

MARKER = "mocksandbox_cassette"
RECORD_OPTION = "--mocksandbox-record"


class _RunCassettes:
    """What one pytest process keeps for the run: its id, writers by path, players, forwarders."""

    def __init__(self, config: pytest.Config) -> None:
        workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
        #: The same for every xdist worker of one run (xdist hands each the controller's id).
        self.run = str(workerinput["testrunuid"]) if workerinput else uuid.uuid4().hex
        self.writers: dict[Path, CassetteWriter] = {}
        self.forwarders: dict[str, Forwarder] = {}


_RUN = pytest.StashKey[_RunCassettes]()


def cassette_for(node: pytest.Item) -> CassetteHandler | None:
    """The handler a test's server uses for its ``mocksandbox_cassette`` marker (None without one)."""
    marker = node.get_closest_marker(MARKER)
    if marker is None:
        return None
    if not marker.args:
        raise pytest.UsageError(f"{node.nodeid}: {MARKER} needs the cassette's path")
    path = Path(node.path).parent / str(marker.args[0])
    mode = marker.kwargs.get("mode", "strict")
    if mode not in REPLAY_MODES:
        raise pytest.UsageError(f"{node.nodeid}: {MARKER} mode must be one of {', '.join(REPLAY_MODES)}")
    config = node.config
    run = config.stash.setdefault(_RUN, _RunCassettes(config))
    upstream = config.getoption(RECORD_OPTION, None)
    if upstream:
        writer = run.writers.setdefault(path.resolve(), CassetteWriter(path, run.run))
        forwarder = run.forwarders.setdefault(upstream, Forwarder(upstream))
        return Recorder(forwarder, writer, marker.kwargs.get("redact", ()))
    if not path.exists():
        pytest.fail(
            f"cassette {path} does not exist: record it against a live deployment with "
            f"pytest {RECORD_OPTION} URL",
            pytrace=False,
        )
    try:
        return CassettePlayer.load(path, mode, bool(marker.kwargs.get("timing", False)))
    except CassetteError as exc:
        pytest.fail(str(exc), pytrace=False)


def use_cassette(box: Any, node: pytest.Item) -> None:
    """Give ``box`` (the test's sandbox) the cassette its marker names, if any."""
    handler = cassette_for(node)
    if handler is None:
        return
    if not hasattr(box, "cassette"):
        pytest.fail(
            f"{MARKER} needs the in-process server: drop mocksandbox_workers for this test, or run "
            f"'mocksandbox serve --workers N --replay FILE' and point the test at it",
            pytrace=False,
        )
    box.cassette = handler
