"""Which optional part needs which extra, and one-line messages when one is not installed.

The base install serves ``/run_code``, the swedev sessions and the datasets, and carries the
pytest plugin. The rest is in extras (``pip install 'mocksandbox[NAME]'``):

========== ======================================== ==========================================
extra      brings                                   for
========== ======================================== ==========================================
contract   pytest, hypothesis                       ``mocksandbox contract`` (the shipped suite)
jupyter    jupyter_client, ipykernel (pyzmq)        ``POST /run_jupyter``
stress     rich, matplotlib                         ``mocksandbox stress`` (table, ``--plot``)
ray        ray                                      ``--mode ray``, ``pool_mode: ray``
fleet      ray[serve], a2wsgi                       ``serve --ray`` (:mod:`mocksandbox.serving.fleet`)
docker     docker                                   ``mocksandbox contract --docker``
runtime    numpy, pandas, scipy, sympy              programs sent to ``/run_code``
all        every one of the above
========== ======================================== ==========================================
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

#: The extra that installs each optional top-level module.
EXTRA_OF_MODULE: dict[str, str] = {
    "pytest": "contract",
    "_pytest": "contract",
    "pluggy": "contract",
    "hypothesis": "contract",
    "jupyter_client": "jupyter",
    "jupyter_core": "jupyter",
    "ipykernel": "jupyter",
    "zmq": "jupyter",
    "rich": "stress",
    "matplotlib": "stress",
    "ray": "ray",
    "a2wsgi": "fleet",
    "starlette": "fleet",
    "uvicorn": "fleet",
    "docker": "docker",
}

#: What ``/run_jupyter`` needs in the server (jupyter_client speaks to kernels over zmq) and in the
#: interpreter kernels run with (``--python``).
JUPYTER_SERVER_MODULES = ("jupyter_client", "zmq")
JUPYTER_KERNEL_MODULES = ("ipykernel",)


class MissingExtraError(Exception):
    """An optional part was asked for whose extra is not installed; the text is one line."""

    def __init__(self, what: str, module: str, extra: str) -> None:
        super().__init__(f"{what} needs {module}: pip install 'mocksandbox[{extra}]'")
        self.what = what
        self.module = module
        self.extra = extra


def is_installed(module: str) -> bool:
    """Whether ``module`` can be imported here (found without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(what: str, *modules: str) -> None:
    """Raise :class:`MissingExtraError` for the first of ``modules`` that is not installed."""
    for module in modules:
        if not is_installed(module):
            raise MissingExtraError(what, module, EXTRA_OF_MODULE.get(module, "all"))


def missing_extra_message(what: str, exc: ModuleNotFoundError) -> str | None:
    """The one-line message for an import of an optional module that failed, or ``None`` when the
    module is not one an extra provides (a real error, to be raised as it is)."""
    name = (exc.name or "").partition(".")[0]
    extra = EXTRA_OF_MODULE.get(name)
    if extra is None:
        return None
    return str(MissingExtraError(what, name, extra))


#: Interpreters other than this one that were seen to have ipykernel (a negative answer is not kept:
#: it may be installed while the server runs).
_KERNEL_PYTHONS_OK: set[str] = set()


def _can_import_ipykernel(python: str) -> bool:
    if python in _KERNEL_PYTHONS_OK:
        return True
    code = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('ipykernel') else 1)"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if done.returncode == 0:
        _KERNEL_PYTHONS_OK.add(python)
    return done.returncode == 0


def jupyter_missing(python: str) -> str | None:
    """Why ``/run_jupyter`` cannot run here (one line naming the extra), or ``None`` when it can."""
    hint = "pip install 'mocksandbox[jupyter]'"
    for module in JUPYTER_SERVER_MODULES:
        if not is_installed(module):
            return f"/run_jupyter needs jupyter_client and ipykernel, and {module} is not installed: {hint}"
    # Not realpath: two venvs' interpreters are links to one binary, with different site-packages.
    same = os.path.abspath(python) == os.path.abspath(sys.executable)
    if same and not is_installed("ipykernel"):
        return f"/run_jupyter needs jupyter_client and ipykernel, and ipykernel is not installed: {hint}"
    if not same and not _can_import_ipykernel(python):
        return (
            f"/run_jupyter needs ipykernel in the kernels' interpreter {python}, which cannot import it: "
            f"{python} -m pip install ipykernel"
        )
    return None
