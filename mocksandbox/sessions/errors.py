"""Domain errors of the swedev sessions; the web layer turns each into one HTTP answer."""

from __future__ import annotations


class SessionError(Exception):
    """Base class: something a client asked of the session layer that cannot be done."""


class InstanceError(SessionError):
    """An instance directory or JSONL row that cannot be used; the message says which and why."""


class UnknownInstanceError(SessionError):
    """No loaded instance has the ``instance_hash`` a client sent (HTTP 404)."""


class UnknownSessionError(SessionError):
    """No session has the ``sid`` a client sent (HTTP 404)."""


class SessionEndedError(SessionError):
    """An action for a session that was post-processed or reclaimed (HTTP 409)."""


class SessionLimitError(SessionError):
    """Starting one more session would exceed ``max_sessions`` live sessions (HTTP 503)."""


class StateDirError(SessionError):
    """The state dir cannot be used (unwritable, unsafe path, or held by another server)."""


class IsolationError(SessionError):
    """``session_isolation = "namespace"`` was asked for and this host cannot provide it."""
