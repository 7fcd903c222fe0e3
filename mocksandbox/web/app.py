"""The Flask app factory. Views are thin; every error becomes JSON in one place."""

from __future__ import annotations

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from mocksandbox.core import MockSandbox
from mocksandbox.recording.layer import CassetteLayer
from mocksandbox.web import console, control_api, datasets_api, jupyter_api, sandbox_api, swedev_api
from mocksandbox.web.fast_path import RunCodeFastPath
from mocksandbox.web.host_guard import HostGuard, HostPolicy
from mocksandbox.web.middleware import MockLayer
from mocksandbox.web.responses import SANDBOXFUSION_BLUEPRINTS, json_response, server_error_response
from mocksandbox.web.validation import BodyParseError, RequestValidationError, UndecodableTextError


def create_app(sandbox: MockSandbox) -> Flask:
    """A WSGI app serving ``sandbox`` with SandboxFusion's routes and error shapes."""
    app = Flask("mocksandbox")
    app.extensions["mocksandbox"] = sandbox
    app.url_map.strict_slashes = True
    # FastAPI has no automatic OPTIONS (nor HEAD, see below): both answer 405 there.
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    app.register_blueprint(sandbox_api.blueprint)
    app.register_blueprint(jupyter_api.blueprint)
    app.register_blueprint(datasets_api.blueprint)
    swedev_api.register(app, sandbox.settings.control_api)
    if sandbox.settings.control_api:
        app.register_blueprint(control_api.blueprint)
        # The web console is a client of the control API: it comes and goes with it.
        app.register_blueprint(console.blueprint)
        app.register_blueprint(console.root_blueprint)
    # The busiest request, a well-formed POST /run_code, is answered below Flask (fast_path.py).
    app.wsgi_app = RunCodeFastPath(app.wsgi_app, sandbox)  # type: ignore[method-assign]
    # Replayed (or recorded-through) requests are answered here, before the fast path could run them.
    app.wsgi_app = CassetteLayer(app.wsgi_app, sandbox)  # type: ignore[method-assign]
    # Journal, cap and faults wrap everything, so that faulted and rejected answers are recorded.
    app.wsgi_app = MockLayer(app.wsgi_app, sandbox)  # type: ignore[method-assign]
    # Outermost: a request for another host or from another site's page reaches nothing.
    app.wsgi_app = HostGuard(app.wsgi_app, HostPolicy.from_settings(sandbox.settings))  # type: ignore[method-assign]

    @app.before_request
    def _no_implicit_head() -> None:
        rule = request.url_rule
        if request.method == "HEAD" and rule is not None:
            allowed = sorted((rule.methods or set()) - {"HEAD", "OPTIONS"})
            raise MethodNotAllowed(valid_methods=allowed)

    @app.errorhandler(RequestValidationError)
    def _validation_error(exc: RequestValidationError) -> Response:
        return json_response({"detail": exc.detail}, status=422)

    @app.errorhandler(BodyParseError)
    def _body_parse_error(exc: BodyParseError) -> Response:
        if isinstance(exc, UndecodableTextError) and request.blueprint in SANDBOXFUSION_BLUEPRINTS:
            # SandboxFusion's answer (its global handler's 500), not a bug: not recorded.
            return server_error_response(exc.error)
        return json_response({"detail": "There was an error parsing the body"}, status=400)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> Response:
        if exc.code == 404 and len(request.path) > 1 and request.path.endswith("/"):
            # Starlette's redirect_slashes: 307 to the same URL without the trailing slash.
            target = request.path.rstrip("/")
            try:
                app.url_map.bind("").match(target, method=request.method)
            except HTTPException:
                pass
            else:
                location = request.url.replace(request.path, target, 1)
                return Response(b"", status=307, headers={"Location": location})
        # FastAPI words these as Starlette's phrases: {"detail": "Not Found"}, "Method Not Allowed".
        headers = {}
        if exc.code == 405 and exc.valid_methods:  # type: ignore[attr-defined]
            headers["Allow"] = ", ".join(exc.valid_methods)  # type: ignore[attr-defined]
        return json_response({"detail": exc.name}, status=exc.code or 500, headers=headers)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        # SandboxFusion's global handler: 500 with the message and the traceback lines. The error
        # is also kept so that the test that caused it can re-raise it.
        sandbox.record_error(request.path, exc)
        return server_error_response(exc)

    return app
