"""How a session is shown its repository at ``/workspace/...``: a world of its own where the server
runs programs in worlds (isolation ``lite``), else a private mount namespace per command where the
host allows it, else path translation (:mod:`mocksandbox.sessions.paths`).

In a world (``world``), each command runs as every ``/run_code`` program does under ``lite`` (its
own PID, network, IPC and UTS namespaces, the host read through a copy-on-write layer, secrets
hidden, fewer capabilities), with the session's ``workspace`` bound on ``/workspace`` and its
``tmp`` on ``/tmp``. The copy-on-write layer is the session's: what a command writes elsewhere
(``pip install``, ``/etc``) is there for the session's next commands, as in a swedev container,
and goes with the session. Scoring runs the tests in a world of their own too.

With a mount namespace, each ``execute_bash`` runs under ``unshare --mount`` with the session's
``workspace`` bind-mounted on ``/workspace`` and its ``tmp`` on ``/tmp``: every process sees exactly
the paths the prompt names, including paths written into files (a reproduction script that does
``sys.path.insert(0, "/workspace/...")`` works). That needs root, ``unshare``, and an (empty) mount
point ``/workspace`` on the host, which the server creates when it can. Nothing outside the command's
own namespace changes. Elsewhere, and for a remote backend, paths are translated textually.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mocksandbox.sessions.errors import IsolationError

Isolation = Literal["world", "namespace", "paths"]
IsolationSetting = Literal["auto", "world", "namespace", "paths"]

#: The mount point the agent's repositories appear under.
MOUNT_POINT = "/workspace"


def namespace_unavailable(tmp_root: str | None = None) -> str | None:
    """``None`` when commands can run in a private mount namespace here; else the reason why not.

    A real probe: ``unshare --mount`` with both bind mounts (a few milliseconds).
    """
    if os.geteuid() != 0:
        return "bind mounts need root"
    if shutil.which("unshare") is None:
        return "unshare(1) is not installed"
    if not os.path.isdir(MOUNT_POINT):
        try:
            os.mkdir(MOUNT_POINT, 0o755)
        except OSError as exc:
            return f"cannot create the mount point {MOUNT_POINT}: {exc.strerror}"
    with tempfile.TemporaryDirectory(dir=tmp_root) as work, tempfile.TemporaryDirectory(dir=tmp_root) as tmp:
        open(os.path.join(work, "probe"), "w").close()
        script = (
            f"mount --bind {work} {MOUNT_POINT} && mount --bind {tmp} /tmp && "
            f"test -e {MOUNT_POINT}/probe && touch /tmp/probe"
        )
        try:
            done = subprocess.run(
                ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script],
                capture_output=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"unshare failed: {exc}"
        if done.returncode != 0 or not os.path.exists(os.path.join(tmp, "probe")):
            message = done.stderr.decode("utf-8", "replace").strip() or f"exit status {done.returncode}"
            return f"unshare --mount failed: {message}"
    return None


@dataclass(frozen=True)
class RunWorld:
    """A session command's (or a scoring run's) world: its copy-on-write layer kept in ``layer``
    (``u``, and overlayfs' work dir ``w``), and the host dirs it works in, ``(host dir, where the
    command sees it)``."""

    layer: Path
    binds: tuple[tuple[str, str], ...]

    def spec(self) -> dict[str, Any]:
        """What the run's relay mounts (``CommandSpec.world``); the layer's dirs made if new."""
        upper, work = self.layer / "u", self.layer / "w"
        if not upper.is_dir():
            self.layer.mkdir(mode=0o700, exist_ok=True)
            upper.mkdir(mode=0o755, exist_ok=True)  # the run's "/": the host's mode
            work.mkdir(mode=0o700, exist_ok=True)
        return {"upper": str(upper), "work": str(work), "lowers": [], "binds": [list(b) for b in self.binds]}


#: What the banner says of a session in a world.
WORLD_DESCRIPTION = (
    f"a world per session, as /run_code's (its own files layer, PID, network, IPC and UTS namespaces; "
    f"{MOUNT_POINT} and /tmp bound)"
)


def choose_isolation(
    setting: IsolationSetting,
    remote: bool,
    tmp_root: str | None = None,
    world_probe: Callable[[], str | None] | None = None,
) -> tuple[Isolation, str]:
    """The isolation to use and why: ``world`` where the server makes worlds (``world_probe`` is
    given: it says why one cannot be made, or ``None``), else ``namespace`` where asked for or
    possible, else ``paths``."""
    if remote:
        return "paths", "commands run on a remote sandbox"
    if setting == "paths":
        return "paths", "as configured"
    why_not = "the server runs programs without worlds (isolation none)"
    if setting in ("auto", "world"):
        if world_probe is not None:
            why_not = world_probe() or ""
            if not why_not:
                return "world", WORLD_DESCRIPTION
        if setting == "world":
            raise IsolationError(f"session_isolation = world, but {why_not}")
    no_world = f"; no world: {why_not}" if setting == "auto" and world_probe is not None else ""
    reason = namespace_unavailable(tmp_root)
    if reason is None:
        binds = f"{MOUNT_POINT} and /tmp bind-mounted"
        return "namespace", f"private mount namespace per command ({binds}){no_world}"
    if setting == "namespace":
        raise IsolationError(f"session_isolation = namespace, but {reason}")
    return "paths", f"path translation ({reason}{no_world})"
