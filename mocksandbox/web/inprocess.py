"""In-process mode: ``requests`` calls for a base URL answered by the app, with no socket.

Built on the ``responses`` library, so it reaches only ``requests`` in this process.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import requests
import responses

from mocksandbox.core import MockSandbox
from mocksandbox.web.app import create_app
from mocksandbox.web.middleware import DropConnection

_METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")


@contextmanager
def route_requests_to(sandbox: MockSandbox, base_url: str) -> Iterator[responses.RequestsMock]:
    """While active, ``requests`` calls under ``base_url`` are served by ``sandbox``'s app."""
    client = create_app(sandbox).test_client()
    base = base_url.rstrip("/")

    def answer(request: requests.PreparedRequest) -> tuple[int, dict[str, str], bytes]:
        url = str(request.url)
        path = url[len(base) :] or "/"
        body: Any = request.body
        if isinstance(body, str):
            body = body.encode()
        try:
            reply = client.open(
                path,
                method=str(request.method),
                data=body or b"",
                headers={k: v for k, v in request.headers.items() if k.lower() != "content-length"},
            )
        except DropConnection as drop:
            raise requests.ConnectionError(f"mocksandbox dropped the connection ({drop.mode})") from None
        headers = {k: v for k, v in reply.headers.items() if k.lower() != "content-length"}
        return reply.status_code, headers, reply.get_data()

    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        pattern = re.compile(re.escape(base) + r"(/.*)?$")
        for method in _METHODS:
            mock.add_callback(method, pattern, callback=answer)
        yield mock
