"""Stopping on a signal: ``mocksandbox serve`` (and its workers, and ``record``) stop on SIGINT and
SIGTERM even when the signal's ``KeyboardInterrupt`` is lost. Python prints and drops an exception
raised while a finalizer runs (a ``__del__`` under garbage collection): a server that relied on the
exception alone served on after Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from serve_process import is_alive, start_serve, stdout_of, stop_serve

from mocksandbox.serving.banner import stop_on_signals
from mocksandbox.serving.single import MockServer


def _app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Length", "0")])
    return [b""]


class _SignalledInItsFinalizer:
    """An object whose finalizer is where the signal's handler runs."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs at the latest at one of these loop's jumps
            pass


@pytest.fixture
def own_stop_signals() -> Iterator[None]:
    """The test's own SIGINT and SIGTERM handlers, pytest's given back afterwards."""
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@pytest.mark.parametrize("loop", ["serve_forever", "accept_forever", "serve_by_acceptors"])
def test_a_stop_signal_lost_in_a_finalizer_still_stops_the_server(
    loop: str, own_stop_signals: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    dropped: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: dropped.append(unraisable.exc_value))
    server = MockServer("127.0.0.1", 0, _app)
    # Should the loop not stop, end it from another thread after a while, and fail.
    gave_up = threading.Event()

    def give_up() -> None:
        gave_up.set()
        if loop == "serve_forever":
            server.shutdown()
        elif loop == "serve_by_acceptors":
            server.stop_requested.set()
        else:
            server.socket.shutdown(socket.SHUT_RDWR)  # wakes the blocking accept

    watchdog = threading.Timer(20.0, give_up)
    try:
        server.stop_requested = stop_on_signals()
        _SignalledInItsFinalizer()  # dropped at once: its finalizer gets the signal
        assert len(dropped) == 1 and isinstance(dropped[0], KeyboardInterrupt), dropped  # Python lost it
        watchdog.start()
        if loop == "serve_forever":
            server.serve_forever(poll_interval=0.05)
        elif loop == "serve_by_acceptors":
            server.serve_by_acceptors()
        else:
            server.accept_forever()
    finally:
        watchdog.cancel()
        server.server_close()
    assert not gave_up.is_set(), f"{loop} served on after the stop signal"


def test_each_signal_named_stops_and_no_other(own_stop_signals: None) -> None:
    """A worker stops on SIGTERM only (the master's Ctrl-C reaches the whole group, and the
    master stops it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = stop_on_signals(signal.SIGTERM)
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGTERM)
        for _ in range(1000):
            pass
    assert stop.is_set()


def test_only_the_first_stop_signal_breaks_off_what_runs(own_stop_signals: None) -> None:
    """A second signal (Ctrl-C twice) must not break off the stop the first began."""
    stop = stop_on_signals(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGTERM)
        for _ in range(1000):
            pass
    signal.raise_signal(signal.SIGTERM)
    for _ in range(1000):
        pass
    assert stop.is_set()


def test_signals_that_keep_coming_while_the_server_stops_leave_nothing_behind(tmp_path: Path) -> None:
    """Ctrl-C again and again until ``serve`` has stopped: it stops as after one, without a
    traceback, its launcher and relays gone and its runs' files removed."""
    server = start_serve(runs_dir=tmp_path)
    assert stdout_of(server.run("print(1)")) == "1\n"
    children = psutil.Process(server.process.pid).children(recursive=True)
    assert children  # (its launcher and relays)
    deadline = time.monotonic() + 60
    while server.process.poll() is None and time.monotonic() < deadline:
        server.process.send_signal(signal.SIGINT)
        time.sleep(0.005)
    if server.process.poll() is None:
        stop_serve(server.process)
        pytest.fail("the server did not stop")
    said = server.process.stdout.read() if server.process.stdout is not None else ""
    assert server.process.returncode == 0, said
    assert "Traceback" not in said, said
    assert not [child for child in children if is_alive(child)]
    assert list(tmp_path.iterdir()) == [], "the stopped server left temp dirs behind"
