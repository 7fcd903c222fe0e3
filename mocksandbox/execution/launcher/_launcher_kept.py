"""A relay's root kept from run to run (:class:`KeptRoot`), for the runs that touch nothing but
their own dir: one overlay mounted for many runs, instead of one mounted and torn down per run.

Its upper layer lives on the runs' tmpfs (``<runs root>/kept-*``), locked while its relay lives:
the server removes a ``kept-*`` nobody holds the lock of (see ``mocksandbox/execution/world.py``).
"""

import fcntl as _fcntl
import os
import time

from _launcher_syscalls import MS_BIND


class KeptRoot:
    """A relay's root kept from run to run, for the runs that touch nothing but their own dir.

    Mounting a new overlay for each run (and tearing it down) is most of what a world costs its
    relay. A run that only reads the image and writes in its own dir (most of a reward pipeline's:
    a program and its tests, no ``fetch_files``, no files put outside its dir; the server says
    which in ``world["keep"]``) leaves its root as it found it. So the relay keeps such a root: an
    overlay with an upper layer of its own (``<runs root>/kept-*``) over the mask and the host, and
    each run's dir, which the server made on the runs' tmpfs, bound into it at the run's path.
    Once the run's processes are gone and its exit is said, before the status pipe closes (which
    the server waits for), the relay removes the run's dir from the tmpfs (the server never hands
    the dir's name or inode to another run); once the answer is on its way, it unmounts the dir
    and removes its mount point (:meth:`give_back`): a later run finds nothing of an earlier one.
    After the answer, the root is kept only if nothing changed while the run ran in its upper
    layer's dirs on the way to the runs' dirs (the root of the layer, ``/tmp`` in it) or in its
    /dev/shm: their entries, or their own mode, owner or extended attributes.
    Anything a run writes, deletes or changes outside its dir shows there first (what it changes
    anywhere in the image is copied up, under a new entry of the layer's root or of a dir on the
    way; the mount point below is covered by the run's dir), and the root then goes, as a run's
    root always went before. inotify watches on those dirs, made at the root's first run, say so:
    one read after each run, where looking at each dir cost a relay's every run a tenth of a
    millisecond. A kept root serves for at most ``max_age_s`` seconds (the setting
    ``kept_root_max_age_s``: a lower layer, the host, may change under it, and its new files are
    then seen within that time) and :data:`MAX_RUNS` runs (a mount each); where no watch can be had
    (inotify's limits), one run.
    """

    MAX_RUNS = 1000

    def __init__(self, world, runs_dir: str, max_age_s: float = 1.0) -> None:
        self.world = world
        self.max_age_s = max_age_s
        #: The inotify descriptor watching what runs must leave as they found it (see
        #: :meth:`take`), from the first run on; ``None`` before, or where none could be had.
        self.changes: int | None = None
        name = os.urandom(6).hex()
        # Made under another name, locked, then named kept-*: the server removes a kept-* whose
        # lock nobody holds (its relay was killed from outside and could not drop it), and must
        # never find one not locked yet. The lock is held for the relay's life (a forked program
        # closes its copy: World.enter).
        building = f"{runs_dir}/.kept-{name}"
        os.mkdir(building, 0o700)
        try:
            self.lock = os.open(building + "/lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            _fcntl.flock(self.lock, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
            self.base = f"{runs_dir}/kept-{name}"
            os.rename(building, self.base)
        except OSError:
            remove_tree(building)
            raise
        try:
            os.mkdir(self.base + "/u", 0o755)
            os.mkdir(self.base + "/w", 0o700)
            self.upper = self.base + "/u"
            self.root = world.scratch + "/kept"
            world.mount_overlay(self.root, [], self.upper, self.base + "/w", {})
        except OSError:
            self._remove()
            raise
        self.shm = self.root + "/dev/shm"
        self.born = time.monotonic()
        self.runs = 0
        #: Whether it may serve a run after this one (not where it has no watch).
        self.lasts = True
        #: The current run's dir (its path in the run's view), while it is bound here.
        self.cwd: str | None = None
        #: The current run's dir on the runs' tmpfs, and whether it was removed after the run.
        self.cwd_host = ""
        self.run_dir_gone = False

    def serves(self) -> bool:
        """Whether it may serve another run (young enough, not too many runs yet)."""
        return self.lasts and self.runs < self.MAX_RUNS and time.monotonic() - self.born < self.max_age_s

    def take(self, cwd: str, cwd_host: str) -> None:
        """Bind the run's dir ``cwd_host`` (on the runs' tmpfs) at ``cwd`` in this root; a
        ``FileExistsError`` if an earlier run's mount point has that name."""
        target = self.root + cwd
        first = self.runs == 0
        if first:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            self.world.give_way(self.root, cwd)  # (where programs join the runs' user namespace)
        os.mkdir(target, 0o700)  # (the first run's copies up the dirs on the way)
        if first:
            # What the upper layer holds now is what every later run must leave, but for one
            # more mount point in the runs' parent dir for each run (this relay's own change,
            # dropped from the watch's queue below). The runs of a root share that parent dir (the
            # server's temp dir, as runs see it); a run's dir elsewhere would copy its own
            # parents up, which the watch sees.
            path, watched = self.upper, []
            for part in os.path.dirname(cwd).split("/"):
                if part:
                    watched.append(path)
                    path += "/" + part
            try:
                self.changes = self.world.calls.watch_changes([*watched, path, self.shm])
            except OSError:
                self.lasts = False  # (it cannot tell whether a run left it as it was)
        elif self.changes is not None:
            # What the queue holds now is the mkdir's: the last run left nothing (give_back), and
            # since then only this relay has been at work.
            self.changed()
        self.cwd = cwd
        self.cwd_host = cwd_host
        self.run_dir_gone = False
        self.runs += 1
        self.world.calls.mount(cwd_host, target, None, MS_BIND)

    def remove_run_dir(self, code_file: "str | None") -> bool:
        """Once the run's processes are gone, before its relay closes the status pipe: its dir
        removed from the runs' tmpfs (where the server made it, and where the server, once the
        pipe closes, expects it gone). ``code_file``: the program's file (its path in the run's
        view). Whether the dir is gone. Its mount goes after the answer (:meth:`give_back`)."""
        path = self.cwd_host
        if code_file is not None and self.cwd is not None and code_file.startswith(self.cwd + "/"):
            try:
                os.unlink(path + code_file[len(self.cwd) :])
            except OSError:
                pass
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            pass
        try:
            remove_tree(path)
        except Exception:
            return False
        return not os.path.lexists(path)

    def give_back(self) -> bool:
        """Once the run's answer is on its way: whether the root is as the run found it, and,
        if so, the run's dir taken out of it (its mount, then its mount point), so that no later
        run finds anything of it: not its name in ``/tmp`` or in the mount table, nor the mode,
        owner or extended attributes the run gave its dir (a dead dir left bound showed them).
        The unmount waits for an RCU grace period (tens of microseconds here), which the server
        spends sending the answer; the mount point's removal is this relay's own change, whose
        event the next :meth:`take` drains with its ``mkdir``'s."""
        assert self.cwd is not None
        cwd, self.cwd = self.cwd, None
        if not (self.run_dir_gone and self.changes is not None and not self.changed()):
            return False
        target = self.root + cwd
        try:
            self.world.calls.umount(target)
            os.rmdir(target)
        except OSError:
            return False  # (the root goes, and the run's mount with it)
        return True

    def changed(self) -> bool:
        """Whether the watched dirs changed since the last call (their events are read and
        dropped): any event at all says so (a lost one too: the queue overflowed)."""
        assert self.changes is not None
        seen = False
        while True:
            try:
                if not os.read(self.changes, 4096):  # (a run's events: a few, if any)
                    return True
            except BlockingIOError:
                return seen
            except OSError:
                return True
            seen = True

    def drop(self) -> None:
        """Unmount it (its run's dir too, if bound) and remove its upper layer."""
        try:
            self.world.calls.umount(self.root)
        except OSError:
            pass
        self._remove()

    def _remove(self) -> None:
        if self.changes is not None:
            os.close(self.changes)
            self.changes = None
        remove_tree(self.base)
        try:
            os.close(self.lock)  # (after: the server removes no dir while it is locked)
        except OSError:
            pass


def remove_tree(path: str) -> None:
    """``rm -rf path`` (the relay imports no shutil)."""
    try:
        entries = list(os.scandir(path))
    except NotADirectoryError:
        os.unlink(path)
        return
    except OSError:
        return
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False):
                os.unlink(entry.path)
                continue
            # Most are empty (a kept root's runs' mount points, hundreds of them): one call each.
            os.rmdir(entry.path)
        except OSError:
            if entry.is_dir(follow_symlinks=False):
                remove_tree(entry.path)
    try:
        os.rmdir(path)
    except OSError:
        pass
