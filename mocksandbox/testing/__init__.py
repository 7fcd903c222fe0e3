"""What the pytest plugin's fixtures are made of; :mod:`mocksandbox.pytest_plugin` is the page
that puts it together (options, hooks, fixtures).

- :mod:`~mocksandbox.testing.handle`: :class:`MockSandboxHandle`, what a test holds, and how a
  test's server is reset and shaped by its markers before it and checked after it.
- :mod:`~mocksandbox.testing.servers`: the servers behind the fixtures: the session's sandbox, the
  one started before collection, worker pools and Ray fleets, each made on first use.
- :mod:`~mocksandbox.testing.divergence_report`: where SandboxFusion would have answered a test's
  requests differently, on its report, as a failure where asked, and in the run's summary.

Importing it imports pytest and nothing of the server: the fixtures import that when they start one.
"""

from mocksandbox.testing.divergence_report import DIVERGENCE_PROPERTY
from mocksandbox.testing.handle import INPROCESS_BASE_URL, MockSandboxHandle

__all__ = ["DIVERGENCE_PROPERTY", "INPROCESS_BASE_URL", "MockSandboxHandle"]
