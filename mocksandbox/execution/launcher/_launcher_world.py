"""A run's world (isolation "lite"; see ``mocksandbox/execution/world.py``): one relay's namespaces,
and the root it mounts for each run that asks (:class:`World`).

Made of system calls, never of helper programs (unshare(1), mount(8) and ip(8) cost milliseconds
a run). What lasts is made once per relay: the launcher forks each relay as the first process
(PID 1) of a new PID namespace, and the relay enters new mount, network, IPC and UTS namespaces of
its own, mounts its /proc, hardens it, and builds the read-only pieces every run shares (a mask
layer: ``_launcher_mask``, a read-only /sys, a /dev). What is fresh is made per run: an overlay
whose upper layer the server made for this request (or a root kept from run to run:
``_launcher_kept``), and the program chroot'ed into it with a reduced capability set.

Where runs are an unprivileged uid, a relay is the root of their user namespace and makes all this
there; but for a root server whose kernel refuses idmapped mounts, whose relays stay the host's
root (``_launcher_users.RunUsers.programs_join``): each program joins the runs' user namespace
itself, and what it must reach in its root on the way to its dir is given to its uid.

A Jupyter kernel's world is made by the same class, in the kernels' fork server
(``mocksandbox/jupyter/_zygote.py``).
"""

import _signal
import os

from _launcher_devices import build_dev
from _launcher_ipc import RunIpc
from _launcher_kept import KeptRoot, remove_tree
from _launcher_mask import Mask, host_tops, under
from _launcher_reaping import RunReaper
from _launcher_syscalls import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWUTS,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    Syscalls,
    loopback_up,
    write_text,
)
from _launcher_users import DISK_UNDER_RUNS
from _launcher_watch import end_the_run


def _takes_user_xattrs(path: str) -> bool:
    """Whether the file system of ``path`` takes ``user.*`` extended attributes (tmpfs from 6.6)."""
    try:
        os.setxattr(path, "user.mocksandbox.probe", b"")
        os.removexattr(path, "user.mocksandbox.probe")
    except OSError:
        return False
    return True


def _make_mount_point(root: str, target: str) -> None:
    """The dir ``target`` in the run's ``root`` (made, with the dirs on the way, where missing),
    never through a link: a session's layer outlives its commands, and a link one of them left on
    the way would lead a relay that is the host's root to make dirs, and mount, where the run
    chose on the host. A link or a file on the way is refused (``ENOTDIR``)."""
    way = root
    for part in [part for part in target.split("/") if part]:
        way += "/" + part
        try:
            info = os.lstat(way)
        except FileNotFoundError:
            os.mkdir(way, 0o755)
            continue
        if info.st_mode & 0o170000 != 0o040000:
            raise OSError(20, f"not a dir on the way to a bound dir: {way[len(root) :]}")  # ENOTDIR


class World:
    """One relay's namespaces, and the per-run overlay it mounts for each run that asks."""

    def __init__(self, config: dict, calls: Syscalls, users=None) -> None:
        self.calls = calls
        self.scratch = config["scratch"]
        self.kept_max_age_s = config.get("kept_max_age_s", 1.0)
        self.root = self.scratch + "/root"
        self.mask = self.scratch + "/mask"
        self.mounted = False
        #: The root a run kept from run to run (see KeptRoot), if any, and the root of the run
        #: being made or run now (``root`` or the kept one's).
        self.kept: KeptRoot | None = None
        self.current = self.root
        #: The relay as PID 1 of each run's PID namespace: its program waited for, orphans reaped.
        self.reaper = RunReaper()
        #: The runs' user namespace (``RunUsers``) that each program joins as it starts, where the
        #: relay stays the host's root (``programs_join``: a root server without idmapped mounts),
        #: else ``None``.
        self.joins = users if users is not None and users.programs_join else None
        #: The relay is in a user namespace of the runs' own (see RunUsers), else the host's root.
        self.users = config.get("userns") is not None and self.joins is None
        #: Where the host's root file system is seen as the runs see it (their lowest layer): the
        #: idmapped copy in a user namespace (there the host's own "/" shows its root's files as
        #: nobody's), else "/" itself.
        self.host = self.scratch + "/host" if self.users and "mapped_roots" in config else ""
        #: An unprivileged relay may not take the host's root file system as one layer (the mounts
        #: under it are locked to it in a user namespace, and overlayfs refuses such a layer): each
        #: top-level dir of it is a layer of its own then (``host_tops``), else ``None``.
        self.tops = None
        #: The xattrs overlayfs keeps its marks in (a user namespace may only write user.*).
        self.opaque_xattr = "user.overlay.opaque" if self.users else "trusted.overlay.opaque"
        private_network = config.get("network", "private") == "private"
        flags = CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS
        if private_network and self.joins is not None:
            self.joins.enter_own_network(calls)  # (one of the runs' user namespace: see RunUsers)
        elif private_network:
            flags |= CLONE_NEWNET
        calls.unshare(flags)
        calls.mount(None, "/", None, MS_REC | MS_PRIVATE)
        # This PID namespace's own /proc (the relay is its PID 1).
        calls.mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        if self.host:
            # The idmapped copies (in the base, our working directory) over the host dirs they
            # copy: the runs' layers and the sessions' dirs are then the run's own at their paths.
            for index, root in enumerate(config["mapped_roots"]):
                calls.mount(f"m{index}", root, None, MS_BIND)
        if private_network:
            loopback_up()
            # No TIME_WAIT sockets: a run that binds the port an earlier run of this relay served on
            # (without SO_REUSEADDR, as socketserver.TCPServer does) must not find it taken.
            try:
                write_text("/proc/sys/net/ipv4/tcp_max_tw_buckets", "0")
            except OSError:
                if not self.users and self.joins is None:
                    raise
        # Kernel tunables and the magic SysRq key stay out of reach of a root program.
        calls.mount("/proc/sys", "/proc/sys", None, MS_BIND | MS_REC)
        read_only = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
        calls.mount(None, "/proc/sys", None, read_only)
        if os.path.exists("/proc/sysrq-trigger"):
            calls.mount("/dev/null", "/proc/sysrq-trigger", None, MS_BIND)
        # The scratch dir's place on the runs' file system, held before the tmpfs covers it: where
        # the tmpfs cannot hold the mask, a relay of a server that is not root keeps it there
        # (_mask_beside). (A root server's relays in a user namespace take the host's "/" as a
        # layer, in which the runs' dir may be: a mask there would overlap it.)
        below = None
        if self.users and not self.host:
            # (The runs' dir on disk, where the launcher covered it with the runs' tmpfs.)
            on_disk = self.scratch + "/" + DISK_UNDER_RUNS
            where = on_disk if os.path.isdir(on_disk) else self.scratch
            below = os.open(where, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        calls.mount("tmpfs", self.scratch, "tmpfs", MS_NOSUID, "mode=0700,size=8m")
        for name in ("mask", "sys", "dev", "root", "kept", "mqueue"):
            os.mkdir(self.scratch + "/" + name, 0o755)
        #: The mask's own dir on the runs' file system, where it is kept there (``_mask_beside``):
        #: the descriptor of the dir holding it, and its name there; else ``None``.
        self.mask_beside: tuple | None = None
        if below is not None:
            if config.get("tmpfs_user_xattrs") == "off" or not _takes_user_xattrs(self.mask):
                self._mask_beside(below)
            else:
                os.close(below)
        #: What runs leave in the relay's IPC namespace, counted and cleared after each run.
        self.ipc = RunIpc(calls, self.scratch + "/mqueue")
        if self.host:
            os.mkdir(self.host, 0o755)
            calls.mount("lower", self.host, None, MS_BIND)
            os.chdir("/")  # done with the base: the relay holds no dir of the runs'
        read_only_sys = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
        try:
            calls.mount("sysfs", self.scratch + "/sys", "sysfs", read_only_sys)
        except OSError:
            if not self.users and self.joins is None:
                raise
            # A user namespace may mount a sysfs only with a network namespace of its own (not so
            # with run_network: host): the host's, read-only.
            calls.mount("/sys", self.scratch + "/sys", None, MS_BIND | MS_REC)
            calls.mount(None, self.scratch + "/sys", None, MS_BIND | MS_REMOUNT | read_only_sys)
        build_dev(calls, self.scratch + "/dev", self.users)
        #: Host dirs a run must see where /tmp and /run start empty (the user's Python and
        #: runtime, kept under /tmp by a CI job or a checkout there): bound read-only for each run.
        fresh = tuple(config["fresh"])
        self.shown: list = [
            p for p in config.get("show", []) if p not in fresh and under(p, fresh) and os.path.isdir(p)
        ]
        if self.users and not self.host:
            self.tops = host_tops(fresh)
        #: The mask layer (hidden paths present but empty), built here once.
        self.mask_layer = Mask(
            self.mask, self.host, self.opaque_xattr, self.tops, self.shown, config, self.joins
        )
        self.keep_caps = set(config["keep_caps"])
        calls.drop_bounding_set(self.keep_caps)
        calls.prepare_capabilities(self.keep_caps)
        # A handler, not the default action: a namespace's PID 1 drops signals it has none for.
        _signal.signal(_signal.SIGIO, end_the_run)
        #: The runs' seccomp filter (``syscall_filter.py``), if the server has one: installed here,
        #: once, in the world's first process (the relay, or a kernel's world), so that each
        #: program inherits it at its fork instead of paying for a filter of its own (the kernel
        #: compiles and JITs each one; about a fifth of a millisecond a run). What the relay still
        #: does for each run (mount and unmount its root) the filter leaves to the capability check.
        #: Where programs join the runs' user namespace (``joins``), each installs it itself, after:
        #: the filter refuses ``setns``.
        self.filtered = config.get("syscall_filter") is not None
        if self.filtered:
            calls.prepare_filter(bytes.fromhex(config["syscall_filter"]))
            if self.joins is None:
                calls.install_filter()

    def mount_run(self, world: dict, cwd: "str | None" = None) -> None:
        """The run's root: its layers over the mask over the host, with /proc, /sys and /dev,
        and the host dirs ``world["binds"]`` names (``[host dir, where the run sees it]``). A run
        that ``world["keep"]`` says touches nothing but its own dir ``cwd`` may have the root an
        earlier run kept (:class:`KeptRoot`)."""
        if self.mounted or (self.kept is not None and self.kept.cwd is not None):
            self.unmount_run()  # the last run's, if its unmount failed
        if self.ipc.dirty:
            self.ipc.renew()  # (the last run's renewal failed: this run fails if this one does)
        self.mask_layer.refresh(self.drop_kept)
        self.current = self.root
        keep = world.get("keep")
        plain = not world.get("lowers") and not world.get("binds")
        if keep is not None and cwd is not None and self.tops is None and plain:
            if self.kept is not None and not self.kept.serves():
                self.drop_kept()
            if self.kept is None:
                self.kept = KeptRoot(self, keep["dir"], self.kept_max_age_s)
            try:
                self.kept.take(cwd, keep["cwd_host"])
            except FileExistsError:  # an earlier run's dir had that name: a new root has none
                self.drop_kept()
                self.kept = KeptRoot(self, keep["dir"], self.kept_max_age_s)
                self.kept.take(cwd, keep["cwd_host"])
            self.current = self.kept.root
            return
        self.mount_overlay(self.root, world["lowers"], world["upper"], world["work"], world)
        self.mounted = True
        # Host dirs the run works in, in place (a swedev session's /workspace and /tmp): their
        # mount points are made in the run's upper layer.
        for source, target in world.get("binds", ()):
            _make_mount_point(self.root, target)
            self.give_way(self.root, target)
            self.calls.mount(source, self.root + target, None, MS_BIND)

    def mount_overlay(self, root: str, layers: list, upper: str, work: str, world: dict) -> None:
        """An overlay at ``root``: ``upper`` over ``layers``, the mask and the host, with the host's
        top dirs (where they are layers of their own), /proc, /sys, /dev and a fresh /dev/shm."""
        tops = self.tops or ()
        for name, how in tops:
            if how == "overlay":  # made before the root's overlay: its upper must not change under it
                os.makedirs(upper + "/" + name, 0o755, exist_ok=True)
                os.makedirs(work + "." + name, 0o700, exist_ok=True)
        lowers = ":".join([*layers, self.mask, *(() if self.tops is not None else (self.host or "/",))])
        # No redirects, no index: what the server reads back through the layers (world.py) only
        # has whiteouts and opaque dirs to follow. (In a user namespace overlayfs keeps its marks
        # in user.* xattrs, and "off" would still follow redirects there: "nofollow".)
        options = f"lowerdir={lowers},upperdir={upper},workdir={work}"
        options += (
            ",userxattr,redirect_dir=nofollow,index=off" if self.users else ",redirect_dir=off,index=off"
        )
        self.calls.mount("overlay", root, "overlay", 0, options)
        if self.joins is not None:
            # Its "/" is its root's, as where the host root's files are the run root's: a run may
            # make new dirs there (/results), in its own layer.
            os.chown(root, self.joins.uid, self.joins.gid)
        for name, how in tops:
            self._mount_top(root, name, how, world)
        for path in self.shown:
            self.show(root, path)
        self.calls.mount("/proc", root + "/proc", None, MS_BIND | MS_REC)
        self.calls.mount(self.scratch + "/sys", root + "/sys", None, MS_BIND | MS_REC)
        self.calls.mount(self.scratch + "/dev", root + "/dev", None, MS_BIND | MS_REC)
        # Docker's /dev/shm: a tmpfs of the run's own, 64 MiB, its root's (where the relay stays
        # the host's root, made so: as in a relay of the runs' user namespace).
        shm = "mode=1777,size=64m"
        if self.joins is not None:
            shm += f",uid={self.joins.uid},gid={self.joins.gid}"
        self.calls.mount("tmpfs", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, shm)

    def show(self, root: str, path: str) -> None:
        """The host dir ``path`` (one of :attr:`shown`) bound read-only at its path in ``root``."""
        self.calls.mount(path, root + path, None, MS_BIND | MS_REC)
        # Read-only, keeping the flags it came with: in the runs' user namespace, a dir of an
        # idmapped copy (/tmp, where the runs' layers are) is nosuid and nodev, locked so.
        # (statvfs's ST_NOSUID, ST_NODEV and ST_NOEXEC are these MS_ values.)
        kept = os.statvfs(root + path).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
        self.calls.mount(None, root + path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | kept)
        self._cover_hidden(root, path)

    def _mount_top(self, root: str, name: str, how: str, world: dict) -> None:
        """The host's top dir ``name`` in the run's root: its own overlay (its upper and lowers the
        run's layers' dirs of that name, so that the server reads them as ever), or read-only."""
        target = root + "/" + name
        if how == "bind":
            self.calls.mount("/" + name, target, None, MS_BIND | MS_REC)
            self.calls.mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
            self._cover_hidden(root, "/" + name)
            return
        below = [layer + "/" + name for layer in world["lowers"]]
        below += [self.mask + "/" + name, "/" + name]
        lowers = ":".join(path for path in below if os.path.isdir(path))
        options = f"lowerdir={lowers},upperdir={world['upper']}/{name},workdir={world['work']}.{name}"
        self.calls.mount(
            "overlay", target, "overlay", 0, options + ",userxattr,redirect_dir=nofollow,index=off"
        )

    def _cover_hidden(self, root: str, bound: str) -> None:
        """No mask below a host dir bound whole in the run's ``root`` (a top dir with mounts inside,
        a dir shown in /tmp): the mask's empty copies of the hidden paths inside it over them."""
        for hidden in self.mask_layer.hidden:
            if hidden.startswith(bound + "/") and os.path.lexists(self.mask + hidden):
                self.calls.mount(self.mask + hidden, root + hidden, None, MS_BIND)

    def give_way(self, root: str, path: str) -> None:
        """Where programs join the runs' user namespace: the way to ``path`` in the run's ``root``
        made the run's (``RunUsers.give_way``)."""
        if self.joins is not None:
            self.joins.give_way(root, path)

    def unmount_run(self) -> None:
        """The run's root taken down: unmounted, or (a kept one) its run's dir taken out of it,
        and the root itself dropped unless it is as the first run found it."""
        if self.kept is not None and self.kept.cwd is not None and not self.kept.give_back():
            self.drop_kept()
        if self.mounted:
            try:
                self.calls.umount(self.root)
            except OSError:
                pass
            self.mounted = False

    def drop_kept(self) -> None:
        """Unmount the kept root, if any, and remove its upper layer."""
        kept, self.kept = self.kept, None
        if kept is not None:
            kept.drop()

    def _mask_beside(self, below: int) -> None:
        """The mask of a relay in a user namespace whose scratch tmpfs refuses ``user.*`` extended
        attributes: a dir of its own on the host's disk, bound at :attr:`mask`. ``below`` is the
        dir it is made in, held from before the scratch tmpfs covered it: the runs' dir on disk
        (which the launcher covered with the runs' tmpfs, and bound at ``<scratch>/.disk``:
        ``RunUsers``), or else (a Jupyter kernel's world) the scratch dir itself.

        In a user namespace overlayfs keeps its marks (opaque dirs) in ``user.*`` attributes,
        which tmpfs takes from Linux 6.6 only: on Debian 12's 6.1, Ubuntu 22.04's 5.15 and RHEL 9's
        5.14 a server that is not root got no world at all. A disk's file system takes them (ext4,
        xfs, btrfs), and the temp root is in no layer of a run's root (/tmp is none: runs find it
        empty). Removed when the relay leaves (:meth:`drop_mask`); what a relay killed from
        outside leaves goes with the runs' dir, at the server's stop."""
        self.mask_beside = (below, "mask-" + os.urandom(6).hex())
        os.mkdir(self.mask_beside[1], 0o755, dir_fd=below)
        made = os.open(
            self.mask_beside[1], os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=below
        )
        try:
            self.calls.mount(f"/proc/self/fd/{made}", self.mask, None, MS_BIND)
        finally:
            os.close(made)

    def drop_mask(self) -> None:
        """Remove the mask kept on the runs' file system, if any (the relay is leaving: no run
        will stack it again)."""
        beside, self.mask_beside = self.mask_beside, None
        if beside is None:
            return
        below, name = beside
        remove_tree(self.mask)  # (its contents: the dir itself is a mount point here)
        try:
            self.calls.umount(self.mask)
            os.rmdir(name, dir_fd=below)
        except OSError:
            pass  # (the runs' dir goes with the server)
        os.close(below)

    def enter(self, cwd: str) -> None:
        """In the forked program: into the run's root, with the kept capabilities only (and, where
        programs join the runs' user namespace, into it first)."""
        _signal.signal(_signal.SIGIO, _signal.SIG_DFL)  # the relay's, not the program's
        if self.kept is not None:
            os.close(self.kept.lock)  # the relay's to hold (a program could unlock it)
            if self.kept.changes is not None:
                os.close(self.kept.changes)  # (a program could read its changes' events away)
        if self.mask_beside is not None:
            os.close(self.mask_beside[0])  # a dir of the host's: a way out of the run's root
        if self.joins is not None:
            self.joins.enter_root(self.calls, self.current, cwd, self.keep_caps, self.filtered)
            return
        os.chroot(self.current)
        os.chdir(cwd)
        self.calls.set_command_line()
        self.calls.reduce_capabilities()  # (the seccomp filter is the world's: see __init__)
