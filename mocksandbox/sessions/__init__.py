"""swedev sessions: the stateful sandbox behind ``/start_instance``, ``/process_action``,
``/postprocess`` and ``/compute_reward`` (verl's agentic SWE rollout).

* :mod:`~mocksandbox.sessions.instances`: SWE-bench rows plus repository snapshots, by ``instance_hash``;
* :mod:`~mocksandbox.sessions.actions`: the OpenHands function call (or ```diff block) in a message;
* :mod:`~mocksandbox.sessions.editor`: ``str_replace_editor`` with OpenHands' semantics;
* :mod:`~mocksandbox.sessions.isolation`, :mod:`~mocksandbox.sessions.paths`: ``/workspace`` and
  ``/tmp`` as each session sees them (a mount namespace, or path translation);
* :mod:`~mocksandbox.sessions.executor`: commands here, or on a SandboxFusion ``/run_code``;
* :mod:`~mocksandbox.sessions.reward`: SWE-bench scoring (F2P/P2P with the test patch);
* :mod:`~mocksandbox.sessions.store`: the SQLite records; :mod:`~mocksandbox.sessions.manager` ties them;
* :mod:`~mocksandbox.sessions.scripted`: actions with a known outcome, for client tests.
"""

from mocksandbox.sessions.errors import (
    BackendError,
    InstanceError,
    IsolationError,
    ScoringError,
    SessionEndedError,
    SessionError,
    SessionLimitError,
    StateDirError,
    UnknownInstanceError,
    UnknownSessionError,
)
from mocksandbox.sessions.instances import Instance, InstanceRegistry, instance_hash, load_instances
from mocksandbox.sessions.manager import SessionConfig, SessionManager

__all__ = [
    "BackendError",
    "Instance",
    "InstanceError",
    "InstanceRegistry",
    "IsolationError",
    "ScoringError",
    "SessionConfig",
    "SessionEndedError",
    "SessionError",
    "SessionLimitError",
    "SessionManager",
    "StateDirError",
    "UnknownInstanceError",
    "UnknownSessionError",
    "instance_hash",
    "load_instances",
]
