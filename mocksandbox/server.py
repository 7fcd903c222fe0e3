"""Kept for imports written before serving became one package: the one-process server now lives in
:mod:`mocksandbox.serving.single` (see :mod:`mocksandbox.serving` for the three shapes)."""

from mocksandbox.serving.single import MockServer, ServerThread, bind_listener, is_loopback, running_server

__all__ = ["MockServer", "ServerThread", "bind_listener", "is_loopback", "running_server"]
