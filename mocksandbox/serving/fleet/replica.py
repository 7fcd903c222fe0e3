"""One replica of the fleet: the mock's Flask app in a Ray Serve replica, over the fleet's state.

A replica is a whole :class:`~mocksandbox.core.MockSandbox` (engine, launcher, sessions, datasets)
whose control state is the fleet's (:class:`~mocksandbox.control.ray_state.RayControlState`), so
the outermost layer (journal, cap, faults) counts every request once, fleet-wide. The WSGI app is
served to Serve's proxies through a2wsgi: Serve speaks ASGI, and the app stays the one
``mocksandbox serve`` runs, byte for byte. Each request runs on one of a2wsgi's threads, as it
would on one of werkzeug's.

Two things a replica adds to the app, both between the journal layer and the rest (so a request
is journaled, capped and faulted once, by the replica the proxy chose):

* :class:`SessionRouter`: a swedev session lives in the state dir of the replica that started it.
  A request for it that reaches another replica is sent on, over HTTP, to the *peer port* of the
  replica holding it now (the control actor's session index says which); the answer comes back
  as this replica's answer.
* The peer port: a small werkzeug server on the node's address, answering only requests that
  carry the fleet's token: forwarded session requests (below the journal layer: already
  journaled), the local part of a reset, and this replica's session list.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import requests
from ray import serve

from mocksandbox.control.ray_state import RayControlState
from mocksandbox.core import MockSandbox
from mocksandbox.sessions import SessionError
from mocksandbox.sessions.manager import SessionManager
from mocksandbox.settings import Settings
from mocksandbox.web import create_app
from mocksandbox.web.host_guard import HostGuard
from mocksandbox.web.middleware import DropConnection, MockLayer, read_body_once

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

#: The header that carries the fleet's token on peer requests.
TOKEN_HEADER = "X-Mocksandbox-Fleet-Token"
#: Session requests whose JSON body names the session with ``sid``.
SESSION_POSTS = ("/process_action", "/postprocess", "/compute_reward")
_SESSION_GET = re.compile(r"^/_mock/sessions/([^/]+)(/patch)?$")
#: Peer calls other than forwarded requests (a reset, a session list) answer within this.
PEER_TIMEOUT_S = 120.0


def _json_answer(
    start_response: StartResponse, status: int, content: Any, headers: dict[str, str] | None = None
) -> list[bytes]:
    body = json.dumps(content).encode()
    reasons = {200: "OK", 403: "Forbidden", 404: "Not Found", 502: "Bad Gateway", 503: "Service Unavailable"}
    start_response(
        f"{status} {reasons.get(status, 'Error')}",
        [("Content-Type", "application/json"), ("Content-Length", str(len(body))), *(headers or {}).items()],
    )
    return [body]


def _session_key(raw: bytes) -> str | None:
    """The canonical sid a session request's body names (as the session layer spells it), or
    ``None`` (the app then answers 422 or 404 itself)."""
    try:
        body = json.loads(raw)
        return SessionManager._key(body["sid"])
    except (ValueError, KeyError, TypeError, AttributeError, SessionError):
        return None


class FleetSandbox(MockSandbox):
    """A replica's sandbox: a reset also resets the other replicas' own parts (their sessions,
    Jupyter counts, cassettes); the control state is reset once, for all."""

    #: Calls ``POST /_fleet/reset`` on every other live replica (set by the replica).
    peer_reset: Callable[[], None] | None = None

    def reset(self) -> None:
        super().reset()
        if self.peer_reset is not None:
            self.peer_reset()

    def reset_local(self) -> None:
        """:meth:`MockSandbox.reset` without the control state (another replica reset that)."""
        self.sessions.reset()
        self.cassette = self._baseline_cassette
        self.jupyter.reset()


class SessionRouter:
    """WSGI layer sending a session's requests to the replica that holds the session."""

    def __init__(self, app: WSGIApp, replica: FleetReplica) -> None:
        self.app = app
        self.replica = replica

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "")
        if method == "POST" and path in SESSION_POSTS:
            raw = read_body_once(environ)
            return self._route(_session_key(raw), environ, start_response, raw)
        if method == "GET":
            found = _SESSION_GET.match(path)
            if found is not None:
                try:
                    sid = SessionManager._key(found.group(1))
                except SessionError:
                    sid = None
                return self._route(sid, environ, start_response, b"")
            if path == "/_mock/sessions":
                return _json_answer(start_response, 200, self.replica.all_sessions())
        if method == "POST" and path == "/start_instance":
            return self._start(environ, start_response)
        return self.app(environ, start_response)

    def _route(
        self, sid: str | None, environ: dict[str, Any], start_response: StartResponse, raw: bytes
    ) -> Iterable[bytes]:
        route = None if sid is None else self.replica.control.route_session(sid)
        if route is None or route[1] == self.replica.key:
            return self.app(environ, start_response)  # here, or unknown anywhere (404 here)
        slot, owner, url = route
        if owner is None or url is None:
            detail = (
                f"session {sid} lives in the state dir of replica slot {slot}, whose replica is down; "
                "Serve is restarting it: retry shortly"
            )
            return _json_answer(start_response, 503, {"detail": detail}, {"Retry-After": "1"})
        return self.replica.forward(url, environ, raw, start_response)

    def _start(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        captured: list[str] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            captured.append(status)
            return start_response(status, headers, exc_info)

        iterable = self.app(environ, capture)
        try:
            body = b"".join(iterable)
        finally:
            close = getattr(iterable, "close", None)
            if close is not None:
                close()
        if captured and captured[0].startswith("200"):
            try:
                sid = SessionManager._key(json.loads(body)["sid"])
            except (ValueError, KeyError, TypeError, SessionError):
                sid = None
            if sid is not None:
                self.replica.control.place_session(sid)
        return [body]


def _drop_as_502(app: WSGIApp) -> WSGIApp:
    """A ``reset``/``close`` fault cannot reach the client's connection through Serve's proxy (it
    holds that connection): the replica answers 502 instead, saying so."""

    def wrapped(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        try:
            return app(environ, start_response)
        except DropConnection as drop:
            detail = f"connection {drop.mode} (fault): behind Ray Serve's proxy it is answered with 502"
            return _json_answer(start_response, 502, {"detail": detail})

    return wrapped


def _node_address(node_id: str) -> str:
    """The address Ray knows this node by (127.0.0.1 on a loopback cluster): where peers reach it."""
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return str(node["NodeManagerAddress"])
    return str(ray.util.get_node_ip_address())


@dataclass(frozen=True)
class MemberConfig:
    """What every member of one fleet is started with (the same for all of them)."""

    #: The fleet's settings (fault files already read into ``faults``).
    settings_json: str
    #: The control actor's name and Ray namespace.
    control_name: str
    namespace: str
    #: The secret peers present to each other when they forward a session's request.
    token: str
    #: Where each member's slot dir (``slot-N``) is made.
    state_root: str
    #: Whether the slot dirs stay when the fleet stops (a configured ``state_dir``).
    keep_state: bool
    #: Requests a member serves at once.
    threads: int
    #: The address peers meet on (``None``: the node's address as Ray knows it).
    peer_host: str | None = None


class FleetReplica:
    """The body of the Serve deployment (wrapped by ``serve.ingress`` in :mod:`mocksandbox.serving.fleet`)."""

    def __init__(self, config: MemberConfig, key: str | None = None) -> None:
        from mocksandbox.serving.single import MockServer

        context = ray.get_runtime_context()
        self.token = config.token
        self.threads = config.threads
        self.node_id: str = context.get_node_id()
        self.key = key or f"replica-{serve.get_replica_context().replica_id.unique_id}"
        self.control = RayControlState.attach(config.control_name, config.namespace, replica=self.key)
        self._keep_state = config.keep_state
        self._session = requests.Session()
        self._session.trust_env = False  # peers are reached directly, never through a proxy
        self._stopped = False
        # The peer port comes first: the control actor records where this replica answers.
        self._peer_target: WSGIApp | None = None
        self.peer_server = MockServer(config.peer_host or _node_address(self.node_id), 0, self._peer_app)
        self.slot = self.control.register(
            context.current_actor, self.node_id, self.peer_server.url, context.get_actor_id() or ""
        )
        self.state_dir = Path(config.state_root) / f"slot-{self.slot}"
        settings = Settings.model_validate_json(config.settings_json).replace(state_dir=str(self.state_dir))
        try:
            box = FleetSandbox.create(settings, control=self.control, worker_name=self.key)
        except BaseException:
            self.peer_server.server_close()
            self.control.deregister()
            raise
        assert isinstance(box, FleetSandbox)
        box.peer_reset = self._reset_peers
        self.sandbox = box
        app = create_app(box)
        # create_app's layers: HostGuard(MockLayer(rest)). The router goes between the journal
        # layer and the rest; forwarded requests enter below the journal layer (already journaled).
        guard = app.wsgi_app
        if not isinstance(guard, HostGuard) or not isinstance(guard.app, MockLayer):
            raise RuntimeError(
                "mocksandbox.serving.fleet: create_app's layers are not HostGuard(MockLayer(...))"
            )
        layer = guard.app
        self._peer_target = layer.app
        layer.app = SessionRouter(layer.app, self)
        #: The app as a server of its own serves it (faults may drop the connection).
        self.own_app = app
        self.wsgi = _drop_as_502(app)
        threading.Thread(
            target=self.peer_server.serve_forever, name="mocksandbox-fleet-peer", daemon=True
        ).start()

    def __serve_build_asgi_app__(self) -> Any:
        from a2wsgi import WSGIMiddleware

        return WSGIMiddleware(self.wsgi, workers=self.threads)  # type: ignore[arg-type]

    # -- peers -----------------------------------------------------------------------------------

    def _peer_app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        given = environ.get("HTTP_" + TOKEN_HEADER.upper().replace("-", "_"), "")
        if not secrets.compare_digest(given, self.token) or self._peer_target is None:
            return _json_answer(start_response, 403, {"detail": "not a member of this fleet"})
        path = environ.get("PATH_INFO", "")
        if path.startswith("/_fleet/forward/"):
            environ["PATH_INFO"] = path[len("/_fleet/forward") :]
            return self._peer_target(environ, start_response)
        if path == "/_fleet/reset":
            self.sandbox.reset_local()
            return _json_answer(start_response, 200, {"reset": True})
        if path == "/_fleet/sessions":
            return _json_answer(start_response, 200, self.sandbox.sessions.list_sessions())
        return _json_answer(start_response, 404, {"detail": "Not Found"})

    def _peers(self) -> list[dict[str, Any]]:
        return [r for r in self.control.replicas() if r["alive"] and r["key"] != self.key]

    def _peer_call(self, method: str, url: str, **options: Any) -> requests.Response:
        headers = {TOKEN_HEADER: self.token, **options.pop("headers", {})}
        return self._session.request(method, url, headers=headers, timeout=PEER_TIMEOUT_S, **options)

    def _reset_peers(self) -> None:
        for peer in self._peers():
            try:
                self._peer_call("POST", f"{peer['url']}/_fleet/reset").raise_for_status()
            except requests.RequestException as exc:
                if self._alive(peer["key"]):  # one that died meanwhile has no sessions to reset
                    raise RuntimeError(f"resetting {peer['key']} failed: {exc}") from None

    def _alive(self, key: str) -> bool:
        return any(r["key"] == key and r["alive"] for r in self.control.replicas())

    def forward(
        self, url: str, environ: dict[str, Any], raw: bytes, start_response: StartResponse
    ) -> Iterable[bytes]:
        """Send a session's request to the replica holding it; its answer, as this one's."""
        method = environ.get("REQUEST_METHOD", "GET")
        target = f"{url}/_fleet/forward{environ.get('PATH_INFO', '')}"
        headers = {"Content-Type": environ.get("CONTENT_TYPE") or "application/json"}
        timeout = self.sandbox.settings.max_timeout_s + 60
        try:
            reply = self._session.request(
                method,
                target,
                data=raw,
                headers={TOKEN_HEADER: self.token, **headers},
                timeout=timeout,
            )
        except requests.ConnectionError as exc:
            # It died a moment ago (the control actor has not heard yet): Serve is replacing it.
            detail = f"the replica holding this session is not answering ({url}): retry shortly ({exc})"
            return _json_answer(start_response, 503, {"detail": detail}, {"Retry-After": "1"})
        except requests.RequestException as exc:
            detail = f"the replica holding this session did not answer ({url}): {exc}"
            return _json_answer(start_response, 502, {"detail": detail})
        passed = [(k, v) for k, v in reply.headers.items() if k.lower() in ("content-type", "retry-after")]
        body = reply.content
        start_response(f"{reply.status_code} {reply.reason}", [*passed, ("Content-Length", str(len(body)))])
        return [body]

    def all_sessions(self) -> dict[str, Any]:
        """``GET /_mock/sessions`` for the fleet: every live replica's sessions together."""
        merged = self.sandbox.sessions.list_sessions()
        state_dirs = [merged.get("state_dir")]
        for peer in self._peers():
            try:
                listed = self._peer_call("GET", f"{peer['url']}/_fleet/sessions").json()
            except (requests.RequestException, ValueError):
                continue  # died meanwhile: its sessions come back with its successor
            for group in ("live", "finished", "leaked"):
                merged.setdefault(group, []).extend(listed.get(group, []))
            state_dirs.append(listed.get("state_dir"))
        merged["counts"] = {g: len(merged.get(g, [])) for g in ("live", "finished", "leaked")}
        merged["state_dirs"] = [d for d in state_dirs if d]
        return merged

    # -- shutdown --------------------------------------------------------------------------------

    def __del__(self) -> None:
        """Serve stops the replica (scale-down, ``serve.delete``): release everything it holds."""
        # (Also called on Ray's actor class object, which has none of this: hence getattr.)
        if getattr(self, "_stopped", True) or not hasattr(self, "sandbox"):
            return
        self._stopped = True
        self.peer_server.shutdown()
        self.peer_server.server_close()
        try:
            self.control.deregister()
        except Exception:
            pass  # the fleet is being torn down with its control actor
        self.control.close()
        self.sandbox.close()
        if not self._keep_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)


class NodeServer(FleetReplica):
    """A fleet member that serves HTTP itself (``deploy(ingress="node")``): the mock's own server
    on the fleet's port, in a Ray actor pinned to its node. A request that enters a node is served
    there, on the request path of ``mocksandbox serve``: no Serve proxy hop, no ASGI bridge (about
    10 ms of CPU per request together, measured by ``benchmarks/bench_fleet.py``). Members on one
    node (or on a simulated cluster, one machine) share the port (``SO_REUSEPORT``; the kernel
    spreads connections over them). Ray places it, and restarts it on its node when it dies."""

    def __init__(self, config: MemberConfig, host: str, port: int) -> None:
        import socket

        from mocksandbox.serving.single import LISTEN_BACKLOG, MockServer

        # The port first: a member that cannot bind it fails before it registers or builds anything.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            listener.bind((host, port))
            listener.listen(LISTEN_BACKLOG)
            super().__init__(config, key=f"node-{secrets.token_hex(6)}")
            self.http = MockServer(
                host, port, self.own_app, self.sandbox.settings.access_log, listener_fd=listener.fileno()
            )
        finally:
            listener.close()  # the server holds its own duplicate
        threading.Thread(target=self.http.serve_forever, name="mocksandbox-fleet-http", daemon=True).start()

    def ready(self) -> str:
        """Where this member answers."""
        return str(self.http.url)

    def stop(self) -> None:
        """Stop answering and release everything (before the actor is killed)."""
        self.http.shutdown()
        self.http.server_close()
        self.__del__()
