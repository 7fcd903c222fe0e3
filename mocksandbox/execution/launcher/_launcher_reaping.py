"""The relay as PID 1 of its run's PID namespace: the program waited for, the run's orphans reaped
(:class:`RunReaper`, held by a relay's world: ``_launcher_world``).

The relay is PID 1 of the run's namespace: the run's orphans come to it, and each one that
dies must be reaped at once (a zombie still counts against pids.max, and the server answers
only once the run's cgroup is empty). While a program runs, the relay reaps in its blocking
wait; once it has exited, what it left is killed and reaped before the answer
(_launcher_relay.end_what_the_program_left), so that no process of the run is left between
runs. Where that could not be done (the server gave the run up first), SIGCHLD is ignored
until the next run, so that the kernel reaps what is left as it dies (reap). And while a
program runs, the relay's socket is in async mode: if the server dies (its end closes),
SIGIO ends the run and the relay (see _launcher_watch.end_the_run).
Little Python runs in the relay while a program lives: every page it writes then is copied.
"""

import _signal
import _socket
import os

from _launcher_watch import say_ended_by_relay, unwatch_server


class RunReaper:
    """Waits for a run's program and reaps what its namespace leaves."""

    def __init__(self) -> None:
        #: SIGCHLD is ignored (see reap): the kernel reaps the run's orphans; not while a run is
        #: on (the relay is made with it at its default, and must wait for its program).
        self.kernel_reaps = False

    def before_run(self) -> None:
        """The run's children ours to wait for again, where the kernel reaped the last run's."""
        if self.kernel_reaps:
            _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
            self.kernel_reaps = False

    def wait_for_program(self, pid: int, sock: _socket.socket, server_gone: bool) -> int:
        """The wait status of the program ``pid``, reaping the run's orphans meanwhile; the watch
        on the server (``sock``), armed before the fork, is put down once it has exited.
        ``server_gone``: the server had left before the watch was armed (no SIGIO comes)."""
        try:
            if server_gone:
                say_ended_by_relay(0)
                try:
                    os.kill(-1, _signal.SIGKILL)  # the server left before we watched: end the run
                except OSError:
                    pass  # (nothing of the run left to signal)
            while True:
                try:
                    done, status = os.waitpid(-1, 0)
                except InterruptedError:
                    continue
                except ChildProcessError:
                    return 255 << 8
                if done == pid:
                    return status
        finally:
            unwatch_server(sock)

    @staticmethod
    def anything_left() -> bool:
        """Whether any process of the run's namespace is left (reaping one that died): every
        process of a PID namespace descends from its PID 1, this relay, and an orphan comes to it,
        so none is left once the relay has no child. (Cheaper than ``kill(-1)``, which looks at
        every process of the host.)"""
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        return True

    def reap(self, until_gone: bool = False) -> None:
        """Reap what died of the run, and let the kernel reap the rest until the next run; with
        ``until_gone``, wait until every process of the namespace (killed) has died first."""
        if not until_gone:
            _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)
            self.kernel_reaps = True
        while True:
            try:
                if os.waitpid(-1, 0 if until_gone else os.WNOHANG)[0] == 0:
                    return
            except ChildProcessError:
                return
            except InterruptedError:
                continue
