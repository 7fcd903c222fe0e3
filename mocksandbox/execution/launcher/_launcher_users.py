"""Uid maps: runs as an unprivileged range of host uids, in a user namespace of their own
(:class:`RunUsers`), made once in the launcher and entered by each relay of a world.

Kernels' worlds use it too (``mocksandbox/jupyter/_zygote.py``).
"""

import os

from _launcher_syscalls import (
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    MS_NODEV,
    MS_NOSUID,
    MS_REC,
    MS_SLAVE,
    PR_SET_DUMPABLE,
    Syscalls,
    write_text,
)


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
    """

    def __init__(self, config: dict, calls: Syscalls) -> None:
        users = config["userns"]
        self.uid, self.gid, self.count = users["uid"], users["gid"], users["count"]
        self.self_mapped = bool(users.get("self_mapped"))
        self.nested = bool(users.get("nested"))
        self.userns = self.base = -1
        #: The server's uid as the relays' parent namespace sees it.
        self.outside_uid, self.outside_gid = self.uid, self.gid
        if self.self_mapped:
            if users.get("runs_tmpfs"):
                self._own_runs_tmpfs(config["runs_root"], users["runs_tmpfs"], calls)
                os.mkdir(config["scratch"], 0o700)  # (the host's is under the tmpfs now)
            return
        calls.unshare(CLONE_NEWNS)
        calls.mount(None, "/", None, MS_REC | MS_SLAVE)
        self.userns = self._make_namespace(calls)
        base = config["scratch"]
        calls.mount("tmpfs", base, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
        os.mkdir(base + "/lower", 0o755)
        calls.idmapped_clone("/", base + "/lower", self.userns, read_only=True)
        for index, root in enumerate(config["mapped_roots"]):
            os.mkdir(f"{base}/m{index}", 0o755)
            calls.idmapped_clone(root, f"{base}/m{index}", self.userns, read_only=False)
        self.base = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def _own_runs_tmpfs(self, runs_root: str, options: str, calls: Syscalls) -> None:
        """A server that is not root cannot mount the runs' tmpfs on the host: the launcher moves
        into a user and a mount namespace of its own (its root the server's uid) and mounts it
        there, sized, over the runs' dir. Relays inherit it; the server reaches it through
        ``/proc/<launcher>/root`` (``RunsRoot.seen_through``); it is gone with the launcher."""
        calls.unshare(CLONE_NEWUSER | CLONE_NEWNS)
        write_text("/proc/self/setgroups", "deny")
        write_text("/proc/self/uid_map", f"0 {self.uid} 1\n")
        write_text("/proc/self/gid_map", f"0 {self.gid} 1\n")
        calls.mount(None, "/", None, MS_REC | MS_SLAVE)
        calls.mount("tmpfs", runs_root, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0700,{options}")
        self.outside_uid = self.outside_gid = 0  # the relays' namespaces nest in this one

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
            # A user namespace of this relay's own inside the runs' (its root theirs): the kernel
            # counts RLIMIT_NPROC per user namespace and uid, so that the limit bounds this relay's
            # runs alone, where no cgroup bounds them. (Their other uids are not mapped there.)
            # (The uid change made this process undumpable, which gives its /proc files to the
            # host's root: dumpable again while it writes its maps, and undumpable after.)
            calls.unshare(CLONE_NEWUSER)
            calls.libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
            write_text("/proc/self/setgroups", "deny")
            write_text("/proc/self/uid_map", "0 0 1\n")
            write_text("/proc/self/gid_map", "0 0 1\n")
            calls.libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        calls.unshare(CLONE_NEWPID)
