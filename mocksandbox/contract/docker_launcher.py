"""Start the official SandboxFusion image with the docker SDK, for the contract suite to check.

The client is injected (``client_factory``) so that the launcher is tested with a fake; the real
one is ``docker.from_env``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import requests

from mocksandbox.extras import MissingExtraError, require

DEFAULT_IMAGE = "volcengine/sandbox-fusion:server-20241204"
CONTAINER_PORT = 8080


class NoDockerEngine(RuntimeError):
    """No Docker engine is reachable (the client exists but cannot talk to a daemon)."""


def default_client_factory() -> Any:
    require("'mocksandbox contract --docker'", "docker")  # one line naming the extra, not a skip
    import docker  # type: ignore[import-untyped]  # optional extra: mocksandbox[docker]

    return docker.from_env()


@contextmanager
def running_image(
    image: str = DEFAULT_IMAGE,
    client_factory: Callable[[], Any] = default_client_factory,
    ready_timeout: float = 300.0,
    poll: Callable[[str], bool] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[str]:
    """Run ``image`` publishing its port on 127.0.0.1, wait for ``/v1/ping``, yield the URL, remove it."""
    try:
        client = client_factory()
        client.ping()
    except MissingExtraError:
        raise
    except Exception as exc:  # docker raises DockerException, or ImportError without the extra
        raise NoDockerEngine(f"no Docker engine is reachable: {exc}") from None
    container = client.containers.run(
        image, detach=True, ports={f"{CONTAINER_PORT}/tcp": ("127.0.0.1", None)}, remove=False
    )
    try:
        container.reload()
        bindings = container.attrs["NetworkSettings"]["Ports"][f"{CONTAINER_PORT}/tcp"]
        url = f"http://127.0.0.1:{bindings[0]['HostPort']}"
        is_ready = poll or _pong
        deadline = time.monotonic() + ready_timeout
        while not is_ready(url):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{image} did not answer /v1/ping within {ready_timeout:.0f} s")
            sleep(1.0)
        yield url
    finally:
        try:
            container.remove(force=True)
        except Exception:
            pass  # already gone


def _pong(url: str) -> bool:
    try:
        reply = requests.get(url + "/v1/ping", timeout=5)
        return reply.status_code == 200 and reply.json() == "pong"
    except (requests.RequestException, ValueError):
        return False
