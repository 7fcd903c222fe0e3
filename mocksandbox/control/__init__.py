"""The control state every server process shares (see :mod:`mocksandbox.control.state`)."""

from mocksandbox.control.state import (
    Admission,
    CapacityPolicy,
    ControlState,
    IncomingRequest,
    LocalControlState,
    ServerError,
)

__all__ = [
    "Admission",
    "CapacityPolicy",
    "ControlState",
    "IncomingRequest",
    "LocalControlState",
    "ServerError",
]
