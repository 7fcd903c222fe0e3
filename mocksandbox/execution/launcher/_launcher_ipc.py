"""What runs leave in a relay's IPC namespace, and a new namespace where they left anything
(:class:`RunIpc`, held by a relay's world: ``_launcher_world``).

SysV shared memory, semaphores and message queues and POSIX message queues outlive the processes
that made them: the next run of a relay must find none of a run's, nor may runs pile them up,
each holding memory. After each run the relay counts them (a handful of calls); where it finds
any, or cannot tell, it enters a new IPC namespace, which its next run inherits.
"""

import os

from _launcher_syscalls import CLONE_NEWIPC, MS_NODEV, MS_NOEXEC, MS_NOSUID, Syscalls


class RunIpc:
    """The relay's IPC namespace as runs leave it: counted after each run, renewed when dirty."""

    def __init__(self, calls: Syscalls, mqueue: str) -> None:
        self.calls = calls
        #: Whether the relay's IPC namespace holds what a run left, which the next run must not
        #: find (a renewal failed: see renew).
        self.dirty = False
        #: The POSIX message queues of the relay's IPC namespace, where they can be seen (else
        #: every run's namespace is a new one: see left).
        self.mqueue: str | None = mqueue
        #: The size of the queues' root in a new namespace, which holds no queue.
        self.mqueue_empty = 0
        self._mount_mqueue()

    def left(self) -> bool:
        """Once a run's processes are gone: whether it left anything in the relay's IPC namespace.
        Counted in four calls; where the queues cannot be seen, always."""
        try:
            if self.mqueue is None or os.stat(self.mqueue).st_size != self.mqueue_empty:
                return True  # (its root's size is 20 bytes a queue over its empty size)
            return self.calls.sysv_ipc_objects() != 0
        except OSError:
            return True

    def renew(self) -> None:
        """A new IPC namespace for the relay, which its next run inherits; what the last run left
        goes with the old one, which its last process has left. The seccomp filter lets this one
        ``unshare`` through; a program, without ``CAP_SYS_ADMIN``, is refused it by the kernel."""
        self.dirty = True
        self.calls.unshare(CLONE_NEWIPC)
        self.dirty = False
        if self.mqueue is not None:
            try:
                self.calls.umount(self.mqueue)
            except OSError:
                pass
            self._mount_mqueue()

    def _mount_mqueue(self) -> None:
        """The POSIX message queues of the relay's IPC namespace (a mount sees the namespace it
        was made in) at :attr:`mqueue`, or ``None`` there where they cannot be seen."""
        try:
            self.calls.mount("mqueue", self.mqueue, "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            self.mqueue_empty = os.stat(self.mqueue).st_size
        except OSError:
            self.mqueue = None
