"""A fork server for IPython kernels, run as a script by mocksandbox's ``ForkServerLauncher``.

It runs under the interpreter chosen for user code, which need not have mocksandbox installed:
standard library and ipykernel only. It imports everything a kernel needs once, then forks a child
per kernel asked for; a child is ready to answer in ~0.2 s where ``python -m ipykernel_launcher``
takes over a second. Each child is a brand-new kernel process: nothing runs before the fork but
imports, so no state can pass from one kernel to the next.

Protocol, one JSON object per line: after the imports it writes ``{"ready": true, "pid": N}`` (or
``{"error": "..."}`` and exits); then for each ``{"argv": [...], "cwd": "..."}`` read it forks and
writes ``{"pid": N}`` (or ``{"error": "..."}``). It exits when its input closes (the server stopped,
or died), and kills first the process group of every kernel it forked; a kernel also polls this
process and exits when it is gone (killed itself, it can kill nothing).

With ``--launcher-dir=DIR`` (the server's isolation is ``lite``) a request may carry ``"world"``:
the kernel then gets a world of its own, as ``/run_code`` programs do (``DIR`` is mocksandbox's
launcher, ``mocksandbox/execution/launcher/``, whose ``_launcher_world.World`` makes it). The
child forked is PID 1 of a new PID namespace; it makes the world (namespaces, its scratch tmpfs
on ``world["scratch"]``, the mask, one overlay with the ``binds``), forks the kernel into it
(chroot, fewer capabilities) and lives as long as the kernel does, reaping what the kernel's code
leaves. Killing it ends every process of the world; it dies with this process.

Usage: ``python _zygote.py MARKER [--launcher-dir=DIR]`` (the marker, e.g. the pool's runtime
directory, only names this process and its kernels in ``ps``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from typing import IO, Any, NoReturn

#: Modules a kernel imports anyway, at start-up or for its first traceback.
_PRELOAD = (
    "ipykernel.debugger",
    "stack_data",
    "pygments.formatters.terminal256",
    "pygments.styles",
)


def _reply(stream: IO[str], message: dict[str, Any]) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def _run_kernel(
    request: dict[str, Any],
    protocol_in: IO[str] | None,
    protocol_out: IO[str] | None,
    launcher_path: str,
    in_world: bool = False,
) -> NoReturn:
    """In the child: become a kernel (never returns). In a world, its parent is the world's
    PID 1, which dies with the zygote: no parent poller then (ipykernel keeps none for pid 1)."""
    code = 1
    try:
        if not in_world:
            os.setsid()  # its own session and process group: killed as a group, apart from us
        for stream in (protocol_in, protocol_out):
            if stream is not None:
                stream.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # user code must be able to wait for children
        os.chdir(request["world"]["cwd"] if in_world else request["cwd"])
        os.environ["JPY_PARENT_PID"] = str(os.getppid())
        sys.argv = [launcher_path, *request["argv"]]
        if request.get("exec"):  # a fresh interpreter, as a spawned kernel
            os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *request["argv"]])
        from ipykernel.kernelapp import IPKernelApp

        # Its parent poller: the default comes from JPY_PARENT_PID as it was when the zygote
        # imported ipykernel, before any kernel's, so it is set here or there is no poller at all.
        IPKernelApp.launch_instance(argv=request["argv"], parent_handle=os.getppid())
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


_CLONE_NEWPID = 0x20000000
_PR_SET_PDEATHSIG = 1


def _load_launcher(directory: str) -> dict[str, Any]:
    """The launcher's modules that make worlds, loaded from its dir ``directory``, by name: they
    import each other by their top-level names (``_launcher_*``), as in the launcher, where that
    dir is ``sys.path[0]``. Here it is on ``sys.path`` only while they load, and they leave the
    module table after (they keep one another): a kernel that imports one of those names finds
    none."""
    import importlib

    sys.path.insert(0, directory)
    try:
        names = ("_launcher_syscalls", "_launcher_users", "_launcher_world")
        return {name: importlib.import_module(name) for name in names}
    finally:
        sys.path.remove(directory)
        for name in [name for name in sys.modules if name.startswith("_launcher_")]:
            del sys.modules[name]


class _Worlds:
    """Makes kernels' worlds with the server's launcher's modules (loaded on first use)."""

    def __init__(self, launcher_dir: str) -> None:
        modules = _load_launcher(launcher_dir)
        self.run_users = modules["_launcher_users"].RunUsers
        self.world = modules["_launcher_world"].World
        self.calls = modules["_launcher_syscalls"].Syscalls()
        #: The runs' user namespace (``_launcher_users.RunUsers``), made at the first world that
        #: asks for one; its base dir (a mount point in this process's own mount namespace).
        self.users: Any = None
        self.users_base: str | None = None
        self.own_pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        # Never written: its read end says "the zygote is gone" to a world's PID 1 (which cannot
        # ask getppid(): its parent is outside its namespace).
        self.alive_read, self.alive_write = os.pipe2(os.O_CLOEXEC)

    def fork(self, config: dict[str, Any]) -> int:
        """Fork a child that is PID 1 of a new PID namespace (this process stays in its own); with
        ``config["userns"]``, in the runs' user namespace (:meth:`_fork_as_user`), but where the
        kernel alone joins it (``programs_join``: a root server without idmapped mounts; the
        world's PID 1 stays the host's root, as the launcher's relays do)."""
        users = None
        if (config.get("userns") or {}).get("programs_join"):
            if self.users is None:
                self.users = self.run_users(config, self.calls)  # (only the namespace: no mounts)
            users = self.users
            if config.get("network", "private") == "private":
                users.network = users.make_network(self.calls)  # (made here: it takes no pid of the world's)
        elif config.get("userns") is not None:
            return self._fork_as_user(config)
        self.calls.unshare(_CLONE_NEWPID)
        try:
            pid = os.fork()
        except BaseException:
            self.calls.setns(self.own_pid_namespace, _CLONE_NEWPID)
            self._forget_network(users)
            raise
        if pid == 0:
            os.close(self.own_pid_namespace)
        else:  # the zygote's next children go where they used to
            self.calls.setns(self.own_pid_namespace, _CLONE_NEWPID)
            self._forget_network(users)  # (the world's PID 1 has it)
        return pid

    @staticmethod
    def _forget_network(users: Any) -> None:
        if users is not None and users.network is not None:
            os.close(users.network)
            users.network = None

    def _fork_as_user(self, config: dict[str, Any]) -> int:
        """A child that joins the runs' user namespace (made here once, as the launcher makes it
        for /run_code's relays) and forks the world's PID 1 there, then waits for it: it is the pid
        the server knows, and it dies with this process (the world's PID 1 with it). Returns 0 in
        the world's PID 1."""
        if self.users is None:
            import tempfile

            # In the kernels' runtime dir (the marker), which the server removes with them, and
            # reclaims after a killed server: never left behind in the temp dir.
            marker = sys.argv[1] if len(sys.argv) > 1 and os.path.isdir(sys.argv[1]) else None
            self.users_base = tempfile.mkdtemp(prefix=".worlds-", dir=marker)
            # (The runs' tmpfs of a server that is not root is the launcher's: kernels keep their
            # files in their own dirs.)
            users = {**config["userns"], "runs_tmpfs": None}
            self.users = self.run_users({**config, "userns": users, "scratch": self.users_base}, self.calls)
        said_r, said_w = os.pipe()
        zygote = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(said_r)
            try:
                import ctypes

                os.setsid()  # (killed as a group, apart from the zygote)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # ours to wait for
                self.users.become_root(self.calls)
                # Only now: a change of credentials (become_root's) clears the parent-death signal,
                # and without it this child, its world and its kernel outlived a killed zygote.
                ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() != zygote:
                    os._exit(1)  # the zygote died before the line above
                world = os.fork()
            except BaseException as exc:
                os.write(said_w, f"{exc}".encode() or b"failed")
                os._exit(1)
            if world == 0:
                os.close(said_w)
                return 0
            os.close(said_w)
            while True:
                try:
                    os.waitpid(world, 0)
                    break
                except InterruptedError:
                    continue
                except ChildProcessError:
                    break
            os._exit(0)
        os.close(said_w)
        try:
            said = os.read(said_r, 4096)
        finally:
            os.close(said_r)
        if said:
            raise OSError(1, f"cannot start a kernel's world in the runs' user namespace: {said.decode()}")
        return pid

    def close(self) -> None:
        """Give back the base dir of the runs' user namespace (a mount point here only)."""
        if self.users_base is not None:
            try:
                self.calls.umount(self.users_base)
                os.rmdir(self.users_base)
            except OSError:
                pass

    def become_world(
        self, request: dict[str, Any], protocol_in: IO[str], protocol_out: IO[str], launcher_path: str
    ) -> NoReturn:
        """In the child (PID 1 of its namespace): make the world, fork the kernel into it, and
        live as long as it does (never returns)."""
        code = 1
        made = None
        try:
            os.setsid()
            import ctypes
            import select

            os.close(self.alive_write)
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if select.select([self.alive_read], [], [], 0)[0]:
                os._exit(1)  # the zygote died before the line above: no one to serve
            protocol_in.close()
            protocol_out.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # ours to wait for
            world = request["world"]
            made = self.world(world["config"], self.calls, self.users)
            scratch = world["config"]["scratch"]
            os.mkdir(scratch + "/u", 0o755)
            os.mkdir(scratch + "/w", 0o700)
            made.mount_run(
                {"upper": scratch + "/u", "work": scratch + "/w", "lowers": [], "binds": world["binds"]}
            )
            kernel = os.fork()
            if kernel == 0:
                made.enter(world["cwd"])
                _run_kernel(request, None, None, launcher_path, in_world=True)
            while True:  # the kernel's orphans come here: reap them, until the kernel is gone
                try:
                    done, status = os.waitpid(-1, 0)
                except InterruptedError:
                    continue
                if done == kernel:
                    code = os.waitstatus_to_exitcode(status) & 0xFF
                    break
        except BaseException:
            traceback.print_exc()
        finally:
            if made is not None:
                try:
                    made.drop_mask()  # (kept on the runs' file system, where it is: World._mask_beside)
                except BaseException:
                    traceback.print_exc()
            os._exit(code)


def main() -> int:
    # Running a script puts its directory first on sys.path; kernels must not import from here.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    # The protocol keeps the pipes it was given; fds 0 and 1 become /dev/null so that nothing a
    # kernel prints to them can reach the protocol.
    protocol_in = os.fdopen(os.dup(0), "r", encoding="utf-8")
    protocol_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    try:
        import importlib
        import importlib.util

        import ipykernel.ipkernel
        import ipykernel.kernelapp
        import ipykernel.zmqshell

        # Imported by every kernel at start-up (the debugger is the slowest part), or by the first
        # traceback it formats (~0.1 s then): modules only, no code of any kernel has run yet.
        for name in _PRELOAD:
            try:
                importlib.import_module(name)
            except Exception:
                pass
        spec = importlib.util.find_spec("ipykernel_launcher")
        launcher_path = spec.origin if spec is not None and spec.origin else ipykernel.kernelapp.__file__
    except Exception as exc:
        _reply(protocol_out, {"error": f"cannot import ipykernel with {sys.executable}: {exc}"})
        return 1
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # kernels are reaped as soon as they exit
    _become_subreaper()  # ... and so are the processes a killed kernel (or its world) leaves
    _reply(protocol_out, {"ready": True, "pid": os.getpid()})
    kernels: list[int] = []
    launcher_dir = next((a.split("=", 1)[1] for a in sys.argv[2:] if a.startswith("--launcher-dir=")), None)
    worlds = _Worlds(launcher_dir) if launcher_dir else None
    try:
        _serve(protocol_in, protocol_out, launcher_path, kernels, worlds)
    finally:
        # The server closed our input: stopped, or killed without closing its kernels. A kernel
        # killed already is gone; one still running goes with everything its code started.
        for pid in kernels:
            if _still_ours(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
        if worlds is not None:
            worlds.close()
    return 0


def _become_subreaper() -> None:
    """Make this process the reaper of its kernels' orphans (Linux ``PR_SET_CHILD_SUBREAPER``), so
    that they are reaped at once (SIGCHLD is ignored here), not by the host's init, which may reap
    late or, as a container's first process, never. Where it is refused, the init reaps them."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (ImportError, OSError, AttributeError):
        pass


def _still_ours(pid: int) -> bool:
    """Whether group ``pid`` is still one of our kernels' (kernels are reaped unseen here). A pid is
    not given to a new process while a group of that id lives; so if a process ``pid`` exists with
    another parent, the kernel and its whole group are gone and the number was reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return True  # the kernel is gone; its group may live on (user code's children)
    return int(fields[1]) == os.getpid()


def _serve(
    protocol_in: IO[str],
    protocol_out: IO[str],
    launcher_path: str,
    kernels: list[int],
    worlds: _Worlds | None = None,
) -> None:
    """Fork a kernel for each request read, until the input closes; their pids go in ``kernels``
    (for a kernel in a world: its world's PID 1)."""
    for line in protocol_in:
        if not line.strip():
            continue
        request = json.loads(line)
        in_world = request.get("world") is not None
        if in_world and worlds is None:
            _reply(protocol_out, {"error": "this fork server makes no worlds (no --launcher-dir)"})
            continue
        try:
            pid = worlds.fork(request["world"]["config"]) if in_world and worlds is not None else os.fork()
        except OSError as exc:
            _reply(protocol_out, {"error": f"fork failed: {exc}"})
            continue
        if pid == 0:
            if in_world and worlds is not None:
                worlds.become_world(request, protocol_in, protocol_out, launcher_path)
            _run_kernel(request, protocol_in, protocol_out, launcher_path)
        kernels.append(pid)
        _reply(protocol_out, {"pid": pid})


if __name__ == "__main__":
    sys.exit(main())
