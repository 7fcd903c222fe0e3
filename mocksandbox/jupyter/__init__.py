"""``/run_jupyter`` on real IPython kernels (jupyter_client + ipykernel, the ``jupyter`` extra):
a pool of kernels started ahead of time, each used by one request and then killed."""

from mocksandbox.jupyter.models import CellRunResult, RunJupyterRequest, RunJupyterResponse
from mocksandbox.jupyter.service import JupyterService

__all__ = ["CellRunResult", "JupyterService", "RunJupyterRequest", "RunJupyterResponse"]
