"""The web console, ``GET /_mock/ui``: one static page (``web/console/``) and the few read-only
endpoints it needs beside the control API.

The page is a client of the ``/_mock/`` API like the fixtures and the CLI (DESIGN seam 7): it adds
faults, sets the cap and runs code with the same requests a test sends. What is here serves it:
the page and its two assets, the live feed (server-sent events, :mod:`mocksandbox.live`), one
journal entry with its bodies, the languages with their toolchains, and the fault rules' JSON
schema (the form is built from it, so it stays the YAML's schema). It is registered with the
control API only: ``--no-control-api`` removes it too.

No inline script or style, no third-party asset: the Content-Security-Policy allows only this
origin's own files, and the page works offline.
"""

from __future__ import annotations

from importlib import resources

from flask import Blueprint, Response, request

from mocksandbox.core import language_toolchains
from mocksandbox.faults import FaultSpec
from mocksandbox.live import LiveFeed
from mocksandbox.web.responses import json_response
from mocksandbox.web.sandbox_api import sandbox

blueprint = Blueprint("console", __name__, url_prefix="/_mock")
#: ``GET /``: SandboxFusion served its playground page there; the mock serves a link to the console.
root_blueprint = Blueprint("console_root", __name__)

#: The page's assets, by the name the page asks for.
ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
#: Only this origin's own files, no inline code, no framing, no form posts elsewhere.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
_ROOT_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>mocksandbox</title></head>
<body><h1>mocksandbox</h1>
<p>A SandboxFusion mock: <code>POST /run_code</code>, <code>GET /v1/ping</code>, the swedev and
dataset endpoints. See it and steer it in the <a href="/_mock/ui">web console</a>.</p>
</body></html>
"""


def _asset(name: str) -> bytes:
    return resources.files("mocksandbox.web").joinpath("console", name).read_bytes()


def _page(body: bytes | str, content_type: str) -> Response:
    return Response(body, content_type=content_type, headers=_SECURITY_HEADERS)


@root_blueprint.get("/")
def root() -> Response:
    return _page(_ROOT_PAGE, "text/html; charset=utf-8")


@blueprint.get("/ui")
def console_page() -> Response:
    return _page(_asset("index.html"), "text/html; charset=utf-8")


@blueprint.get("/ui/<name>")
def console_asset(name: str) -> Response:
    if name not in ASSETS:
        return json_response({"detail": "Not Found"}, status=404)
    return _page(_asset(name), ASSETS[name])


@blueprint.get("/events")
def events() -> Response:
    """The live feed; a reconnecting browser's ``Last-Event-ID`` resumes it."""
    feed = LiveFeed(sandbox().control, request.headers.get("Last-Event-ID"))
    return Response(
        iter(feed),
        content_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@blueprint.get("/journal/<int:entry_id>")
def journal_entry(entry_id: int) -> Response:
    entry = sandbox().journal_entry(entry_id)
    if entry is None:
        return json_response({"detail": f"no journal entry with id {entry_id}"}, status=404)
    return json_response(entry.to_dict())


@blueprint.get("/languages")
def languages() -> Response:
    return json_response({"languages": language_toolchains()})


@blueprint.get("/faults/schema")
def fault_schema() -> Response:
    return json_response(FaultSpec.model_json_schema())
