"""``mocksandbox record``: a recording proxy in front of any SandboxFusion-compatible deployment.

Every request on every path (``/run_code``, ``/run_jupyter``, the dataset endpoints, swedev
sessions, anything else) is forwarded as it came; the client gets the upstream's status, headers
that matter and body bytes, and each answered exchange becomes one cassette line. It is served by
the mock's own server class (keep-alive, whole bodies, connection drops) behind the same host
check: a proxy to a code runner must not be reachable from another site's web page either.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from mocksandbox.recording.layer import forward_and_record, send
from mocksandbox.recording.recorder import Recorder
from mocksandbox.web.middleware import read_body_once

StartResponse = Callable[..., Any]


class RecordingProxy:
    """WSGI app: forward to ``recorder``'s upstream, record, answer as the upstream did."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        raw = read_body_once(environ)
        return send(forward_and_record(self.recorder, environ, raw), start_response)


def create_proxy_server(recorder: Recorder, host: str = "127.0.0.1", port: int = 0) -> Any:
    """A :class:`~mocksandbox.serving.single.MockServer` serving a :class:`RecordingProxy` (not started).

    Answers only requests for loopback names and ``host``, as ``mocksandbox serve`` does.
    """
    from mocksandbox.serving.single import MockServer
    from mocksandbox.web.host_guard import HostGuard, HostPolicy, split_host

    policy = HostPolicy(frozenset({split_host(host)}))
    return MockServer(host, port, HostGuard(RecordingProxy(recorder), policy))


class ProxyThread:
    """A recording proxy in a background thread (tests, the pytest plugin); port 0: a free one."""

    def __init__(self, recorder: Recorder, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = create_proxy_server(recorder, host, port)
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="mocksandbox-record", daemon=True
        )

    @property
    def url(self) -> str:
        return str(self.server.url)

    def start(self) -> ProxyThread:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self._thread.join(timeout=10)
        self.server.server_close()

    def __enter__(self) -> ProxyThread:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
