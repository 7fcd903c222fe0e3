"""The HTTP layer: a Flask app factory and thin blueprints over :class:`mocksandbox.core.MockSandbox`."""

from mocksandbox.web.app import create_app

__all__ = ["create_app"]
