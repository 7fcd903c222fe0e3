"""The runtime dir: what SandboxFusion keeps in its ``runtime/``, where this server finds it.

Layout (made by ``mocksandbox runtime install``; every part is optional)::

    bin/                  first on PATH for every run: links and shims for names SandboxFusion's
                          commands use (``tsx``, ``tsc``; ``dmd`` on top of LDC; ``kotlin`` scripts)
    java/*.jar            javatuples, the JUnit console launcher, by SandboxFusion's file names
    node/                 package.json (jest's configuration), babel.config.js, node_modules
    go/                   go.mod, go.sum, main.go copied into Go runs; gopath/ for GOPATH mode
    python/venv/          the interpreter for user Python code, with the runtime's packages
    python/install.log    what pip or uv said while installing them
    tools/uv/             uv, where pip got it for the install (none on PATH or beside the server)
    lean/                 a Lake project with its packages (not installable from here)

Nothing here runs a command: this module only looks at files, so the engine can ask it per run.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from mocksandbox.execution.languages import LanguageSpec, java_classpath

#: Where Debian's ``golang-*-dev`` packages put their sources (a GOPATH tree).
GO_GOPATH_SYSTEM = "/usr/share/gocode"


def default_runtime_dir(environ: Mapping[str, str] | None = None) -> str:
    """``$XDG_DATA_HOME/mocksandbox/runtime``, by default ``~/.local/share/mocksandbox/runtime``."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "mocksandbox", "runtime")


def venv_version(venv: Path) -> tuple[int, int, int] | None:
    """The CPython version a venv was made on, from its ``pyvenv.cfg`` (nothing is started)."""
    try:
        text = (venv / "pyvenv.cfg").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        parts = value.strip().split(".")[:3]
        if key.strip() in ("version", "version_info") and len(parts) == 3 and all(map(str.isdigit, parts)):
            return int(parts[0]), int(parts[1]), int(parts[2])
    return None


class RuntimeDir:
    """One runtime dir, read-only: paths, what is present, and how a run's temp dir gets it."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser()

    def __repr__(self) -> str:
        return f"RuntimeDir({str(self.root)!r})"

    # -- paths ----------------------------------------------------------------------------------

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def node_dir(self) -> Path:
        return self.root / "node"

    @property
    def go_dir(self) -> Path:
        return self.root / "go"

    @property
    def gopath(self) -> Path:
        return self.go_dir / "gopath"

    @property
    def venv_dir(self) -> Path:
        return self.root / "python" / "venv"

    def path(self, relative: str) -> Path:
        return self.root / relative

    def has(self, relative: str) -> bool:
        # lexists: a link into node_modules/.bin counts even before it is followed.
        return os.path.lexists(self.root / relative)

    def python(self) -> str | None:
        """The runtime's interpreter for user Python code, if it has one."""
        candidate = self.venv_dir / "bin" / "python"
        return str(candidate) if candidate.exists() else None

    @property
    def python_stamp(self) -> Path:
        """What ``runtime install`` last installed in the venv: a header line, then requirements."""
        return self.venv_dir / "mocksandbox-requirements.txt"

    def python_profile(self) -> str | None:
        """The profile the venv was installed with (``default``, ``full``, ``custom``), if any."""
        try:
            with self.python_stamp.open() as stamp:
                first = stamp.readline()
        except OSError:
            return None
        match = re.match(r"# mocksandbox python runtime: profile ([^\s,]+)", first)
        return match[1] if match else None

    def python_version(self) -> tuple[int, int, int] | None:
        """The CPython version the venv was made on (nothing is started)."""
        return venv_version(self.venv_dir)

    # -- what runs see ---------------------------------------------------------------------------

    def environment(self, spec: LanguageSpec, base_env: Mapping[str, str]) -> dict[str, str]:
        """``base_env`` as runs of ``spec`` get it with this runtime: ``bin/`` first on PATH (when
        it exists) and, for Go, GOPATH mode over the runtime's Go libraries (when installed).
        Python runs' environment is left as it is."""
        if spec.python_env:
            # Python runs get the runtime through their interpreter (Settings.python) alone: their
            # environment stays the launcher's, which the process runner then need not send.
            return dict(base_env)
        env = dict(base_env)
        if self.bin_dir.is_dir():
            env["PATH"] = f"{self.bin_dir}:{env.get('PATH', os.defpath)}"
        if spec.name in ("go", "go_test") and self.gopath.is_dir():
            # GOPATH mode over the runtime's gopath and Debian's golang-*-dev sources: the Go
            # module proxy is out of reach here (SandboxFusion resolves its go.mod from a module
            # cache filled when its image is built). GOTOOLCHAIN=local: never download another Go.
            env.update(
                GO111MODULE="off",
                GOPATH=f"{self.gopath}:{GO_GOPATH_SYSTEM}",
                GOFLAGS="",
                GOTOOLCHAIN="local",
            )
        return env

    def prepare_workdir(self, spec: LanguageSpec, workdir: str, file_names: Iterable[str]) -> dict[str, str]:
        """Put what ``spec`` takes from the runtime into a run's temp dir (after the request's
        ``files`` were written) and return the placeholders that depend on it, shell-quoted.

        Raises ``OSError`` where SandboxFusion's runner would raise (a request file where a link
        goes): the engine answers that as SandboxError, as SandboxFusion does.
        """
        for entry in spec.workdir_entries:
            target = os.path.join(workdir, entry.name)
            source = self.root / entry.source
            if not os.path.lexists(source):
                continue  # not installed: the run fails as on a SandboxFusion without it
            if entry.how == "dir":
                os.makedirs(target)
            elif entry.how == "symlink":
                os.symlink(source, target)
            elif not os.path.lexists(target):
                # A copy, not a link: the program may write to it (SandboxFusion copies too).
                shutil.copyfile(source, target)
        placeholders: dict[str, str] = {}
        if "classpath" in spec.needs:
            placeholders["classpath"] = shlex.quote(java_classpath(spec.classpath, file_names))
        return placeholders
