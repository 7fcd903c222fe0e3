"""Per-run temp dirs, kept for the next run once a run leaves its own empty.

Each run works in a temp dir of its own under the temp root (``/tmp/tmpXXXXXXXX``, as
SandboxFusion's ``tempfile.TemporaryDirectory()``). On a journaling file system, making and
removing a directory is the dearest part of a short run: on this project's ext4 ``/tmp``, a
``mkdtemp`` and an ``rmdir`` cost about 0.2 ms of CPU and up to 3 ms of waiting per run, more than
forking the program. Most runs leave nothing in their dir but their code file, so once that is
removed the empty dir serves the next run: same mode, still empty, under a fresh random name (a
rename costs a tenth of a make-and-remove), so that every run sees a new ``tmpXXXXXXXX`` as it
would on SandboxFusion. The rename never replaces anything: ``renameat2(RENAME_NOREPLACE)``; where
that call is missing (not Linux, an old libc), dirs are made fresh every time.

A dir is kept only if it is provably the one made here and untouched: the same inode, a real
directory (not a symlink a program put in its place), mode 0700, and empty. Anything else (a run
that left files, changed its dir or replaced it) is removed, or left alone if it is no longer ours
(a symlink is unlinked, never followed). Processes of a run are all killed before its dir comes
back (the runner's jail), so nothing of an old run can write into a dir another run now uses.
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable

#: Empty dirs kept for later runs (about the most runs in flight at once); more are removed.
IDLE_WORKDIRS = 64
#: Names as ``tempfile.mkdtemp`` makes them: ``tmp`` and eight of these.
_NAME_CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789_"
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1


def _find_rename_noreplace() -> Callable[[str, str], None] | None:
    """``rename(old, new)`` that fails with ``FileExistsError`` rather than replace ``new`` (a plain
    rename silently replaces an empty dir of that name: someone else's fresh temp dir); ``None``
    where the C library lacks ``renameat2``."""
    try:
        # The process's own symbols, libc's among them (find_library would run ldconfig).
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int

    def rename_noreplace(old: str, new: str) -> None:
        if renameat2(_AT_FDCWD, os.fsencode(old), _AT_FDCWD, os.fsencode(new), _RENAME_NOREPLACE):
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), old, None, new)

    return rename_noreplace


_rename_noreplace = _find_rename_noreplace()


class WorkdirPool:
    """Temp dirs for runs under ``root`` (the system temp dir when ``None``). Thread-safe. With
    ``reuse`` off, every dir is made fresh and removed when given back."""

    def __init__(self, root: str | None, reuse: bool = True) -> None:
        self.root = root
        self._lock = threading.Lock()
        #: Idle dirs, each with the (device, inode) it was made with.
        self._idle: list[tuple[str, tuple[int, int]]] = []
        #: Dirs handed out, by path: their (device, inode) when made.
        self._identity: dict[str, tuple[int, int]] = {}
        self._closed = False
        #: Dirs are kept only where they can be renamed without replacing anything (and not where
        #: a dir may still be seen after its run under its old name: a relay's kept root).
        self._reuse = reuse and _rename_noreplace is not None

    def take(self) -> str:
        """An empty dir, mode 0700, under a name no run has seen, for one run."""
        with self._lock:
            idle = self._idle.pop() if self._idle else None
        if idle is not None:
            renamed = self._renamed(idle[0])
            if renamed is not None:
                with self._lock:
                    self._identity[renamed] = idle[1]
                return renamed
            remove_workdir(idle[0])
        path = make_temp_dir(self.root)
        if self._reuse:  # (what it was made as, to know it when it comes back)
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
        if identity is not None and self._reuse and self._reusable(path, identity):
            with self._lock:
                if not self._closed and len(self._idle) < IDLE_WORKDIRS:
                    self._idle.append((path, identity))
                    return
        remove_workdir(path)

    def _renamed(self, path: str) -> str | None:
        """``path`` moved to a fresh ``tmpXXXXXXXX`` name beside it, or ``None`` if it cannot be."""
        rename = _rename_noreplace
        if rename is None:
            return None
        parent = os.path.dirname(path)
        for _ in range(8):  # a name taken is retried, as mkdtemp does
            fresh = os.path.join(parent, temp_name())
            try:
                rename(path, fresh)
            except FileExistsError:
                continue
            except OSError as error:
                if error.errno in (errno.EINVAL, errno.ENOSYS):  # no RENAME_NOREPLACE here
                    self._reuse = False
                return None
            return fresh
        return None

    @staticmethod
    def _reusable(path: str, identity: tuple[int, int]) -> bool:
        try:
            now = os.lstat(path)
            if not (stat.S_ISDIR(now.st_mode) and stat.S_IMODE(now.st_mode) == 0o700):
                return False
            if (now.st_dev, now.st_ino) != identity or now.st_uid != os.geteuid():
                return False
            if now.st_gid != os.getegid():
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


def temp_name(suffix: str = "") -> str:
    """A fresh name as ``tempfile`` makes them: ``tmp``, eight random characters, ``suffix``.
    (``random``'s own generator, which a forked worker reseeds: not its parent's names.)"""
    return "tmp" + "".join(random.choices(_NAME_CHARACTERS, k=8)) + suffix


def make_temp_dir(parent: str | None) -> str:
    """``tempfile.mkdtemp(dir=parent)`` (a fresh ``tmpXXXXXXXX``, mode 0700) for the hot path:
    the same names and mode, without ``tempfile``'s work around them (a tenth of a run's make
    and remove of its dir)."""
    parent = os.path.abspath(parent if parent is not None else tempfile.gettempdir())
    for _ in range(tempfile.TMP_MAX):
        path = os.path.join(parent, temp_name())
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, "No usable temporary directory name found", parent)


def make_temp_file(parent: str, suffix: str) -> tuple[int, str]:
    """``tempfile.mkstemp(suffix=suffix, dir=parent)`` for the hot path: a new file
    ``tmpXXXXXXXX<suffix>``, mode 0600, opened for writing; its descriptor and path."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(tempfile.TMP_MAX):
        path = os.path.join(parent, temp_name(suffix))
        try:
            return os.open(path, flags, 0o600), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "No usable temporary file name found", parent)


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
