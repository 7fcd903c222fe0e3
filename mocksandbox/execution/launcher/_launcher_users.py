"""Uid maps: runs as an unprivileged range of host uids, in a user namespace of their own
(:class:`RunUsers`), made once in the launcher and entered by each relay of a world, or by each
program where the relays stay the host's root (a root server without idmapped mounts).

Kernels' worlds use it too (``mocksandbox/jupyter/_zygote.py``).
"""

import errno
import os

from _launcher_syscalls import (
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    MS_BIND,
    MS_NODEV,
    MS_NOSUID,
    MS_REC,
    MS_SLAVE,
    PR_SET_DUMPABLE,
    Syscalls,
    write_text,
)

#: In the relays' scratch dir of a launcher that covered the runs' dir with a tmpfs of its own:
#: that dir as it is on the host's disk (see ``World._mask_beside``).
DISK_UNDER_RUNS = ".disk"


class RunUsers:
    """Runs as an unprivileged range of host uids (made once, in the launcher, while it is root).

    A user namespace maps its uids 0..count-1 to the host's ``uid``..``uid``+count-1: a run is root
    inside it (``id`` says 0, it may do what root may in its own namespaces) and an ordinary user
    outside, so the kernel's own checks stand behind every namespace and mask (the host's files it
    does not own, other users' processes, the host's keyrings, every capability over the host).

    The host's files keep their owners in the run's view through idmapped mounts, made here once
    and copied into every relay's mount namespace: ``<base>/lower``, the root file system read-only
    (the runs' lowest layer), and ``<base>/m<i>``, each of ``mapped_roots`` (the runs' layers, the
    sessions' dirs) writable. A file the host's root owns is the run's root's there, and what the
    run writes is stored as the host's root's, so the server reads and removes it as before.

    The launcher first moves into a mount namespace of its own (a slave of the host's, so that
    later mounts of the host still reach its plain runs): none of this is ever seen on the host.

    A server that is not root (``self_mapped``) can do none of that: each relay makes a user
    namespace of its own, mapping its root to the server's uid alone (what any user may do where
    unprivileged user namespaces are allowed). The host's files are then seen with their own
    owners, those of other users (root's) as nobody's: read-only to the run, as on the host.

    A root server whose kernel refuses idmapped mounts (tmpfs takes them from Linux 6.3 only;
    overlayfs, 9p, virtiofs and NFS refuse them on 6.1: a root file system of those fails first)
    keeps the same user namespace without them (``programs_join``): its relays stay the host's
    root and mount each run's root as a root server's relays do without a user namespace, and
    each program joins the namespace as it starts (:meth:`join`), between its last look at the
    host's paths and its chroot. The host's files are then seen with their host owners: the host
    root's as nobody's, read-only to the run, as for a server that is not root. What the server
    makes for a run (its dir, its files, its root's top) it gives to the run's uid
    (``mocksandbox.execution.world.RunOwner``), and what the run writes is stored as that uid's,
    which the server, root, reads and removes all the same. The relays' network namespaces belong
    to the runs' user namespace all the same (:meth:`enter_own_network`): a run's root binds ports
    below 1024 and opens raw sockets there, as where relays are in that user namespace.
    """

    def __init__(self, config: dict, calls: Syscalls) -> None:
        users = config["userns"]
        self.uid, self.gid, self.count = users["uid"], users["gid"], users["count"]
        self.self_mapped = bool(users.get("self_mapped"))
        self.nested = bool(users.get("nested"))
        #: Relays stay the host's root; each program joins the namespace (see the class).
        self.programs_join = bool(users.get("programs_join"))
        #: Then: the network namespace made for the next world's PID 1 (:meth:`make_network`), set
        #: by the process that forks it, around its fork.
        self.network: int | None = None
        self.userns = self.base = -1
        #: The server's uid as the relays' parent namespace sees it.
        self.outside_uid, self.outside_gid = self.uid, self.gid
        if self.self_mapped:
            if users.get("runs_tmpfs"):
                on_disk = self._own_runs_tmpfs(config["runs_root"], users["runs_tmpfs"], calls)
                os.mkdir(config["scratch"], 0o700)  # (the host's is under the tmpfs now)
                # The runs' dir on the host's disk, under the tmpfs now, at <scratch>/.disk too:
                # where relays keep their masks if their tmpfs cannot (World._mask_beside).
                os.mkdir(config["scratch"] + "/" + DISK_UNDER_RUNS, 0o700)
                try:
                    calls.mount(
                        f"/proc/self/fd/{on_disk}", config["scratch"] + "/" + DISK_UNDER_RUNS, None, MS_BIND
                    )
                finally:
                    os.close(on_disk)
            return
        if self.programs_join:
            self.userns = self._make_namespace(calls)  # (nothing is mounted for it: no mount namespace)
            return
        calls.unshare(CLONE_NEWNS)
        calls.mount(None, "/", None, MS_REC | MS_SLAVE)
        self.userns = self._make_namespace(calls)
        base = config["scratch"]
        calls.mount("tmpfs", base, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
        os.mkdir(base + "/lower", 0o755)
        _idmapped_clone(calls, "/", base + "/lower", self.userns, read_only=True)
        for index, root in enumerate(config["mapped_roots"]):
            os.mkdir(f"{base}/m{index}", 0o755)
            _idmapped_clone(calls, root, f"{base}/m{index}", self.userns, read_only=False)
        self.base = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def _own_runs_tmpfs(self, runs_root: str, options: str, calls: Syscalls) -> int:
        """A server that is not root cannot mount the runs' tmpfs on the host: the launcher moves
        into a user and a mount namespace of its own (its root the server's uid) and mounts it
        there, sized, over the runs' dir. Relays inherit it; the server reaches it through
        ``/proc/<launcher>/root`` (``RunsRoot.seen_through``); it is gone with the launcher.
        Returns a descriptor of the runs' dir on the host's disk, below the tmpfs."""
        calls.unshare(CLONE_NEWUSER | CLONE_NEWNS)
        write_text("/proc/self/setgroups", "deny")
        write_text("/proc/self/uid_map", f"0 {self.uid} 1\n")
        write_text("/proc/self/gid_map", f"0 {self.gid} 1\n")
        calls.mount(None, "/", None, MS_REC | MS_SLAVE)
        on_disk = os.open(runs_root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        calls.mount("tmpfs", runs_root, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0700,{options}")
        self.outside_uid = self.outside_gid = 0  # the relays' namespaces nest in this one
        return on_disk

    def _make_namespace(self, calls: Syscalls) -> int:
        """A user namespace with the run's map (a child makes it, the launcher maps it and keeps
        a descriptor of it; the child then leaves)."""
        made_r, made_w = os.pipe()
        done_r, done_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(made_r)
                os.close(done_w)
                calls.unshare(CLONE_NEWUSER)
                os.write(made_w, b"u")
                os.read(done_r, 1)  # until the launcher has its descriptor
            finally:
                os._exit(0)
        os.close(made_w)
        os.close(done_r)
        try:
            if os.read(made_r, 1) != b"u":
                raise OSError(1, "cannot make a user namespace here")  # EPERM
            write_text(f"/proc/{pid}/uid_map", f"0 {self.uid} {self.count}\n")
            write_text(f"/proc/{pid}/gid_map", f"0 {self.gid} {self.count}\n")
            return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            os.close(done_w)
            os.close(made_r)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass

    def become_root(self, calls: Syscalls) -> None:
        """In a new relay: into the runs' user namespace as its root, then into a new PID namespace
        for the relay's own child (that namespace belongs to the user namespace: the relay may mount
        its /proc). The working directory is the base: the relay finds the mounts there."""
        # The OOM killer's first choice, now, while this process may still raise it for itself (its
        # /proc files are the host root's once its uid has changed): the relay and every program it
        # forks inherit it (a program's own write, _prefer_for_oom_kill, may then fail).
        try:
            write_text("/proc/self/oom_score_adj", "1000")
        except OSError:
            pass
        if self.self_mapped:
            # A user namespace of this relay's own: its root is the server's uid, as the kernel
            # lets any process map its own uid (and its gid, once it gave up setgroups).
            calls.unshare(CLONE_NEWUSER)
            write_text("/proc/self/setgroups", "deny")
            write_text("/proc/self/uid_map", f"0 {self.outside_uid} 1\n")
            write_text("/proc/self/gid_map", f"0 {self.outside_gid} 1\n")
            calls.unshare(CLONE_NEWPID)
            return
        os.fchdir(self.base)
        calls.setns(self.userns, CLONE_NEWUSER)
        os.setgroups([])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        if self.nested:
            # One of this relay's own inside the runs': RLIMIT_NPROC then bounds its runs alone.
            _nest(calls)
        calls.unshare(CLONE_NEWPID)

    def shifted(self, uid: int, gid: int) -> tuple:
        """The host ids the runs' namespace has a host owner as (the host's root: the runs' root,
        host user ``n`` below ``count``: its ``n``); one it does not map, as it is."""
        return (
            self.uid + uid if 0 <= uid < self.count else uid,
            self.gid + gid if 0 <= gid < self.count else gid,
        )

    def join(self, calls: Syscalls) -> None:
        """In a program of a relay that stays the host's root (``programs_join``), while it may
        still look at the host's paths: into the runs' user namespace as its root, and, with
        ``nested``, into one of its own inside it (RLIMIT_NPROC then bounds this run alone, where
        no cgroup does). The namespace's descriptor is closed with the program's others."""
        calls.setns(self.userns, CLONE_NEWUSER)
        os.setgroups([])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        if self.nested:
            _nest(calls)

    def enter_root(self, calls: Syscalls, root: str, cwd: str, keep_caps: set, filtered: bool) -> None:
        """In a program of a relay that stays the host's root (``programs_join``), for
        ``World.enter``: into its ``root`` and its dir ``cwd`` there, as the runs' root. The root is
        opened while the program is the host's root (the way there, the server's temp dirs, may be
        root's alone), then it joins (a new user namespace cannot be made once chroot'ed, and
        ``nested`` makes one), chroots into that root, and gives up what the relay gave up for its
        others: the bounding set (down to ``keep_caps``: joining gave it a full one), the seccomp
        filter (``filtered``: installed here, as it refuses ``setns``), the capabilities."""
        opened = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            calls.set_command_line()
            self.join(calls)
            os.fchdir(opened)
        finally:
            os.close(opened)
        os.chroot(".")
        os.chdir(cwd)
        calls.drop_bounding_set(keep_caps)
        if filtered:
            calls.install_filter()
        calls.reduce_capabilities()

    def give_way(self, root: str, path: str) -> None:
        """Where programs join the namespace (``programs_join``), in a relay: the dirs on the way to
        ``path`` in a run's ``root`` (not ``/``, not ``path``) that the host's users own, given to
        the same users of the runs' namespace (a dir of the host's root to the run's root), so that
        the run reaches its dir or a bound one through them (a root server's temp dirs may be its
        own alone: 0700). In the run's upper layer (copied up), never on the host."""
        way = root
        for part in [part for part in path.split("/") if part][:-1]:
            way += "/" + part
            info = os.lstat(way)
            if info.st_mode & 0o170000 != 0o040000:
                return  # (a link on the way: the mount that follows fails, or goes where it leads)
            owner = self.shifted(info.st_uid, info.st_gid)
            if owner != (info.st_uid, info.st_gid):
                os.chown(way, *owner, follow_symlinks=False)

    def make_network(self, calls: Syscalls) -> int:
        """Where programs join the namespace (``programs_join``): a descriptor of a new network
        namespace that belongs to the runs' user namespace, for a world's PID 1 that stays the
        host's root to enter (:meth:`enter_own_network`), so that a run's root has the capabilities
        it keeps over its network there (binding ports below 1024, raw sockets), as in a relay of
        that user namespace. A child joins the user namespace and makes it; this process (the one
        that forks worlds' PID 1s, so that the child takes no pid of theirs) opens it."""
        made_r, made_w = os.pipe()
        done_r, done_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(made_r)
                os.close(done_w)
                calls.setns(self.userns, CLONE_NEWUSER)
                calls.unshare(CLONE_NEWNET)
                os.write(made_w, b"n")
                os.read(done_r, 1)  # until its namespace is held
            finally:
                os._exit(0)
        os.close(made_w)
        os.close(done_r)
        try:
            if os.read(made_r, 1) != b"n":
                raise OSError(errno.EPERM, "cannot make a network namespace of the runs' user namespace")
            return os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            os.close(done_w)
            os.close(made_r)
            while True:
                try:
                    os.waitpid(pid, 0)
                    break
                except InterruptedError:
                    continue
                except ChildProcessError:
                    break

    def enter_own_network(self, calls: Syscalls) -> None:
        """In a world's PID 1 that stays the host's root (``programs_join``): into the network
        namespace its forker made for it (``network``, made by :meth:`make_network`)."""
        if self.network is None:
            raise OSError(errno.EINVAL, "no network namespace was made for this world")
        network, self.network = self.network, None
        try:
            calls.setns(network, CLONE_NEWNET)
        finally:
            os.close(network)


def _nest(calls: Syscalls) -> None:
    """A user namespace of this process's own inside the runs' (its root theirs): the kernel
    counts RLIMIT_NPROC per user namespace and uid, so that the limit bounds what this process
    starts alone, where no cgroup bounds it. (Their other uids are not mapped there.) (The uid
    change made this process undumpable, which gives its /proc files to the host's root: dumpable
    again while it writes its maps, and undumpable after.)"""
    calls.unshare(CLONE_NEWUSER)
    calls.libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    write_text("/proc/self/setgroups", "deny")
    write_text("/proc/self/uid_map", "0 0 1\n")
    write_text("/proc/self/gid_map", "0 0 1\n")
    calls.libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _idmapped_clone(calls: Syscalls, source: str, target: str, userns: int, read_only: bool) -> None:
    """``Syscalls.idmapped_clone``, failing with the words the server shows where the kernel
    refuses: which file system refused (``this kernel's tmpfs refuses idmapped mounts (...)``)."""
    try:
        calls.idmapped_clone(source, target, userns, read_only)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        kind = file_system_type(source)
        raise OSError(
            exc.errno, f"this kernel's {kind} refuses idmapped mounts ({source}: {os.strerror(exc.errno)})"
        ) from None


def file_system_type(path: str) -> str:
    """The type of the file system ``path`` is on (``tmpfs``, ``overlay``, ``9p``...), read off
    this process's mount table (the last mount at the longest mount point above it), or ``a file
    system`` where it cannot be told."""
    path = os.path.realpath(path)
    found, longest = "a file system", -1
    try:
        with open("/proc/self/mountinfo") as mountinfo:
            for line in mountinfo:
                fields = line.split()
                point = fields[4].replace("\\040", " ")
                below = path == point or path.startswith(point.rstrip("/") + "/")
                if below and len(point) >= longest:
                    found, longest = fields[fields.index("-") + 1], len(point)
    except (OSError, ValueError, IndexError):
        pass
    return found
