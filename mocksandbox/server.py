"""Serve the app on a real socket: in a background thread (tests, fixtures) or in the foreground."""

from __future__ import annotations

import ipaddress
import socket
import struct
import threading
from typing import Any

from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler

from mocksandbox.core import MockSandbox
from mocksandbox.web import create_app
from mocksandbox.web.middleware import DropConnection

#: Pending connections the kernel holds for us; verl's client opens 32+ at once.
LISTEN_BACKLOG = 1024


class _RequestHandler(WSGIRequestHandler):
    """werkzeug's handler, logging request lines only when asked to, and able to drop a connection."""

    def run_wsgi(self) -> None:
        try:
            super().run_wsgi()
        except DropConnection as drop:
            self.close_connection = True
            if drop.mode == "reset":
                # Linger 0 makes close() send RST instead of FIN: the client sees a connection reset.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.rfile.close()
                self.connection.close()
            else:
                self.connection.shutdown(socket.SHUT_RDWR)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if getattr(self.server, "access_log", False):
            super().log_request(code, size)


class MockServer(ThreadedWSGIServer):
    """A thread per request (no cap on requests in flight) and a deep listen backlog."""

    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True

    def __init__(self, host: str, port: int, app: Any, access_log: bool = False) -> None:
        # Bind and listen ourselves: werkzeug would print and sys.exit() on a bind error, and we
        # want an OSError the caller can report (and our own backlog).
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(LISTEN_BACKLOG)
            super().__init__(host, port, app, handler=_RequestHandler, fd=listener.fileno())
        finally:
            listener.close()  # werkzeug holds its own duplicate of the descriptor
        self.access_log = access_log

    @property
    def url(self) -> str:
        host = str(self.server_address[0])
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}"


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServerThread:
    """A :class:`MockServer` for ``sandbox`` running in a daemon thread; port 0 picks a free port."""

    def __init__(self, sandbox: MockSandbox, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sandbox = sandbox
        self.server = MockServer(host, port, create_app(sandbox), access_log=sandbox.settings.access_log)
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="mocksandbox-server", daemon=True
        )

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> ServerThread:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting requests and close the socket."""
        self.server.shutdown()
        self._thread.join(timeout=10)
        self.server.server_close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
