"""The mask layer of a run's root: what hides the server's secrets and state from every run.

A relay's world (``_launcher_world``) builds one :class:`Mask` once, on its scratch tmpfs, and
stacks it in every run's root between the run's own layers and the host: an empty /dev, an empty
/tmp and /run (``Mask.fresh``), and every hidden path (secrets, the server's state:
``world["hide"]``) present but empty. Files that servers
make as they go (``mocksandbox-*`` in their temp roots: ``world["hide_prefixed"]``) are hidden as
they come and go, between runs (:meth:`Mask.refresh`).

Where an unprivileged relay cannot take the host's root file system as one layer, each top-level
dir of it is a layer of its own (:func:`host_tops`) and the mask holds the top of the host's tree.

Where programs join the runs' user namespace themselves (a root server without idmapped mounts),
the host root's dirs are nobody's to a run: the mask holds the dirs on the way to what a run must
reach (the user's Python, the runtime, the server user's home: ``world["reach"]``, which a root
server may keep under its 0700 home), given to the run's root, as an idmapped view would show them,
and what it hides is the run root's too (it looks empty, not out of reach).
"""

import os


def under(path: str, dirs) -> bool:
    """Whether ``path`` is one of ``dirs`` or below one."""
    return any(path == top or path.startswith(top + "/") for top in dirs)


def host_tops(fresh: tuple) -> list:
    """``(name, how)`` for each dir at the top of the host's root file system that is a layer
    of its own in a run's root: ``overlay`` (copy-on-write, as the whole root elsewhere), or
    ``bind`` (read-only: something is mounted inside it, which an unprivileged overlay may not
    take as a layer). Empty dirs are left to the mask, where they are plain dirs; so are /proc,
    /sys and /dev (made for each run), and /tmp and /run, which a run finds as in a fresh
    container: its own files only, not the host's, its users' or their sockets (an agent's, a
    session bus, Docker's: a socket's path reaches across network namespaces): ``fresh``, the
    world's ``config["fresh"]``."""
    with open("/proc/self/mountinfo") as mountinfo:
        mounted = [line.split()[4] for line in mountinfo]
    tops = []
    for name in sorted(os.listdir("/")):
        path = "/" + name
        if name in ("proc", "sys", "dev") or path in fresh:
            continue
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if info.st_mode & 0o170000 != 0o040000:
            continue
        try:
            if not os.listdir(path):
                continue
        except OSError:
            pass  # unreadable (root's home): a layer still, as unreadable as on the host
        inside = any(point.startswith(path + "/") for point in mounted)
        tops.append((name, "bind" if inside else "overlay"))
    return tops


class Mask:
    """The layer between each run's upper layer and the host, at ``path``: built once, refreshed
    between runs.

    ``host``: where the host's root file system is seen as the runs see it (``""``: "/" itself);
    ``opaque_xattr``: the xattr overlayfs keeps its opaque mark in; ``tops``: the host's top dirs
    that are layers of their own (:func:`host_tops`), or ``None``; ``shown``: host dirs a run must
    see where its tops leave them out (mount points are made for them here); ``config``: the
    world's settings (``fresh``, ``hide``, ``hide_prefixed``, ``reach``); ``joins``: the runs' user namespace
    (``RunUsers``) where programs join it themselves, else ``None``.
    """

    def __init__(
        self, path: str, host: str, opaque_xattr: str, tops, shown: list, config: dict, joins=None
    ) -> None:
        self.path = path
        self.host = host
        self.opaque_xattr = opaque_xattr
        self.tops = tops
        self.shown = shown
        self.joins = joins
        #: Top-level dirs every run finds empty, as in a fresh container (the server's
        #: ``world.FRESH_DIRS``): its own files only, not the host's, its users' or their sockets
        #: (a socket's path reaches across network namespaces), nor what earlier runs or other
        #: servers left there; but for what it must see there (``shown``). Left out of the tops
        #: (:func:`host_tops`), or opaque dirs of the mask.
        self.fresh = tuple(config["fresh"])
        #: Dirs whose entries with a prefix are hidden as they come and go: ``[dir, prefix]`` (not
        #: in the fresh dirs, which hide them all: a hidden one there would show its name).
        self.hidden_prefixes = [
            tuple(pair) for pair in config.get("hide_prefixed", []) if not under(pair[0], self.fresh)
        ]
        self._scanned: dict = {}
        self._masked: dict = {}
        self.hidden = config.get("hide", [])
        self._build(self.hidden)
        if joins is not None:
            for path in config.get("reach", []):
                self._reach(path)

    def _dir(self, path: str, opaque: bool) -> str:
        """``path`` made in the mask layer with its host attributes (the topmost layer holding a
        directory gives it its mode and owner), parents included."""
        target = self.path + path
        if not os.path.isdir(target):
            parent = os.path.dirname(path)
            if parent != path:
                self._dir(parent, False)
            if not os.path.isdir(target):
                info = os.stat(self.host + path) if os.path.isdir(self.host + path) else None
                os.mkdir(target)
                if info is not None:
                    os.chmod(target, info.st_mode & 0o7777)
                    self._chown(target, info.st_uid, info.st_gid)
        if opaque:
            os.setxattr(target, self.opaque_xattr, b"y")
        return target

    @staticmethod
    def _chown(path: str, uid: int, gid: int) -> None:
        try:
            os.chown(path, uid, gid)
        except OSError:
            pass  # an owner the runs' user namespace does not map (its root's, then)

    def _build(self, hidden: list) -> None:
        """The layer between each run's upper layer and the host: an empty /dev, and every hidden
        path (secrets, the server's state) present but empty. Where the host's top
        dirs are layers of their own (``tops``), the mask holds the top of the host's tree too."""
        if self.tops is not None:
            for name in os.listdir("/"):
                try:
                    if os.path.islink("/" + name):
                        os.symlink(os.readlink("/" + name), self.path + "/" + name)
                    elif os.path.isdir("/" + name):
                        self._dir("/" + name, False)
                except OSError:
                    continue
        self._dir("/dev", True)  # (the runs' /dev is mounted on it: _launcher_devices)
        if self.tops is None:  # (else they are no layer: empty plain dirs of the mask's top)
            for top in self.fresh:
                if os.path.isdir(self.host + top):
                    self._dir(top, True)  # (the host's mode and owner: /tmp stays 1777)
        for path in hidden:
            if self.in_view(path):
                self._hide(path)
        for path in self.shown:  # mount points for them (the host's own modes and owners)
            self._dir(path, False)

    def in_view(self, path: str) -> bool:
        """Whether the host's ``path`` is in a run's view at all: not in a fresh top (/tmp, /run),
        which a run finds empty, but for a dir shown there. (A hidden path made here in a fresh top
        would show its name there: an empty dir of the mask.)"""
        return not under(path, self.fresh) or under(path, self.shown)

    def _reach(self, path: str) -> None:
        """Where programs join the runs' user namespace: the dirs on the way to the host dir
        ``path`` (links followed first: a dir here in a link's place would hide where it leads),
        and ``path`` itself, made here with their host modes and given to the same owners of the
        runs' namespace (the host root's to the run's root), so that a run reaches and reads what
        is below them as the host's root may. The rest of each comes through from the host."""
        path = os.path.realpath(path)
        if not os.path.isdir(path) or path == "/":
            return
        way = ""
        for part in [part for part in path.split("/") if part]:
            way += "/" + part
            target = self._dir(way, False)
            info = os.stat(self.host + way)
            owner = self.joins.shifted(info.st_uid, info.st_gid)
            if owner != (os.stat(target).st_uid, os.stat(target).st_gid):
                os.chown(target, *owner)

    def _hide(self, path: str) -> bool:
        """``path`` made present but empty in the mask layer; whether there was one to hide."""
        try:
            info = os.lstat(self.host + path)
        except OSError:
            return False  # nothing there to hide (a run may make it, in its own layer)
        if info.st_mode & 0o170000 == 0o040000:  # a dir
            target = self._dir(path, True)
        else:
            self._dir(os.path.dirname(path), False)
            target = self.path + path
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, info.st_mode & 0o7777)
            os.close(fd)
            self._chown(target, info.st_uid, info.st_gid)
        if self.joins is not None:
            # Empty to the run, as where the host root's files are its root's: not out of its reach.
            self._chown(target, *self.joins.shifted(info.st_uid, info.st_gid))
        return True

    def refresh(self, before_change) -> None:
        """Hide what servers made in their temp roots since the last run (state dirs, control
        sockets, shared counters, kernels' connection files: ``mocksandbox-*``), and stop hiding
        what is gone. Between runs only: a lower layer must not change while it is mounted (a
        kept root, which has the mask below it, goes first: ``before_change`` drops it). A dir is
        listed again only when its mtime says that its entries changed."""
        for directory, prefix in self.hidden_prefixes:
            try:
                changed = os.stat(self.host + directory).st_mtime_ns
            except OSError:
                continue
            if self._scanned.get(directory) == changed:
                continue
            self._scanned[directory] = changed
            try:
                names = {n for n in os.listdir(self.host + directory) if n.startswith(prefix)}
            except OSError:
                continue
            masked = self._masked.setdefault(directory, set())
            if names != masked:
                before_change()
            for name in names - masked:
                if self._hide(os.path.join(directory, name)):
                    masked.add(name)
            for name in masked - names:
                gone = self.path + os.path.join(directory, name)
                try:  # an empty opaque dir, or an empty file
                    os.rmdir(gone) if os.path.isdir(gone) else os.unlink(gone)
                except OSError:
                    pass
                masked.discard(name)
