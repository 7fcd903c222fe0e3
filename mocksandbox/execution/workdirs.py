"""Per-run temp dirs, kept for the next run once a run leaves its own empty.

Each run works in a temp dir of its own under the temp root (``/tmp/tmpXXXXXXXX``, as
SandboxFusion's ``tempfile.TemporaryDirectory()``). On a journaling file system, making and
removing a directory is the dearest part of a short run: on this project's ext4 ``/tmp``, a
``mkdtemp`` and an ``rmdir`` cost about 0.2 ms of CPU and up to 3 ms of waiting per run, more than
forking the program. Most runs leave nothing in their dir but their code file, so once that is
removed the empty dir serves the next run: same name shape, same mode, still empty.

A dir is kept only if it is provably the one made here and untouched: the same inode, a real
directory (not a symlink a program put in its place), mode 0700, and empty. Anything else (a run
that left files, changed its dir or replaced it) is removed, or left alone if it is no longer ours
(a symlink is unlinked, never followed). Processes of a run are all killed before its dir comes
back (the runner's jail), so nothing of an old run can write into a dir another run now uses.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading

#: Empty dirs kept for later runs (about the most runs in flight at once); more are removed.
IDLE_WORKDIRS = 64


class WorkdirPool:
    """Temp dirs for runs under ``root`` (the system temp dir when ``None``). Thread-safe."""

    def __init__(self, root: str | None) -> None:
        self.root = root
        self._lock = threading.Lock()
        #: Idle dirs, each with the (device, inode) it was made with.
        self._idle: list[tuple[str, tuple[int, int]]] = []
        #: Dirs handed out, by path: their (device, inode) when made.
        self._identity: dict[str, tuple[int, int]] = {}
        self._closed = False

    def take(self) -> str:
        """An empty dir, mode 0700, for one run."""
        with self._lock:
            if self._idle:
                path, identity = self._idle.pop()
                self._identity[path] = identity
                return path
        path = tempfile.mkdtemp(dir=self.root)
        made = os.lstat(path)
        with self._lock:
            self._identity[path] = (made.st_dev, made.st_ino)
        return path

    def give_back(self, path: str, code_path: str | None) -> None:
        """The run in ``path`` is over (its processes are gone): remove its code file, and keep
        the dir for the next run if nothing else is in it; otherwise remove it."""
        with self._lock:
            identity = self._identity.pop(path, None)
        if code_path is not None:
            try:
                os.unlink(code_path)
            except OSError:
                pass  # the program removed it, or its dir is gone: checked below
        if identity is not None and self._reusable(path, identity):
            with self._lock:
                if not self._closed and len(self._idle) < IDLE_WORKDIRS:
                    self._idle.append((path, identity))
                    return
        remove_workdir(path)

    @staticmethod
    def _reusable(path: str, identity: tuple[int, int]) -> bool:
        try:
            now = os.lstat(path)
            if not (stat.S_ISDIR(now.st_mode) and stat.S_IMODE(now.st_mode) == 0o700):
                return False
            if (now.st_dev, now.st_ino) != identity or now.st_uid != os.geteuid():
                return False
            with os.scandir(path) as entries:
                return next(entries, None) is None
        except OSError:
            return False

    def close(self) -> None:
        """Remove the idle dirs; dirs still in use are removed when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for path, _ in idle:
            remove_workdir(path)


def remove_workdir(path: str) -> None:
    """Remove a run's dir and what is in it; a symlink put in its place is unlinked, never
    followed."""
    try:
        os.rmdir(path)  # the usual case: empty
        return
    except FileNotFoundError:
        return
    except OSError:
        pass
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            os.unlink(path)
            return
    except OSError:
        return
    shutil.rmtree(path, ignore_errors=True)
