"""Why the launcher could not start a run, read from the run's stderr
(``ProcessRunner._launcher_said``): only once stderr itself is ready, whatever other pipe of the
run is (its read ends are blocking)."""

from __future__ import annotations

import os
import select
import threading
import time

from mocksandbox.execution.process import CapturedStream, ProcessRunner, _PipePoll


def _run_pipes() -> tuple[int, int, int, dict[int, CapturedStream], _PipePoll]:
    """A run's stdout and stderr as the runner watches them, stdout ready at once (its write end
    closed) and stderr not yet: stdout's read end, stderr's read and write ends, the streams, the
    poll."""
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    streams = {fd: CapturedStream(1 << 20, bytearray()) for fd in (stdout_r, stderr_r)}
    selector = _PipePoll()
    for fd in (stdout_r, stderr_r):
        selector.register(fd, select.POLLIN)
    os.close(stdout_w)
    return stdout_r, stderr_r, stderr_w, streams, selector


def test_the_launchers_words_are_read_from_stderr_once_it_is_ready_and_not_before() -> None:
    stdout_r, stderr_r, stderr_w, streams, selector = _run_pipes()

    def say_later() -> None:
        time.sleep(0.1)
        os.write(stderr_w, b"some output\nmocksandbox launcher: cannot start the run: why\n")
        os.close(stderr_w)

    writer = threading.Thread(target=say_later)
    writer.start()
    try:
        runner = ProcessRunner.__new__(ProcessRunner)  # (its launcher plays no part here)
        said = runner._launcher_said(selector, stderr_r, streams)
    finally:
        writer.join()
        os.close(stdout_r)
        os.close(stderr_r)
    assert said == "cannot start the run: why"


def test_a_stderr_that_stays_silent_is_not_waited_for_past_the_grace() -> None:
    """Another pipe ready, stderr silent and open (a relay stuck): the grace (half a second) ends
    the wait; a blocking read of stderr would have waited until its writer closed it (3 s)."""
    stdout_r, stderr_r, stderr_w, streams, selector = _run_pipes()
    closer = threading.Timer(3.0, os.close, (stderr_w,))
    closer.start()
    try:
        started = time.monotonic()
        said = ProcessRunner.__new__(ProcessRunner)._launcher_said(selector, stderr_r, streams)
        waited = time.monotonic() - started
    finally:
        closer.join()
        os.close(stdout_r)
        os.close(stderr_r)
    assert said == "" and waited < 2.5, waited
