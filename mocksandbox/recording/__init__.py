"""Record a real deployment, replay it anywhere: cassettes of SandboxFusion exchanges.

* :mod:`~mocksandbox.recording.cassette`: the JSON Lines format, reading and (xdist-safe) writing.
* :mod:`~mocksandbox.recording.proxy`: ``mocksandbox record``, a recording proxy.
* :mod:`~mocksandbox.recording.replay` and :mod:`~mocksandbox.recording.layer`: ``serve --replay``.
* :mod:`~mocksandbox.recording.drift`: ``mocksandbox contract --cassette``, what changed since.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mocksandbox.recording.cassette import (
    CassetteError,
    CassetteWriter,
    Exchange,
    RecordedRequest,
    read_cassette,
)
from mocksandbox.recording.recorder import Recorder
from mocksandbox.recording.replay import CassetteMiss, CassettePlayer, ReplayMode

if TYPE_CHECKING:
    from mocksandbox.settings import Settings

#: What a sandbox's cassette layer holds: a player (replay), a recorder (record through), or nothing.
CassetteHandler = CassettePlayer | Recorder


def player_from_settings(settings: Settings) -> CassettePlayer | None:
    """The player ``serve --replay`` configures (``None`` without a cassette); raises
    :class:`CassetteError` when the cassette cannot be read."""
    if not settings.replay_file:
        return None
    return CassettePlayer.load(settings.replay_file, settings.replay_mode, settings.replay_timing)


__all__ = [
    "CassetteError",
    "CassetteHandler",
    "CassetteMiss",
    "CassettePlayer",
    "CassetteWriter",
    "Exchange",
    "RecordedRequest",
    "Recorder",
    "ReplayMode",
    "player_from_settings",
    "read_cassette",
]
