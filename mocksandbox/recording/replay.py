"""Replay: answer requests that match a recorded one from the cassette.

Three modes decide what happens to the others, and to requests this host could run itself:

``strict``
    Only recordings answer. A request that matches none gets a 404 (as WireMock answers an
    unmatched request) whose ``detail`` names the nearest recorded request and what differs; the
    same message is kept as a server error, so the pytest fixture fails the test that sent it.
``fallback``
    Recordings answer what they match; the rest runs here.
``prefer-local``
    Hybrid by language: a request in a language this host has a toolchain for runs here even if it
    was recorded; one in a language it lacks is replayed (and is a miss, as in ``strict``, when no
    recording matches: running it here could only answer "command not found"). Requests without a
    language behave as in ``fallback``.

Several recordings of one request are replayed in order (the first request gets the first
recording, and so on; once all are used, the last repeats). The turn is counted by the control
state, so the order holds across worker processes and restarts from the first after a reset.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mocksandbox.recording.cassette import Exchange, RecordedRequest, read_cassette
from mocksandbox.recording.matching import nearest, request_view, view_key

ReplayMode = Literal["strict", "fallback", "prefer-local"]
REPLAY_MODES: tuple[ReplayMode, ...] = ("strict", "fallback", "prefer-local")


class CassetteMiss(AssertionError):
    """A request no recording matches where one must (``strict``, or ``prefer-local`` for a
    language this host lacks). The message names the nearest recorded request and the differences."""


@dataclass(frozen=True)
class Replay:
    """Answer from one of these recordings (in recorded order), counted under ``key``."""

    key: str
    exchanges: tuple[Exchange, ...]

    @property
    def labels(self) -> list[str]:
        return [exchange.source or f"recording {n}" for n, exchange in enumerate(self.exchanges, start=1)]


@dataclass(frozen=True)
class Miss:
    """Answer nothing from the cassette and nothing here: say why."""

    message: str


def has_toolchain(language: str) -> bool:
    """Whether this host can really run ``language`` (its toolchain binary is on PATH)."""
    from mocksandbox.execution.languages import TOOLCHAIN_BINARIES

    if language in ("python", "pytest"):
        return True  # the configured interpreter runs them
    binary = TOOLCHAIN_BINARIES.get(language)
    return binary is not None and shutil.which(binary) is not None


def request_language(request: RecordedRequest) -> str | None:
    """The language a request runs: ``language`` of ``/run_code``, ``config.language`` of ``/submit``."""
    language = request.json_field("language")
    if isinstance(language, str):
        return language
    config = request.json_field("config")
    if isinstance(config, dict) and isinstance(config.get("language"), str):
        return str(config["language"])
    return None


class CassettePlayer:
    """The recordings of one cassette, indexed by the request as the sandbox sees it."""

    def __init__(
        self,
        exchanges: Sequence[Exchange],
        mode: ReplayMode = "strict",
        timing: bool = False,
        name: str = "cassette",
        can_run_here: Callable[[str], bool] = has_toolchain,
    ) -> None:
        if mode not in REPLAY_MODES:
            raise ValueError(f"replay mode must be one of {', '.join(REPLAY_MODES)}, not {mode!r}")
        self.mode = mode
        #: Hold each replayed answer until its recorded duration has passed.
        self.timing = timing
        self.name = name
        self._can_run_here = can_run_here
        #: Fields some recording had redacted: left out of matching on both sides.
        self.redact = frozenset(field for exchange in exchanges for field in exchange.redacted)
        self._by_key: dict[str, list[Exchange]] = {}
        self._views: dict[str, tuple[str, dict[str, Any]]] = {}
        for exchange in exchanges:
            view = request_view(exchange.request, self.redact)
            key = view_key(view)
            self._by_key.setdefault(key, []).append(exchange)
            self._views.setdefault(key, (exchange.source, view))
        self.size = len(exchanges)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], mode: ReplayMode = "strict", timing: bool = False
    ) -> CassettePlayer:
        """A player for the cassette at ``path``
        (:class:`~mocksandbox.recording.cassette.CassetteError` if it cannot be read)."""
        return cls(read_cassette(path), mode, timing, name=str(path))

    def decide(self, request: RecordedRequest) -> Replay | Miss | None:
        """How to answer ``request``: from recordings, with a miss, or (``None``) by running it here."""
        view = request_view(request, self.redact)
        key = view_key(view)
        recorded = self._by_key.get(key)
        if self.mode == "prefer-local":
            language = request_language(request)
            if language is not None and self._can_run_here(language):
                return None
            if recorded:
                return Replay(key, tuple(recorded))
            if language is not None:
                return Miss(self._miss_message(request, view, f"this host has no toolchain for {language}"))
            return None
        if recorded:
            return Replay(key, tuple(recorded))
        if self.mode == "fallback":
            return None
        return Miss(self._miss_message(request, view))

    def _miss_message(self, request: RecordedRequest, view: dict[str, Any], reason: str = "") -> str:
        because = f" and {reason}" if reason else ""
        head = (
            f"mocksandbox replay ({self.mode}): no recording in {self.name} matches "
            f"{request.describe()}{because} ({self.size} recordings)."
        )
        found = nearest(view, ((key, recorded_view) for key, (_, recorded_view) in self._views.items()))
        if found is None:
            return head + " The cassette is empty."
        key, diffs = found
        recorded = self._by_key[key][0]
        lines = [head, f"Nearest: {recorded.source} {recorded.request.describe()}, which differs in:"]
        lines += [f"  {diff.describe()}" for diff in diffs] or ["  (nothing that matching compares)"]
        return "\n".join(lines)
