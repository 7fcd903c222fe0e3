"""The launcher's system calls: the libc calls a run's world needs, bound once by ctypes.

What lasts is bound once, in the launcher (:class:`Syscalls`); forked relays and programs share
the bindings and the buffers. Also the kernel's numbers the world's parts pass to them (namespace
and mount flags), :func:`become_subreaper` (the launcher's, and a local Ray's parent's) and
:func:`write_text` (one write to a ``/proc`` file: uid maps, tunables).

Imports no other module of the launcher: the server imports it too, as
``mocksandbox.execution.launcher._launcher_syscalls`` (for :func:`become_subreaper`).
"""

import _socket
import fcntl as _fcntl
import os
import sys

try:
    import ctypes
except ImportError:  # an interpreter built without libffi
    ctypes = None

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
PR_SET_DUMPABLE = 4
_MNT_DETACH = 2
_PR_SET_CHILD_SUBREAPER = 36
# What is left in an IPC namespace (see _launcher_ipc.RunIpc.left): the INFO commands of shmctl,
# semctl, msgctl.
_SHM_INFO = 14
_SEM_INFO = 19
_MSG_INFO = 12
# inotify: a kept root's changes (see KeptRoot). Every change of a dir's entries or of an inode's
# attributes (mode, owner, times set, extended attributes) or contents; not reads, opens or closes.
_IN_CHANGES = 0x2 | 0x4 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800
#: An attribute of a watched dir, or of an entry of it, changed (mode, owner, times, xattrs, links).
IN_ATTRIB = 0x4
#: Set in an event's mask where the inode it is about is a dir.
IN_ISDIR = 0x40000000
_IN_ONLYDIR = 0x01000000
_IN_DONT_FOLLOW = 0x02000000
# The new mount API (the same numbers on every architecture): idmapped mounts.
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_OPEN_TREE_CLONE = 1
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 4
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_MOUNT_ATTR_IDMAP = 0x100000
_PR_CAPBSET_DROP = 24
_PR_SET_SECCOMP = 22
_PR_SET_MM = 35
_PR_SET_MM_MAP = 14
#: The smallest command-line buffer a relay makes (``python <file>`` of a run fits many times).
_COMMAND_LINE_BYTES = 4096
_SECCOMP_MODE_FILTER = 2
_CAP_LAST = 63
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 1


def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (Linux ``PR_SET_CHILD_SUBREAPER``):
    a process whose parent dies is handed to it, not to the host's init. False where the kernel
    or libc refuses."""
    if ctypes is None:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def write_text(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def loopback_up() -> None:
    """``ip link set lo up``: SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP (a struct ifreq: the
    name in 16 bytes, then the flags; packed by hand: the relay imports as little as it can,
    since every page it touches is copied at each fork)."""
    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        request = b"lo".ljust(16, b"\0") + bytes(24)
        answer = _fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request)
        flags = int.from_bytes(answer[16:18], sys.byteorder) | _IFF_UP
        _fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, answer[:16] + flags.to_bytes(2, sys.byteorder) + bytes(22))
    finally:
        sock.close()


class Syscalls:
    """The libc calls the world needs, bound once in the launcher (forked relays share them)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.libc = libc
        text = ctypes.c_char_p
        libc.mount.argtypes = (text, text, text, ctypes.c_ulong, text)
        libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
        libc.unshare.argtypes = (ctypes.c_int,)
        libc.setns.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
        libc.inotify_add_watch.argtypes = (ctypes.c_int, text, ctypes.c_uint32)

        class _CapHeader(ctypes.Structure):
            _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))

        class _CapData(ctypes.Structure):
            _fields_ = (
                ("effective", ctypes.c_uint32),
                ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32),
            )

        self._ipc_info = (ctypes.c_int * 32)()  # (any of the three INFO structs, read as ints)
        #: The calls drop_bounding_set makes (their arguments, made once), per set kept, and the
        #: prctl it makes them with: its arguments made already, nothing left to convert.
        self._bounding_drops: dict = {}
        self._prctl_unchecked = ctypes.CDLL(None, use_errno=True).prctl
        self._mm_map = None
        self._command_line = b""  # (a ctypes buffer once a relay makes one)
        self._command_line_wanted = False
        self._set_mm_map_args: tuple = ()
        self._layout: list = []
        self._layout_of = 0
        libc.sbrk.restype = ctypes.c_void_p
        self._cap_header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
        self._cap_data = (_CapData * 2)()
        self._capset = libc.capset
        self._capset_args = (ctypes.byref(self._cap_header), self._cap_data)
        #: fork(2) as the C library makes it, the GIL held, where CPython's own work around
        #: ``os.fork`` is none a relay needs (see :meth:`fork`); else ``None``.
        self.plain_fork = None
        if sys.implementation.name == "cpython" and (3, 8) <= sys.version_info[:2] <= (3, 10):
            self.plain_fork = ctypes.PyDLL(None, use_errno=True).fork
            self.plain_fork.restype = ctypes.c_int
            self.plain_fork.argtypes = ()

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"{what}: {os.strerror(error)}")

    def trim_heap(self) -> None:
        """Give the C heap's free pages back to the kernel (glibc's ``malloc_trim``; nothing where
        the libc has none). Every page a process holds costs each of its forks a page table entry
        to copy and the child's exit one to clear: what start-up freed (import's file buffers,
        mostly; about 0.7 MB) would otherwise be copied by every relay and every program."""
        trim = getattr(self.libc, "malloc_trim", None)
        if trim is not None:
            trim(0)

    def fork(self) -> int:
        """A relay's fork of its program: ``os.fork`` without CPython's work around it, where
        :attr:`plain_fork` is (CPython 3.8 to 3.10; ``os.fork`` elsewhere).

        That work is for a process of several threads: the import lock taken and given back, the
        GIL's and the runtime's locks made anew in the child (each a ``malloc``), the other
        threads' states dropped, the hooks of ``os.register_at_fork`` run. A relay has one thread,
        holds none of those locks when it forks (the GIL is held through this call, which is a
        ``PyDLL``'s) and registers no hook; the program gets the interpreter as it was, about 20
        pages fewer to copy (and the relay 10), some 3% of a run's CPU. The one thing left to the
        child is a signal the relay had pending (caught, not yet handled) when it forked, which
        ``os.fork`` would have cleared: its only handler, ``end_the_run``, acts in the relay alone
        (``state.RELAY_PID``). Later versions do more in the child (3.11 the thread's native id,
        3.12 the perf trampoline, 3.13 the stop-the-world state): they keep ``os.fork``."""
        if self.plain_fork is None:
            return os.fork()
        pid = self.plain_fork()
        if pid < 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error))
        return pid

    def unshare(self, flags: int) -> None:
        self._check(self.libc.unshare(flags), "unshare")

    def setns(self, fd: int, kind: int) -> None:
        self._check(self.libc.setns(fd, kind), "setns")

    def mount(self, source, target: str, fstype, flags: int, data=None) -> None:
        encoded = (source and source.encode(), target.encode(), fstype and fstype.encode())
        if self.libc.mount(*encoded, flags, data and data.encode()) != 0:
            self._check(-1, f"mount {fstype or source} on {target}")  # (its words only if it failed)

    def umount(self, target: str) -> None:
        if self.libc.umount2(target.encode(), _MNT_DETACH) != 0:
            self._check(-1, f"umount {target}")

    def sysv_ipc_objects(self) -> int:
        """How many SysV shared memory segments, semaphore sets and message queues this process's
        IPC namespace holds (``struct shm_info``'s ``used_ids``, ``struct seminfo``'s ``semusz``,
        ``struct msginfo``'s ``msgpool``)."""
        info, libc = self._ipc_info, self.libc
        if libc.shmctl(0, _SHM_INFO, info) < 0:
            self._check(-1, "shmctl SHM_INFO")
        count = info[0]
        if libc.semctl(0, 0, _SEM_INFO, info) < 0:
            self._check(-1, "semctl SEM_INFO")
        count += info[7]
        if libc.msgctl(0, _MSG_INFO, info) < 0:
            self._check(-1, "msgctl MSG_INFO")
        return count + info[0]

    def watch_changes(self, dirs: list) -> tuple:
        """An inotify descriptor (non-blocking) that has an event once anything in ``dirs``, or
        any of them, changes (:data:`_IN_CHANGES`), and the watch descriptor of each dir."""
        fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)  # (IN_NONBLOCK, IN_CLOEXEC)
        if fd < 0:
            self._check(-1, "inotify_init1")
        watches = []
        try:
            for path in dirs:
                mask = _IN_CHANGES | _IN_ONLYDIR | _IN_DONT_FOLLOW
                watch = self.libc.inotify_add_watch(fd, path.encode(), mask)
                if watch < 0:
                    self._check(-1, f"inotify_add_watch {path}")
                watches.append(watch)
        except OSError:
            os.close(fd)
            raise
        return fd, watches

    def idmapped_clone(self, source: str, target: str, userns_fd: int, read_only: bool) -> None:
        """Mount a copy of the mount at ``source`` (not its submounts) on ``target``, its owners
        shifted by the user namespace ``userns_fd``'s map: a file the host's uid 0 owns is owned
        by that namespace's root there, and what its root writes is stored as the host's uid 0."""
        syscall = self.libc.syscall
        syscall.restype = ctypes.c_long
        fd = syscall(_SYS_OPEN_TREE, _AT_FDCWD, source.encode(), _OPEN_TREE_CLONE | os.O_CLOEXEC)
        if fd < 0:
            self._check(-1, f"open_tree {source}")
        try:
            flags = _MOUNT_ATTR_IDMAP | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
            flags |= _MOUNT_ATTR_RDONLY if read_only else 0
            attr = ctypes.create_string_buffer(
                b"".join(v.to_bytes(8, sys.byteorder) for v in (flags, 0, 0, userns_fd)), 32
            )
            result = syscall(_SYS_MOUNT_SETATTR, fd, b"", _AT_EMPTY_PATH, attr, ctypes.c_size_t(32))
            self._check(0 if result == 0 else -1, f"an idmapped mount of {source}")
            result = syscall(_SYS_MOVE_MOUNT, fd, b"", _AT_FDCWD, target.encode(), _MOVE_MOUNT_F_EMPTY_PATH)
            self._check(0 if result == 0 else -1, f"move_mount {source} to {target}")
        finally:
            os.close(fd)

    def drop_bounding_set(self, keep: set) -> None:
        """Every capability but ``keep`` out of this process's bounding set. (A program that joins
        the runs' user namespace itself does this at each run: the capabilities to drop are worked
        out once, and each is one call.)"""
        drop = self._bounding_drops.get(frozenset(keep))
        if drop is None:
            try:
                with open("/proc/sys/kernel/cap_last_cap") as last:
                    last_cap = int(last.read())
            except (OSError, ValueError):
                last_cap = _CAP_LAST
            zero = ctypes.c_ulong(0)
            drop = tuple(
                (ctypes.c_int(_PR_CAPBSET_DROP), ctypes.c_ulong(cap), zero, zero, zero)
                for cap in range(min(last_cap, _CAP_LAST) + 1)
                if cap not in keep
            )
            self._bounding_drops[frozenset(keep)] = drop
        prctl = self._prctl_unchecked
        for arguments in drop:
            if prctl(*arguments) != 0 and ctypes.get_errno() == 22:
                break  # EINVAL: past the kernel's last capability

    def prepare_capabilities(self, keep: set) -> None:
        low = sum(1 << cap for cap in keep if cap < 32)
        high = sum(1 << (cap - 32) for cap in keep if cap >= 32)
        self._cap_data[0].effective = self._cap_data[0].permitted = low
        self._cap_data[1].effective = self._cap_data[1].permitted = high

    def prepare_filter(self, program: bytes) -> None:
        """Keep a seccomp filter (classic BPF, from ``mocksandbox/execution/syscall_filter.py``)
        ready for :meth:`install_filter`: built once, so that a program pays one ``prctl``."""
        self._filter_code = ctypes.create_string_buffer(program, len(program))
        # struct sock_fprog: an unsigned short count, then a pointer (aligned).
        self._filter = ctypes.create_string_buffer(16)
        ctypes.memmove(self._filter, (len(program) // 8).to_bytes(2, sys.byteorder), 2)
        pointer = ctypes.addressof(self._filter_code).to_bytes(8, sys.byteorder)
        ctypes.memmove(ctypes.addressof(self._filter) + 8, pointer, 8)

    def install_filter(self) -> None:
        """In a world's first process, while it may (CAP_SYS_ADMIN in its user namespace): the
        filter, for it and everything it starts."""
        result = self.libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(self._filter), 0, 0)
        self._check(result, "seccomp")

    def prepare_command_line(self, argv: "list | None") -> None:
        """In a relay, before it forks a warm Python program: what its ``/proc/self/cmdline`` (and
        ``ps``) must say (``python <file>``, as a spawned one's would), instead of the launcher's own
        command line. The new argument area lives in this relay's buffer, which the fork copies to
        the same address; the rest of the map is this process's, which the fork keeps as is.

        The buffer and the map are made once per relay (its code, data and stack stay put; a
        command line longer than the buffer gets a new one): a run writes its arguments into the
        buffer and updates the map's argument end and program break, rather than building both
        anew (fewer pages written in the relay before each fork, each one then copied on write)."""
        if argv is None:
            self._command_line_wanted = False
            return
        payload = b"\0".join(arg.encode() for arg in argv) + b"\0"
        if self._layout_of != os.getpid() or len(payload) > len(self._command_line):
            self._make_command_line_map(len(payload))
        ctypes.memmove(self._command_line, payload, len(payload))
        mm_map = self._mm_map
        mm_map.arg_end = mm_map.arg_start + len(payload)
        mm_map.brk = self.libc.sbrk(0) or 0
        self._command_line_wanted = True

    def _make_command_line_map(self, size: int) -> None:
        """This relay's command-line buffer (at least ``size`` bytes) and the ``prctl_mm_map``
        pointing at it, from its ``/proc/self/stat``."""
        if self._layout_of != os.getpid():  # read once per relay
            with open("/proc/self/stat", "rb") as stat:
                self._layout = stat.read().rsplit(b")", 1)[1].split()
            self._layout_of = os.getpid()
        fields = self._layout

        def field(number: int) -> int:  # proc(5) numbers the fields from 1; two precede ")"
            return int(fields[number - 3])

        self._command_line = ctypes.create_string_buffer(max(size, _COMMAND_LINE_BYTES))
        start = ctypes.addressof(self._command_line)
        self._mm_map = _MmMap(
            field(26), field(27), field(45), field(46), field(47), 0, field(28),
            start, start, field(50), field(51), 0, 0, 0xFFFFFFFF,
        )  # fmt: skip
        self._set_mm_map_args = (
            _PR_SET_MM, _PR_SET_MM_MAP, ctypes.addressof(self._mm_map), ctypes.sizeof(self._mm_map), 0
        )  # fmt: skip

    def set_command_line(self) -> None:
        """In the forked program, while it may (CAP_SYS_ADMIN in its user namespace: the prctl is
        checkpoint/restore's): the command line :meth:`prepare_command_line` made. Best effort: a
        program that cannot keeps the launcher's (which names nothing hidden from it)."""
        if self._command_line_wanted:
            self.libc.prctl(*self._set_mm_map_args)

    def reduce_capabilities(self) -> None:
        """In a forked program: effective and permitted down to the kept set, nothing inheritable
        (an ``execve`` gives root the bounding set anyway; a forked Python program execs nothing)."""
        self._check(self._capset(*self._capset_args), "capset")


if ctypes is not None:

    class _MmMap(ctypes.Structure):
        """``struct prctl_mm_map`` (linux/prctl.h)."""

        _fields_ = (
            *((name, ctypes.c_uint64) for name in (
                "start_code", "end_code", "start_data", "end_data", "start_brk", "brk", "start_stack",
                "arg_start", "arg_end", "env_start", "env_end", "auxv",
            )),
            ("auxv_size", ctypes.c_uint32),
            ("exe_fd", ctypes.c_uint32),
        )  # fmt: skip
