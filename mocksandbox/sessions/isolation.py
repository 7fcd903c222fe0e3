"""How a session is shown its repository at ``/workspace/...``: a private mount namespace per
command where the host allows it, else path translation (:mod:`mocksandbox.sessions.paths`).

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
from typing import Literal

from mocksandbox.sessions.errors import IsolationError

Isolation = Literal["namespace", "paths"]
IsolationSetting = Literal["auto", "namespace", "paths"]

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


def choose_isolation(
    setting: IsolationSetting, remote: bool, tmp_root: str | None = None
) -> tuple[Isolation, str]:
    """The isolation to use and why: ``namespace`` where asked for or possible, else ``paths``."""
    if remote:
        return "paths", "commands run on a remote sandbox"
    if setting == "paths":
        return "paths", "as configured"
    reason = namespace_unavailable(tmp_root)
    if reason is None:
        return "namespace", f"private mount namespace per command ({MOUNT_POINT} and /tmp bind-mounted)"
    if setting == "namespace":
        raise IsolationError(f"session_isolation = namespace, but {reason}")
    return "paths", f"path translation ({reason})"
