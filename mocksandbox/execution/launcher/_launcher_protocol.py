"""The launcher's wire protocol with the server: run messages in, status records out.

Protocol, on SOCK_SEQPACKET sockets: one message per run, a JSON object with the run's four file
descriptors attached (stdin, stdout, stderr, status). Sent to the launcher, a fifth descriptor
rides along: the socket on which the new relay will take its later runs. On the status pipe the
relay writes, for a run on the host, ``b"P"`` + the program's pid (8 bytes) once it is started (a
world's run has no ``P``: its pids are its namespace's, and the server never kills by them), then
``b"S"`` + its wait status (8 bytes, signed) when it has exited, and closes the pipe: the relay is
then ready for its next run. A relay that dies first (a program killed its parent) closes the pipe
without the ``S`` record; the server then drops it. A run that could not be started (no process
slot or memory left for the relay or the program, a cgroup that cannot be joined) gets ``b"E"`` +
the errno (8 bytes) instead: the server retries it or reports why, but never as a program's exit.
A relay that ends the run itself says so first with ``b"K"`` (see ``_launcher_watch``).

The server's side of it: ``mocksandbox/execution/launcher/__init__.py`` (the messages) and
``mocksandbox/execution/process.py`` (the status records).
"""

import _json
import _socket
import os
import sys

STATUS_PID = b"P"
STATUS_EXIT = b"S"
STATUS_LAUNCH_ERROR = b"E"
#: The relay ended the run itself (its socket with the server woke it, or read as closed), with
#: the signal that woke it (0: the closed socket): said before the relay leaves.
STATUS_ENDED_BY_RELAY = b"K"
#: The descriptors of a run: stdin, stdout, stderr, status.
RUN_FDS = 4


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[written:]


def close_all(fds: list) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class _JsonContext:
    """What ``_json.make_scanner`` reads off ``json.JSONDecoder``: the defaults of ``json.loads``."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


#: The standard library's own JSON scanner, in C, without the ``json`` package: that imports ``re``
#: and its kin (about a megabyte of objects), which every relay and every forked program would
#: then carry, and every fork would copy the page tables of.
_SCAN_JSON = _json.make_scanner(_JsonContext())


def parse_json(data: bytes) -> object:
    """``json.loads`` of one JSON document (as the server's ``json.dumps`` writes them)."""
    text = data.decode("utf-8")
    try:
        value, end = _SCAN_JSON(text, 0)
    except StopIteration:
        raise ValueError("not a JSON document") from None
    if text[end:].strip():
        raise ValueError("extra data after the JSON document")
    return value


#: The buffer a message's length is peeked into (its bytes are not kept).
_PEEK = bytearray(1)


def receive(sock: _socket.socket, fd_count: int) -> "tuple | None":
    """The next message on ``sock``: ``(request, fds)``, ``(None, [])`` for one that was not a
    run (reported on its status pipe where it had one), or ``None`` once the peer has closed."""
    # The message's length first (a seqpacket socket says it with MSG_TRUNC), so that its buffer
    # is its size: a buffer for the largest message would cost every run a megabyte's allocation.
    size = sock.recv_into(_PEEK, 1, _socket.MSG_PEEK | _socket.MSG_TRUNC)
    if not size:
        return None
    data, ancillary, _, _ = sock.recvmsg(size, _socket.CMSG_SPACE(fd_count * 4))
    if not data:
        return None
    fds = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [int.from_bytes(payload[i : i + 4], sys.byteorder) for i in range(0, len(payload), 4)]
    try:
        request = parse_json(data)
        if len(fds) != fd_count:
            raise ValueError(f"expected {fd_count} descriptors, got {len(fds)}")
    except Exception as exc:
        if len(fds) >= RUN_FDS:
            report_launch_error(fds[3], getattr(exc, "errno", None))
        close_all(fds)
        return None, []
    return request, fds


def read_all(fd: int) -> bytes:
    """Everything on ``fd`` (until its writer closed it, or the file's end), read with plain system
    calls (no io objects to build in a program); closes it."""
    chunks = []
    try:
        # A file is read in one call of its size (a short read of a file is its end); a pipe in
        # chunks of a pipe's size: never a buffer far larger than what is read, which costs its
        # allocation in every program.
        size = os.fstat(fd).st_size
        chunk_size = size + 1 if size else 1 << 16
        while True:
            chunk = os.read(fd, chunk_size)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            if size and len(chunk) < chunk_size:
                return b"".join(chunks)
    finally:
        os.close(fd)


def report_launch_error(status_fd: int, error: "int | None") -> None:
    try:
        write_all(status_fd, STATUS_LAUNCH_ERROR + (error or 0).to_bytes(8, "little", signed=True))
    except OSError:
        pass
