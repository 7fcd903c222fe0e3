"""A relay's root kept from run to run (:class:`KeptRoot`), for the runs that touch nothing but
their own dir: one overlay mounted for many runs, instead of one mounted and torn down per run.

Its upper layer lives on the runs' tmpfs (``<runs root>/kept-*``), locked while its relay lives:
the server removes a ``kept-*`` nobody holds the lock of (see ``mocksandbox/execution/world.py``).
"""

import fcntl as _fcntl
import os
import time

from _launcher_syscalls import IN_ATTRIB, IN_ISDIR, MS_BIND


class KeptRoot:
    """A relay's root kept from run to run, for the runs that touch nothing but their own dir.

    Mounting a new overlay for each run (and tearing it down) is most of what a world costs its
    relay. A run that only reads the image and writes in its own dir (most of a reward pipeline's:
    a program and its tests, no ``fetch_files``, no files put outside its dir; the server says
    which in ``world["keep"]``) leaves its root as it found it. So the relay keeps such a root: an
    overlay with an upper layer of its own (``<runs root>/kept-*/u``) over the mask and the host.

    The runs' parent dir in it (the server's temp dir as runs see it, ``/tmp``) is a dir of the
    root's own on the runs' tmpfs (``kept-*/r``), bound there once, at the first run, with the
    mode and owner of the dir it covers (and the host dirs shown under it bound again inside).
    Each run's dir, which the server made on the runs' tmpfs, is moved into it (one ``rename``:
    a bind and an unmount per run cost a relay about a tenth of a millisecond of CPU, the unmount
    an RCU grace period more). Once the run's processes are gone and its exit is said, before the
    status pipe closes (which the server waits for), the relay removes the run's dir (the server
    never hands the dir's name or inode to another run): a later run finds nothing of an earlier
    one, not its name in ``/tmp`` nor the mode, owner or extended attributes it gave its dir.

    The root is kept only if nothing changed while the run ran in its upper layer's dirs on the
    way to the runs' parent dir (the root of the layer, ``/tmp`` in it), in that parent dir itself
    (but for the attributes of the run's own dir, which goes) or in its /dev/shm: their entries,
    or their own mode, owner, times or extended attributes. Anything a run writes, deletes or
    changes outside its dir shows there first (what it changes anywhere in the image is copied up,
    under a new entry of the layer's root or of a dir on the way), and the root then goes, as a
    run's root always went before. inotify watches on those dirs, made at the root's first run,
    say so: one read after each run, where looking at each dir cost a relay's every run a tenth of
    a millisecond. A kept root serves for at most ``max_age_s`` seconds (the setting
    ``kept_root_max_age_s``: a lower layer, the host, may change under it, and its new files are
    then seen within that time) and :data:`MAX_RUNS` runs; where no watch can be had (inotify's
    limits), one run.
    """

    MAX_RUNS = 1000

    def __init__(self, world, runs_dir: str, max_age_s: float = 1.0) -> None:
        self.world = world
        self.max_age_s = max_age_s
        #: The inotify descriptor watching what runs must leave as they found it (see
        #: :meth:`take`), from the first run on; ``None`` before, or where none could be had.
        self.changes: int | None = None
        #: The watch (of :attr:`changes`) on the runs' parent dir (:attr:`runs_here`).
        self.parent_watch = -1
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
            #: The runs' parent dir, on the runs' tmpfs (beside the server's dirs of runs, so that
            #: a run's dir moves in and out of it by a rename).
            self.runs_here = self.base + "/r"
            os.mkdir(self.runs_here, 0o700)
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
        #: The current run's dir (its path in the run's view), while it is in this root.
        self.cwd: str | None = None
        #: Whether the current run's dir was removed after the run, and whether the run left
        #: the root as it found it (:meth:`remove_run_dir`).
        self.run_dir_gone = False
        self.untouched = False

    def serves(self) -> bool:
        """Whether it may serve another run (young enough, not too many runs yet)."""
        return self.lasts and self.runs < self.MAX_RUNS and time.monotonic() - self.born < self.max_age_s

    def take(self, cwd: str, cwd_host: str) -> None:
        """Move the run's dir ``cwd_host`` (on the runs' tmpfs) to ``cwd`` in this root; a
        ``FileExistsError`` if something there has that name."""
        name = os.path.basename(cwd)
        if self.runs == 0:
            self.lasts = False  # (until it holds them: a root that failed to serves no other run)
            self._hold_runs_at(cwd)
        try:
            os.rename(cwd_host, self.runs_here + "/" + name)
        except OSError as exc:
            if exc.errno in (17, 39, 16, 20, 21):  # EEXIST ENOTEMPTY EBUSY ENOTDIR EISDIR
                raise FileExistsError(exc.errno, f"a kept root holds {name}") from exc
            raise
        if self.changes is not None:
            # What the queue holds now is this relay's own (the rename, the last run's dir's
            # removal): the last run left nothing (remove_run_dir), and since then only this
            # relay has been at work.
            self.changed(None)
        self.cwd = cwd
        self.run_dir_gone = self.untouched = False
        self.runs += 1

    def _hold_runs_at(self, cwd: str) -> None:
        """At the first run (whose dir is ``cwd``): :attr:`runs_here` bound at the runs' parent
        dir in this root, with the host dirs shown under it bound again in it, and the watches
        made."""
        parent = os.path.dirname(cwd)
        target = self.root + parent
        os.makedirs(target, exist_ok=True)
        # The dirs on the way to the run's dir, its parent too, made the run's where programs join
        # the runs' user namespace (RunUsers.give_way).
        self.world.give_way(self.root, cwd)
        # As the dir it covers: /tmp's mode 1777 and owner, as the run's world has it.
        covered = os.lstat(target)
        os.chmod(self.runs_here, covered.st_mode & 0o7777)
        os.chown(self.runs_here, covered.st_uid, covered.st_gid)
        ways = []  # (the dirs made in it on the way to a shown dir: a run could write there)
        for path in self.world.shown:
            if path.startswith(parent + "/"):
                way = self.runs_here
                for part in path[len(parent) + 1 :].split("/"):
                    if way != self.runs_here and way not in ways:
                        ways.append(way)
                    way += "/" + part
                    if not os.path.isdir(way):
                        os.mkdir(way, 0o755)
        self.world.calls.mount(self.runs_here, target, None, MS_BIND)
        for path in self.world.shown:
            if path.startswith(parent + "/"):
                self.world.show(self.root, path)
        # What the upper layer holds now is what every later run must leave (its dirs on the way
        # to the runs' parent dir, where it holds them: a dir of the lower layers alone is copied
        # up at a run's first change below it, which the watch on the dir above sees); so is the
        # runs' parent dir, but for each run's own dir, which comes and goes.
        path, watched = self.upper, [self.upper]
        for part in [part for part in parent.split("/") if part][:-1]:
            path += "/" + part
            if not os.path.isdir(path):
                break
            watched.append(path)
        try:
            self.changes, watches = self.world.calls.watch_changes(
                [*watched, self.runs_here, *ways, self.shm]
            )
            self.parent_watch = watches[len(watched)]
            self.lasts = True
        except OSError:
            pass  # (it cannot tell whether a run left it as it was: it serves this run only)

    def remove_run_dir(self, code_file: "str | None") -> bool:
        """Once the run's processes are gone, before its relay closes the status pipe: whether the
        run left the root as it found it (:attr:`untouched`), and its dir removed (whether it is
        gone). ``code_file``: the program's file (its path in the run's view)."""
        assert self.cwd is not None
        name = os.path.basename(self.cwd)
        self.untouched = self.changes is not None and not self.changed(name)
        path = self.runs_here + "/" + name
        if code_file is not None and code_file.startswith(self.cwd + "/"):
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
        """Once the run's answer is on its way: whether the root may serve the next run (its run's
        dir is gone, and the run left the rest as it found it)."""
        assert self.cwd is not None
        self.cwd = None
        return self.run_dir_gone and self.untouched

    def changed(self, run_dir: "str | None") -> bool:
        """Whether the watched dirs changed since the last call (their events are read and
        dropped): any event at all says so (a lost one too: the queue overflowed), but for a
        change of the attributes of ``run_dir`` (the run's own dir: its mode, times, link count),
        which goes with it."""
        assert self.changes is not None
        wanted = None if run_dir is None else run_dir.encode()
        seen = False
        while True:
            try:
                events = os.read(self.changes, 4096)  # (a run's events: a few, if any)
            except BlockingIOError:
                return seen
            except OSError:
                return True
            if not events:
                return True
            if wanted is None:
                seen = True
                continue
            at = 0
            while at < len(events):
                # struct inotify_event: int wd, uint32 mask, cookie, len; then the name (len
                # bytes, NUL-padded).
                size = int.from_bytes(events[at + 12 : at + 16], "little")
                if (
                    int.from_bytes(events[at : at + 4], "little", signed=True) != self.parent_watch
                    or int.from_bytes(events[at + 4 : at + 8], "little") & ~IN_ISDIR != IN_ATTRIB
                    or events[at + 16 : at + 16 + size].rstrip(b"\0") != wanted
                ):
                    seen = True
                at += 16 + size

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
