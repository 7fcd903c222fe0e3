"""A direct path for the busiest request, ``POST /run_code``, below Flask.

Every reward and tool call of an RL rollout is a ``POST /run_code``; for ``print(1)``, Flask's
request context, routing and response objects cost about a tenth of the server's CPU per request.
This layer answers exactly the common case itself, with the same functions the view uses (body
reading, validation, the engine, SandboxFusion's encoding), and hands everything else to Flask
unchanged: other paths and methods, and any body that does not validate (Flask's error handlers
answer those, 422 and 400, as they always have). It sits inside the journal, cap and fault layer,
so those apply to it as to every request. ``tests/web/test_fast_path.py`` holds it to the bytes
the Flask view answers.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from typing import Any

from mocksandbox.core import MockSandbox
from mocksandbox.models import RunCodeRequest
from mocksandbox.web.responses import encode_json, server_error_body, unencodable_answer_body
from mocksandbox.web.validation import BodyParseError, RequestValidationError, read_body, validate_body

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class RunCodeFastPath:
    """WSGI layer answering well-formed ``POST /run_code`` requests without Flask."""

    def __init__(self, app: WSGIApp, sandbox: MockSandbox) -> None:
        self.app = app
        self.sandbox = sandbox
        #: Requests answered here rather than by Flask (approximate under threads: for tests).
        self.answered = 0

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/run_code" or environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        raw: bytes = environ["wsgi.input"].read()  # the outer layer made it the whole body
        box = self.sandbox
        try:
            body = read_body(raw, environ.get("CONTENT_TYPE") or None)
            request = validate_body(RunCodeRequest, body, box.settings.pydantic_docs_version)
        except (RequestValidationError, BodyParseError):
            environ["wsgi.input"] = io.BytesIO(raw)  # Flask answers it, with its handlers
            return self.app(environ, start_response)
        status = "200 OK"
        try:
            answer = box.engine.run_code(request).model_dump(mode="json")
            try:
                payload = encode_json(answer)
            except (ValueError, RecursionError) as exc:  # NaN echoed, a lone surrogate
                status, payload = "500 Internal Server Error", unencodable_answer_body(exc)
        except Exception as exc:  # as the app's global handler: recorded for the test to re-raise
            box.record_error("/run_code", exc)
            status, payload = "500 Internal Server Error", server_error_body(exc)
        self.answered += 1
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))])
        return [payload]
