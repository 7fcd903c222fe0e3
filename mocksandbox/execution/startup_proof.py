"""What the start-up run tries and is refused (issue 50): each protection of the doctor's table
proven by the run doing the thing, not read off the configuration.

The start-up run (``ExecutionEngine.prove_isolation``) is one bash command in a world, on the
server's start path: every try here is a shell builtin or a read of what the kernel says, but for
one short Python (the seccomp probe: bash cannot make an arbitrary system call). Nothing hostile
runs at start-up: no fork bomb, no memory filled; a bound is read back from the run's own limits
(its rlimits, or its cgroup's files read from here) instead.

What each try found is a :class:`Proof`: ``refused`` (proven), ``done`` (the run could do it: the
protection does not hold, whatever the configuration says) or ``untried`` (configured, not proven
here, with why). ``protections.protections`` turns them into the table's words.
"""

from __future__ import annotations

import os
import platform
import secrets
import shlex
import socket
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from mocksandbox.execution.confinement import Confinement
    from mocksandbox.execution.world import Isolation

#: ``refused``: tried and refused (proven); ``done``: the run could do it; ``untried``: not tried
#: here (the proof's ``what`` says why).
Outcome = Literal["refused", "done", "untried"]

#: ``keyctl``'s number, by machine: a call any process may make (``KEYCTL_GET_KEYRING_ID`` of its
#: user keyring) but that the seccomp filter refuses with ``EPERM``.
_KEYCTL = {"x86_64": 250, "aarch64": 219}
#: Where a root server's cgroups are mounted (v1: one hierarchy per controller below it).
_CGROUP_ROOT = Path("/sys/fs/cgroup")
#: What the start-up run prints its tries' results after, one ``proof:<name>:<result>`` a line.
PREFIX = "proof:"


@dataclass(frozen=True)
class Proof:
    """What the start-up run tried of one protection, and what came of it."""

    outcome: Outcome
    #: What it tried and what came of it (``refused``, ``done``), or why it was not tried.
    what: str


class StartupProbe:
    """The tries of one start-up run: the canaries it needs on the host (a file it can see, a
    loopback listener), the shell it runs, and what its output proves. Use as a context manager:
    the canaries live while the run does."""

    def __init__(self, isolation: Isolation, confinement: Confinement | None, python: str) -> None:
        self._isolation = isolation
        self._confinement = confinement
        self._python = python
        self._token = secrets.token_hex(8)
        self._canary: str | None = None
        self._canary_why = ""
        self._listener: socket.socket | None = None
        self._masked = _masked_file(isolation.hidden_paths)

    def __enter__(self) -> StartupProbe:
        self._canary, self._canary_why = _make_canary(self._token)
        listener = socket.socket()
        try:
            listener.bind(("127.0.0.1", 0))
            listener.listen(4)
            listener.setblocking(False)
        except OSError:
            listener.close()
        else:
            self._listener = listener
        return self

    def __exit__(self, *exc: object) -> None:
        if self._listener is not None:
            self._listener.close()
        if self._canary is not None:
            try:
                os.unlink(self._canary)
            except OSError:
                pass

    def command(self) -> str:
        """The shell the start-up run runs after its own line (builtins but for one Python)."""
        parts = []
        server = os.getpid()
        if server > 64:  # (a pid a run's own namespace has not reached: it could only be the server)
            parts.append(
                f'kill -0 {server} 2>/dev/null && k=reached || k=refused; echo "{PREFIX}processes:$k"'
            )
        if self._canary is not None:
            # Read (it must be in the run's view, or the try proves nothing), overwritten, deleted.
            canary = shlex.quote(self._canary)
            parts.append(
                f"t=; read -r t < {canary} 2>/dev/null; "
                f"{{ echo changed > {canary}; }} 2>/dev/null && w=written || w=refused; "
                f"rm -f {canary} 2>/dev/null && d=deleted || d=kept; "
                f'echo "{PREFIX}files:${{t:-unseen}} $w $d"'
            )
        if self._listener is not None:
            port = self._listener.getsockname()[1]
            parts.append(
                f"n=$( (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>&1 && echo reached); "
                "case $n in *reached*) n=reached;; *refused*|*unreachable*) n=refused;; *) n=other;; esac; "
                f'echo "{PREFIX}network:$n"'
            )
        if self._masked is not None:
            parts.append(
                f'[ -s {shlex.quote(self._masked[0])} ] && s=seen || s=empty; echo "{PREFIX}secrets:$s"'
            )
        number = _KEYCTL.get(platform.machine())
        if number is not None:
            code = (
                "import ctypes; c = ctypes.CDLL(None, use_errno=True); "
                f"r = c.syscall({number}, 0, -4, 0); print('{PREFIX}seccomp:%d %d' % (r, ctypes.get_errno()))"
            )
            parts.append(f"{shlex.quote(self._python)} -I -S -c {shlex.quote(code)} 2>/dev/null")
        # The run's own limits: its rlimits, and the cgroups the kernel says it is in.
        parts.append(f'echo "{PREFIX}ulimit:$(ulimit -u) $(ulimit -d) $(ulimit -f)"')
        parts.append(f'while read -r g; do echo "{PREFIX}cgroup:$g"; done < /proc/self/cgroup')
        return "; ".join(parts) + "; true"

    def results(self, lines: list[str]) -> dict[str, Proof]:
        """What the run's output (its ``proof:`` lines) and the host's canaries prove, by name of
        protection; call before the canaries are gone (inside the ``with``)."""
        said: dict[str, list[str]] = {}
        for line in lines:
            if line.startswith(PREFIX):
                name, _, value = line[len(PREFIX) :].partition(":")
                said.setdefault(name, []).append(value)
        first = {name: values[0] for name, values in said.items()}
        proofs = {
            "files": self._files(first.get("files")),
            **_processes(first.get("processes")),
            "network": self._network(first.get("network")),
            "secrets": self._secrets(first.get("secrets")),
            "seccomp": _seccomp(first.get("seccomp")),
        }
        proofs.update(_bounds(self._confinement, first.get("ulimit", ""), said.get("cgroup", [])))
        return proofs

    def _files(self, said: str | None) -> Proof:
        if self._canary is None:
            return Proof("untried", self._canary_why)
        words = (said or "").split()
        if len(words) != 3 or words[0] != self._token:
            return Proof("untried", f"the run did not see the canary file {self._canary}")
        try:
            unchanged = Path(self._canary).read_text() == self._token + "\n"
        except OSError:
            unchanged = False
        if not unchanged:
            return Proof("done", f"the start-up run changed or deleted a host file ({self._canary})")
        if words[1:] == ["refused", "kept"]:
            return Proof("refused", "a write to a host file was refused")
        return Proof("refused", "a host file it overwrote and deleted is unchanged on the host")

    def _network(self, said: str | None) -> Proof:
        if self._listener is None:
            return Proof("untried", "no loopback port to listen on here")
        try:
            # (The kernel's word: a connection the listener holds, whatever the run printed.)
            self._listener.accept()[0].close()
            reached = True
        except OSError:
            reached = said == "reached"
        if reached:
            return Proof("done", "the start-up run connected to a port the server listens on at 127.0.0.1")
        if said == "refused":
            return Proof("refused", "a connect to a host loopback port was refused")
        return Proof("untried", "the run's shell could not try a connect (/dev/tcp)")

    def _secrets(self, said: str | None) -> Proof:
        if self._masked is None:
            return Proof("untried", "no masked file with content on this host")
        path, size = self._masked
        if said == "empty":
            return Proof("refused", f"{path} ({size} bytes here) was empty to it")
        if said == "seen":
            return Proof("done", f"the start-up run saw {path} whole ({size} bytes)")
        return Proof("untried", "the run did not say what it saw")


def _make_canary(token: str) -> tuple[str | None, str]:
    """A file the server owns in a host dir runs see through their copy-on-write root (not the
    temp dir: a server that is not root starts runs with an empty /tmp), readable by anyone so that
    only the world keeps it from a change; ``(None, why)`` where none could be made."""
    for directory in ("/var/tmp", os.path.expanduser("~")):
        try:
            fd, path = tempfile.mkstemp(prefix=".mocksandbox-proof-", dir=directory)
        except OSError:
            continue
        with os.fdopen(fd, "w") as canary:
            canary.write(token + "\n")
        os.chmod(path, 0o644)
        return path, ""
    return None, "no host dir (/var/tmp, the server's home) to put a canary file in"


def _masked_file(hidden: tuple[str, ...]) -> tuple[str, int] | None:
    """The first masked path that is a file with content here (its size: what the run must not see)."""
    for path in hidden:
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_size > 0:
            return path, info.st_size
    return None


def _processes(said: str | None) -> dict[str, Proof]:
    """What a signal to the server's pid found (none where the server's pid is too small to try)."""
    if said == "refused":
        return {
            "processes": Proof(
                "refused", f"a signal to the server's pid ({os.getpid()}) found no such process"
            )
        }
    if said == "reached":
        return {"processes": Proof("done", f"the start-up run could signal the server's pid ({os.getpid()})")}
    return {}


def _seccomp(said: str | None) -> Proof:
    if said is None:
        return Proof("untried", "no keyctl probe here (no run Python, or no keyctl number for this machine)")
    result, _, error = said.partition(" ")
    if result == "-1" and error == "1":
        return Proof("refused", "keyctl was refused with the filter's EPERM")
    if result.lstrip("-").isdigit() and int(result) >= 0:
        return Proof("done", "the start-up run made keyctl, which the filter refuses")
    return Proof("untried", f"keyctl failed with errno {error}, not the filter's EPERM")


def _bounds(confinement: Confinement | None, ulimits: str, cgroups: list[str]) -> dict[str, Proof]:
    """The run's own process and memory limits, read back: its cgroup's files (the cgroups the
    kernel says it is in, read from here), or its rlimits (``ulimit``) where there are no cgroups.
    The scratch bound is not tried: it would take filling it."""
    proofs = {"scratch bound": Proof("untried", "not filled at start-up")}
    if confinement is None:
        return proofs
    memory_bytes = getattr(confinement, "max_memory_bytes", 0)
    if confinement.name == "cgroup":
        version = getattr(confinement, "version", 1)
        processes = _cgroup_value(cgroups, version, "pids", "pids.max")
        proofs["process bound"] = _read_back(
            processes, str(getattr(confinement, "max_processes", "")), "cgroup's pids.max"
        )
        memory_file = "memory.limit_in_bytes" if version == 1 else "memory.max"
        memory = _cgroup_value(cgroups, version, "memory", memory_file)
        # (The kernel rounds a limit down to whole pages.)
        near = memory is not None and memory.isdigit() and memory_bytes - 65536 < int(memory) <= memory_bytes
        expected = memory if near and memory is not None else str(memory_bytes)
        proofs["memory bound"] = _read_back(memory, expected, f"cgroup's {memory_file}")
        return proofs
    words = ulimits.split()
    if len(words) != 3:
        return {**proofs, "process bound": Proof("untried", "the run did not say its rlimits")}
    limit = getattr(confinement, "process_limit", lambda: None)()
    if limit is not None:
        proofs["process bound"] = _read_back(words[0], str(limit), "RLIMIT_NPROC")
    kilobytes = str(memory_bytes // 1024)
    proofs["memory bound"] = _read_back(words[1], kilobytes, "RLIMIT_DATA (KiB)")
    proofs["scratch bound"] = _read_back(words[2], kilobytes, "RLIMIT_FSIZE (KiB)")
    return proofs


def _read_back(found: str | None, expected: str, what: str) -> Proof:
    """Whether the run's own limit ``what``, as ``found``, is the ``expected`` one."""
    if found is None:
        return Proof("untried", f"the run's {what} could not be read back")
    if found == expected and found not in ("max", "unlimited"):
        return Proof("refused", f"the run's {what} read back as {found}")
    return Proof("done", f"the start-up run's {what} was {found}, not {expected}")


def _cgroup_value(cgroups: list[str], version: int, controller: str, name: str) -> str | None:
    """``name`` of the run's cgroup in ``controller`` (``/proc/self/cgroup`` as the run read it),
    read from here; ``None`` where it cannot be."""
    for line in cgroups:
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if version == 1 and controller in controllers.split(","):
            where = _CGROUP_ROOT / controller / path.lstrip("/") / name
        elif version != 1 and controllers == "":
            where = _CGROUP_ROOT / path.lstrip("/") / name
        else:
            continue
        try:
            return where.read_text().strip()
        except OSError:
            return None
    return None
