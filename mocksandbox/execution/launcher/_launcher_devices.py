"""A relay's /dev for its runs (``build_dev``), made once by its world (``_launcher_world``) and bound
whole into each run's root: the harmless character devices, their usual links, a /dev/pts of the
relay's own.
"""

import os

from _launcher_syscalls import MS_BIND, MS_NOEXEC, MS_NOSUID, MS_RDONLY, MS_REMOUNT, Syscalls

#: The devices a run's /dev holds (name, major, minor): the harmless character devices.
_DEVICES = (
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
)
_DEV_LINKS = (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("ptmx", "pts/ptmx"),
)


def build_dev(calls: Syscalls, dev: str, users: bool) -> None:
    """The runs' /dev at ``dev``, made once: a small tmpfs of the harmless devices, their usual
    links and a /dev/pts of this relay's own, read-only (each run mounts a fresh /dev/shm on it).
    A run binds it whole, with one call (a bind per device cost each run a lookup in its new
    overlay and a mount of its own). ``users``: the relay is in a user namespace."""
    calls.mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for name, major, minor in _DEVICES:
        if users:
            # No device nodes in a user namespace (nor could a run open them on a file system
            # mounted there): the host's own, bound on these.
            os.close(os.open(dev + "/" + name, os.O_WRONLY | os.O_CREAT, 0o666))
            calls.mount("/dev/" + name, dev + "/" + name, None, MS_BIND)
        else:
            os.mknod(dev + "/" + name, 0o666 | 0o020000, os.makedev(major, minor))
            os.chmod(dev + "/" + name, 0o666)
    for name, target in _DEV_LINKS:
        os.symlink(target, dev + "/" + name)
    for name in ("shm", "pts", "mqueue"):
        os.mkdir(dev + "/" + name, 0o755)
    try:
        pts_options = "newinstance,ptmxmode=0666,mode=0620"
        calls.mount("devpts", dev + "/pts", "devpts", MS_NOSUID | MS_NOEXEC, pts_options)
    except OSError:
        pass  # no pseudo-terminals then (a kernel without devpts, or one that refuses it here)
    calls.mount(None, dev, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
