"""The system calls a run in a world may not make: a seccomp filter like Docker's default profile.

SandboxFusion runs its programs in a Docker container, whose default seccomp profile refuses the
calls that reach past the container into the kernel: the keyrings (not namespaced: a run could read
the keys of the server's user), mounts and new namespaces (the way to a fresh set of capabilities
and the kernel's least-tested code), kernel modules, BPF, ``perf_event_open``, ``userfaultfd``, the
clock, swap, reboot. The same list is refused here, with ``EPERM`` as there (``clone3`` with
``ENOSYS``, as there, so that C libraries fall back to ``clone``, whose flags a filter can read).

Mounts (``mount``, ``umount2``) are left to the kernel's own check, as Docker's profile leaves them:
it allows them to a container that holds ``CAP_SYS_ADMIN`` and refuses them to one that does not. A
run never holds it (nor can it: its bounding set is Docker's default capabilities), so the kernel
refuses them with ``EPERM``; the relay, which mounts each run's root, holds it in the runs' user
namespace. So is ``unshare(CLONE_NEWIPC)`` with no other flag: the relay gives each run an IPC
namespace of its own with it (``_launcher_ipc.RunIpc.renew``), and the kernel refuses it to a
run, for want of ``CAP_SYS_ADMIN``; every other ``unshare`` is refused here.

The filter is compiled here, with libseccomp (through ``pyseccomp``, a ctypes binding to the host's
``libseccomp.so.2``), into a classic BPF program; the launcher, which runs under the user's
interpreter and imports only the standard library, installs those bytes once in each world's relay
(``_launcher_world.World``), whose programs inherit it at their fork; but where a root server's
programs join the runs' user namespace themselves (without idmapped mounts: its relays stay the
host's root), each program installs it, once it has joined (it refuses ``setns``).
"""

from __future__ import annotations

import errno
import tempfile

#: Refused outright (``EPERM``): names as libseccomp knows them; those this architecture lacks are
#: left out.
DENIED_SYSCALLS = (
    # keyrings: not namespaced
    "add_key",
    "request_key",
    "keyctl",
    # mounts and namespaces (``mount`` and ``umount2``: see above)
    "umount",
    "pivot_root",
    "setns",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "open_by_handle_at",
    "name_to_handle_at",
    # the kernel itself
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "lookup_dcookie",
    "iopl",
    "ioperm",
    "acct",
    "quotactl",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "stime",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "nfsservctl",
    "vm86",
    "vm86old",
)

#: ``clone`` flags that make new namespaces: refused, as ``unshare`` is.
NAMESPACE_CLONE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x00000080,  # CLONE_NEWTIME
)


#: The one ``unshare`` the filter lets through (the kernel still asks for ``CAP_SYS_ADMIN``).
CLONE_NEWIPC = 0x08000000


class FilterUnavailable(RuntimeError):
    """No filter can be compiled here (no libseccomp); the message says what would give one."""


def compile_run_filter() -> bytes:
    """The runs' filter as a classic BPF program (``struct sock_filter`` records, 8 bytes each).
    Raises :class:`FilterUnavailable` where libseccomp cannot be had."""
    try:
        import pyseccomp as seccomp
    except ImportError as exc:
        raise FilterUnavailable(f"pyseccomp is not installed ({exc}): pip install pyseccomp") from None
    except OSError as exc:  # the binding loads libseccomp.so.2 at import
        raise FilterUnavailable(f"libseccomp is not installed ({exc}): apt-get install libseccomp2") from None
    try:
        rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
        for name in DENIED_SYSCALLS:
            try:
                rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
            except (RuntimeError, ValueError, OSError):
                continue  # not a system call of this architecture
        # unshare: refused but for CLONE_NEWIPC alone (see above).
        rules.add_rule(seccomp.ERRNO(errno.EPERM), "unshare", seccomp.Arg(0, seccomp.NE, CLONE_NEWIPC))
        for flag in NAMESPACE_CLONE_FLAGS:
            # x86-64 and most others pass clone's flags first; s390 second (libseccomp knows).
            rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        try:
            rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
        except (RuntimeError, ValueError, OSError):
            pass  # an older libseccomp, or an architecture without it
        with tempfile.TemporaryFile() as program:
            rules.export_bpf(program)
            program.seek(0)
            return program.read()
    except (RuntimeError, ValueError, OSError) as exc:
        raise FilterUnavailable(f"libseccomp could not compile the filter: {exc}") from None
