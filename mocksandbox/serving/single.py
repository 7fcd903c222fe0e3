"""One process serving the app on a real socket: in a background thread (tests, fixtures) or in
the foreground (``mocksandbox serve``, :func:`serve_single`)."""

from __future__ import annotations

import errno
import io
import ipaddress
import os
import queue
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from werkzeug.exceptions import InternalServerError
from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler

from mocksandbox.core import MockSandbox
from mocksandbox.serving import http_head
from mocksandbox.settings import Settings
from mocksandbox.web import create_app
from mocksandbox.web.middleware import DropConnection

#: Pending connections the kernel holds for us; verl's client opens 32+ at once.
LISTEN_BACKLOG = 1024
#: Requests with a body up to this size keep their connection open (the body is read whole before
#: the app runs); larger ones, chunked ones and HTTP/1.0 ones are answered with ``Connection: close``.
KEEP_ALIVE_BODY_LIMIT = 64 * 1024 * 1024


#: Up to how many bytes the first chunk of an answer is sent together with its head.
_JOINED_WRITE_LIMIT = 64 * 1024


class _RequestHandler(WSGIRequestHandler):
    """werkzeug's handler with HTTP/1.1 keep-alive, logging request lines only when asked to, and
    able to drop a connection.

    werkzeug ends every answer with ``Connection: close``: its handler cannot know whether the app
    left part of a request body unread (which would then be parsed as the next request), and after
    each answer it drains the socket for 10 ms. Here, an HTTP/1.1 request whose body has a known
    size is read whole before the app runs, so once the answer is out the connection sits at a
    request boundary and is kept, as SandboxFusion's uvicorn keeps it: a client with a session pays
    for one TCP connection and one server thread per connection instead of per request. A request
    that asks for ``Connection: close`` takes the same path (its body read whole, a body cut short
    never reaches the app) and is answered with ``Connection: close``. Other requests (chunked,
    HTTP/1.0, huge bodies) take werkzeug's own path.
    """

    #: A kept connection carries the head and the body of an answer in separate writes: with Nagle's
    #: algorithm the body would wait for the client's delayed ACK of the head (40 ms on Linux).
    disable_nagle_algorithm = True
    #: The last ``Date`` header made: (second, text). Replaced whole, so threads read it unlocked.
    _last_date: tuple[int, str] = (0, "")
    #: The request being served lost its client halfway through its body (set by run_wsgi).
    _cut_short = False

    def run_wsgi(self) -> None:
        try:
            self._cut_short = False
            body = self._read_whole_body()
            if body is None:
                super().run_wsgi()
            elif self._cut_short:
                return  # the client went away halfway through its body: nothing to answer
            else:
                self._run_wsgi_keeping_connection(body)
        except DropConnection as drop:
            self.close_connection = True
            if drop.mode == "reset":
                # Linger 0 makes close() send RST instead of FIN: the client sees a connection reset.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.rfile.close()
                self.connection.close()
            else:
                self.connection.shutdown(socket.SHUT_RDWR)

    def _read_whole_body(self) -> bytes | None:
        """The request body, if this request can keep its connection; otherwise ``None`` (and
        nothing read). A body cut short (the client left) is returned with ``_cut_short`` set and
        the connection marked for closing. (``close_connection`` may already be set: the client
        asked for ``Connection: close``, which changes nothing here but the answer's header.)"""
        if self.request_version != "HTTP/1.1" or self.command == "HEAD":
            return None  # (a HEAD answer must have no body: left to werkzeug, which closes)
        if "Transfer-Encoding" in self.headers:
            return None
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return None
        if not 0 <= length <= KEEP_ALIVE_BODY_LIMIT:
            return None
        if self.headers.get("Expect", "").lower().strip(" \t") == "100-continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = self.rfile.read(length) if length else b""
        if len(body) < length:
            self._cut_short = self.close_connection = True  # the client went away: no answer
        return body

    def _run_wsgi_keeping_connection(self, body: bytes) -> None:
        """Run the app for one request whose body is already read; the connection stays open
        unless the answer has no Content-Length (its end is then the connection's)."""
        self.environ = environ = self.make_environ()
        environ["wsgi.input"] = io.BytesIO(body)
        status: str | None = None
        headers: list[tuple[str, str]] = []
        headers_sent = False

        def write(data: bytes) -> None:
            nonlocal headers_sent
            assert status is not None, "write() before start_response"
            if not headers_sent:
                headers_sent = True
                code, _, reason = status.partition(" ")
                self.send_response(int(code), reason)
                for key, value in headers:
                    self.send_header(key, value)
                if self.close_connection or not any(key.lower() == "content-length" for key, _ in headers):
                    # Asked for by the client, or the answer's end is the connection's.
                    self.close_connection = True
                    self.send_header("Connection", "close")
                if len(data) <= _JOINED_WRITE_LIMIT:
                    # The head and a small first chunk (most answers whole) in one send: one
                    # system call, one segment. (http.server keeps the head in _headers_buffer
                    # until end_headers flushes it.)
                    head: list[bytes] = self.__dict__["_headers_buffer"]
                    head.append(b"\r\n")
                    data = b"".join(head) + data
                    head.clear()
                else:
                    self.end_headers()  # a large body is not copied to go with it
            if data:
                self.wfile.write(data)
                self.wfile.flush()

        def start_response(new_status: str, new_headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            nonlocal status, headers
            if exc_info is not None and headers_sent:
                raise exc_info[1].with_traceback(exc_info[2])
            status, headers = new_status, list(new_headers)
            return write

        def execute(app: Any) -> None:
            chunks: Iterable[bytes] = app(environ, start_response)
            try:
                for data in chunks:
                    write(data)
                if not headers_sent:
                    write(b"")
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()

        try:
            execute(self.server.app)
        except (ConnectionError, TimeoutError) as exc:
            self.close_connection = True
            self.connection_dropped(exc, environ)
        except Exception:
            # As werkzeug does: a 500 if nothing was sent yet, and the traceback in the log.
            self.close_connection = True
            if not headers_sent:
                try:
                    status, headers = None, []
                    execute(InternalServerError())
                except Exception:
                    pass
            self.server.log("error", f"Error on request:\n{traceback.format_exc()}")

    def parse_request(self) -> bool:
        if not http_head.parse_request(self):  # (http.server's, its plain headers parsed faster)
            return False
        if not getattr(self.server, "accepting_requests", True):
            # The server was closed while this connection was kept open: no answer, as a new
            # connection would get none. (Shutting the socket down for reading cannot promise
            # that alone: Linux still delivers data that arrives afterwards.)
            self.close_connection = True
            return False
        return True

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if getattr(self.server, "access_log", False):
            super().log_request(code, size)

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The ``Date`` header, formatted once a second rather than for every answer (the
        stdlib's ``email.utils.formatdate`` is a few percent of a short request's CPU)."""
        if timestamp is not None:
            return super().date_time_string(timestamp)
        second = int(time.time())
        cached = _RequestHandler._last_date
        if cached[0] != second:
            cached = (second, super().date_time_string(second))
            _RequestHandler._last_date = cached
        return cached[1]


class _ConnectionThreads:
    """The counts of a server's connection threads, under their lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Threads waiting for a connection (less the connections already handed to them).
        self._idle = 0
        #: Threads alive, serving or waiting.
        self._threads = 0

    @property
    def idle(self) -> int:
        """Threads waiting for a connection (less those already given one)."""
        return self._idle

    @property
    def threads(self) -> int:
        """Threads alive, serving or waiting."""
        return self._threads


class _HandlerThreads(_ConnectionThreads):
    """Threads that serve one connection each, reused: a connection is given to an idle thread if
    there is one, else to a new one (never a cap on connections at once, as a thread per
    connection). A client that opens a connection per request (verl's ``requests.post``) would
    otherwise pay for a thread's start and end on each: about 0.2 ms of the server's CPU, half of
    what such a request costs the HTTP layer. A thread idle for ``idle_s`` ends."""

    def __init__(self, serve: Any, idle_s: float = 30.0) -> None:
        super().__init__()
        self._serve_one = serve
        self._idle_s = idle_s
        self._queue: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()

    def serve(self, request: Any, client_address: Any) -> None:
        with self._lock:
            start = self._idle == 0
            if start:
                self._threads += 1
            else:
                self._idle -= 1
        self._queue.put((request, client_address))
        if start:
            threading.Thread(target=self._run, name="mocksandbox-connection", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                request, client_address = self._queue.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # (under the lock: no connection was counted on this one)
                        self._idle -= 1
                        self._threads -= 1
                        return
                continue  # a connection was queued for it meanwhile
            self._serve_one(request, client_address)
            with self._lock:
                self._idle += 1


class _Acceptors(_ConnectionThreads):
    """The threads of :meth:`MockServer.serve_by_acceptors`: each waits in ``accept``, serves the
    connection it took, and waits again (or ends, if ``max_idle`` others already wait)."""

    def __init__(self, server: MockServer, max_idle: int) -> None:
        super().__init__()
        self._server = server
        self._max_idle = max_idle

    def start(self) -> bool:
        """Start one more thread; ``False`` where none can be started now (the process budget, or
        memory, is spent): the threads alive serve on, one connection at a time each."""
        with self._lock:
            self._idle += 1
            self._threads += 1
        try:
            threading.Thread(target=self._run, name="mocksandbox-connection", daemon=True).start()
        except RuntimeError:  # "can't start new thread"
            with self._lock:
                self._idle -= 1
                self._threads -= 1
            return False
        return True

    def _run(self) -> None:
        server = self._server
        listener = server.socket
        # ``listener.accept()``, as socket.py makes it, but for the new socket's family and type:
        # those are asked of the listener, as enums, for each connection (about ten of a short
        # request's 330 Python calls); here, once, as numbers.
        family, kind, proto = int(listener.family), int(listener.type), listener.proto
        while True:
            try:
                fd, client_address = listener._accept()  # type: ignore[attr-defined]
                request = socket.socket(family, kind, proto, fileno=fd)
                if socket.getdefaulttimeout() is None and listener.gettimeout():
                    request.setblocking(True)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.05)  # out of descriptors or memory: let connections end first
                if server.accepting_requests and exc.errno not in (errno.EBADF, errno.EINVAL, errno.ENOTSOCK):
                    continue  # (ECONNABORTED: the client left before we took it)
                with self._lock:
                    self._idle -= 1
                    self._threads -= 1
                return  # the listener is shut down, or closed
            with self._lock:
                self._idle -= 1
                last = self._idle == 0
            if last:
                self.start()
            server.track_connection(request)
            server.process_request_thread(request, client_address)
            with self._lock:
                if self._idle >= self._max_idle:
                    self._threads -= 1
                    return
                self._idle += 1


class MockServer(ThreadedWSGIServer):
    """A thread per connection at once (no cap on requests in flight; threads are reused) and a
    deep listen backlog."""

    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True

    def __init__(
        self, host: str, port: int, app: Any, access_log: bool = False, listener_fd: int | None = None
    ) -> None:
        # Bind and listen ourselves: werkzeug would print and sys.exit() on a bind error, and we
        # want an OSError the caller can report (and our own backlog).
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        #: The threads that serve connections, kept for the next ones (see _HandlerThreads).
        self._handlers = _HandlerThreads(self.process_request_thread)
        #: False once the server is closed (werkzeug's own set-up calls server_close() first).
        self.accepting_requests = False
        #: Set to stop serving from the main thread itself (a signal handler: see
        #: :func:`~mocksandbox.serving.banner.stop_on_signals`), where :meth:`shutdown` would wait
        #: for the loop it runs in; the loops see it within a poll (:meth:`serve_forever`) or
        #: before their next ``accept`` (:meth:`accept_forever`).
        self.stop_requested = threading.Event()
        #: The threads that accept and serve, once :meth:`serve_by_acceptors` started them.
        self._acceptors: _Acceptors | None = None
        if listener_fd is not None:  # a socket another process bound (mocksandbox.serving.workers)
            super().__init__(host, port, app, handler=_RequestHandler, fd=listener_fd)
        else:
            listener = bind_listener(host, port)
            try:
                super().__init__(host, port, app, handler=_RequestHandler, fd=listener.fileno())
            finally:
                listener.close()  # werkzeug holds its own duplicate of the descriptor
        self.access_log = access_log
        self.accepting_requests = True

    @classmethod
    def from_listener(cls, fd: int, app: Any, access_log: bool = False) -> MockServer:
        """A server accepting from a listening socket it inherited (one of several workers)."""
        probe = socket.socket(fileno=os.dup(fd))
        try:
            host, port = probe.getsockname()[:2]
        finally:
            probe.close()
        return cls(host, port, app, access_log, listener_fd=fd)

    def accept_forever(self) -> None:
        """Serve with a blocking ``accept`` instead of :meth:`serve_forever`'s poll, until a signal
        handler raises. For processes that share one listening socket (``serve --workers``): the
        kernel wakes one waiting ``accept`` per connection, in turn, where a poll wakes every
        process for each one and all but one find nothing (each wake-up also takes its GIL)."""
        listener = self.socket
        listener.setblocking(True)  # (the flag is the shared socket's: every worker accepts so)
        while self.accepting_requests and not self.stop_requested.is_set():
            try:
                request, client_address = listener.accept()
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno in (errno.EBADF, errno.EINVAL, errno.ENOTSOCK):
                    return  # the listener is closed, or shut down
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.05)  # out of descriptors or memory: let connections end first
                continue  # (ECONNABORTED: the client left before we took it)
            try:
                self.process_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
                self.shutdown_request(request)

    def serve_by_acceptors(self, max_idle: int = 32) -> None:
        """Serve until :attr:`stop_requested` is set (``serve``'s signal handlers set it and raise
        :class:`KeyboardInterrupt` here), each connection accepted by the thread that then serves
        it. Threads wait in a blocking ``accept`` on the listener (the kernel wakes one a
        connection); the one that takes a connection when no other is left waiting starts another,
        so that connections at once are never capped, as with a thread per connection. Saves the
        hand-off from an accepting loop to a serving thread (:meth:`serve_forever`): two thread
        wake-ups and the loop's Python per connection, about 1.7% of a verl-like run's CPU (the
        whole process tree's, new connection per request, concurrency 16). A thread done with its
        connection waits for another unless ``max_idle`` already do.

        For a listener of this process's own (``serve``): :meth:`server_close` then shuts it down,
        which wakes the waiting threads. Returns once stopped; the caller closes the server."""
        self.socket.setblocking(True)
        self._acceptors = _Acceptors(self, max_idle)
        if not self._acceptors.start():
            raise RuntimeError("cannot start a thread to serve connections")
        self.stop_requested.wait()

    def service_actions(self) -> None:
        """Called by :meth:`serve_forever`'s loop after each poll: stop as the signal would have."""
        if self.stop_requested.is_set():
            raise KeyboardInterrupt  # (werkzeug's serve_forever ends quietly on it)

    # Kept-alive connections outlive requests: they are tracked so that closing the server also
    # ends them (after their answer in progress, if any), as it did when every answer closed them.

    def process_request(self, request: Any, client_address: Any) -> None:
        self.track_connection(request)
        self._handlers.serve(request, client_address)

    def track_connection(self, request: Any) -> None:
        """Count ``request`` (an accepted connection) among those :meth:`server_close` ends."""
        with self._connections_lock:
            self._connections.add(request)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def server_close(self) -> None:
        if self._acceptors is not None:
            try:  # (a closed listener would not wake them: a shut down one fails their accept)
                self.socket.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        super().server_close()
        with self._connections_lock:
            self.accepting_requests = False
            connections = list(self._connections)
        for connection in connections:
            try:
                # The handler waiting for a next request reads end-of-file and leaves; one still
                # answering can finish writing its answer.
                connection.shutdown(socket.SHUT_RD)
            except OSError:
                pass

    @property
    def url(self) -> str:
        host = str(self.server_address[0])
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}"


def bind_listener(host: str, port: int, backlog: int = LISTEN_BACKLOG) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one); an ``OSError`` if it cannot
    be bound (werkzeug would print and exit instead)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(backlog)
    except OSError:
        listener.close()
        raise
    return listener


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


@contextmanager
def running_server(settings: Settings, host: str = "127.0.0.1", port: int = 0) -> Iterator[ServerThread]:
    """A new :class:`MockSandbox` built from ``settings``, served in a background thread (port 0: a
    free one); the server is stopped and the sandbox closed afterwards."""
    sandbox = MockSandbox.create(settings)
    try:
        with ServerThread(sandbox, host, port) as server:
            yield server
    finally:
        sandbox.close()


def serve_single(settings: Settings, verbose: bool = False) -> int:
    """``mocksandbox serve``: one process serving ``settings`` in the foreground until Ctrl-C or
    SIGTERM; the exit status (2: it could not start, with the reason on stderr). ``verbose``: the
    banner says everything (``serve --verbose``), not a screenful."""
    from mocksandbox import __version__
    from mocksandbox.datasets import DatasetLoadError
    from mocksandbox.execution.engine import IsolationError
    from mocksandbox.execution.launcher import LauncherError
    from mocksandbox.faults import FaultError
    from mocksandbox.serving.banner import sandbox_banner, stop_on_signals
    from mocksandbox.sessions import SessionError

    try:
        sandbox = MockSandbox.create(settings)
    except (FaultError, SessionError, IsolationError, LauncherError) as exc:
        print(f"mocksandbox: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"mocksandbox: cannot set up execution: {exc}", file=sys.stderr)
        return 2
    except DatasetLoadError as exc:
        print(f"mocksandbox: {exc}", file=sys.stderr)
        return 2
    try:
        banner = sandbox_banner(sandbox, settings).lines(verbose)
    except SessionError as exc:
        sandbox.close()
        print(f"mocksandbox: {exc}", file=sys.stderr)
        return 2
    try:
        server = MockServer(settings.host, settings.port, create_app(sandbox), access_log=settings.access_log)
    except OSError as exc:
        sandbox.close()
        print(
            f"mocksandbox: cannot listen on {settings.host}:{settings.port}: {exc.strerror}", file=sys.stderr
        )
        return 2
    print(f"mocksandbox {__version__} serving on {server.url}", flush=True)
    for line in banner:
        print(line, flush=True)
    # Also when the signal comes right after the banner's last line.
    server.stop_requested = stop_on_signals()
    try:
        print("  press Ctrl-C to stop", flush=True)
        server.serve_by_acceptors()  # (the signal handlers raise KeyboardInterrupt in it)
    except KeyboardInterrupt:
        pass
    finally:
        print("\nmocksandbox: stopping", flush=True)
        server.server_close()
        sandbox.close()
    return 0
