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


class BackendError(SessionError):
    """``--swedev-backend URL`` cannot run the tests: it does not answer its ping, or the chosen
    interpreter, or that interpreter's pytest, does not run there. The text is one line."""


class ScoringError(SessionError):
    """A scoring run whose tests could not run at all (HTTP 500): no FAIL_TO_PASS or PASS_TO_PASS
    test reported a result, and not because of the model's patch (pytest missing, a sandbox failure,
    tests that cannot be collected even at the base state)."""
