"""A line a person can follow while pip or uv installs: what it is doing, how far, for how long.

pip's and uv's own output is a line or more per package (or nothing at all, with ``--quiet``).
:func:`run_installer` reads it as it comes and says instead where the install is, in one line: on a
terminal that line is redrawn in place each second; in a log, a line is written when the install
moves to its next stage, and every 15 seconds while it stays in one. The full output goes to a log
file, and its last lines are shown when the install fails.

Standard library only (the Makefile runs it before anything is installed).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

#: While a stage lasts, a log (not a terminal) gets a line this often.
HEARTBEAT_S = 15.0
#: Lines of the output shown when an install fails.
FAILURE_TAIL = 20

# uv's lines (uv pip install, output not a terminal).
_UV_RESOLVED = re.compile(r"Resolved (\d+) packages? in (\S+)")
_UV_PREPARED = re.compile(r"Prepared (\d+) packages? in (\S+)")
_UV_INSTALLED = re.compile(r"Installed (\d+) packages? in (\S+)")
_UV_AUDITED = re.compile(r"Audited (\d+) packages? in (\S+)")
_UV_DOWNLOADED = re.compile(r"\s*Downloaded (\S+)")
_UV_BUILDING = re.compile(r"\s*Building (\S+)")
# Both: "Downloading numpy (17.4MiB)" (uv), "  Downloading numpy-1.26.3-....whl (18.2 MB)" (pip).
_DOWNLOADING = re.compile(r"\s*Downloading (\S+?)(?:-\d[^\s]*)? \((.+)\)")
# pip's lines.
_PIP_COLLECTING = re.compile(r"(?:Collecting|Requirement already satisfied:) (\S+)")
_PIP_BUILDING = re.compile(r"Building wheels? for collected packages: (.+)")
_PIP_INSTALLING = re.compile(r"Installing collected packages: (.+)")
_PIP_INSTALLED = re.compile(r"Successfully installed (.+)")


@dataclass
class InstallProgress:
    """Where an install is, read off pip's or uv's output one line at a time (:meth:`feed`)."""

    stage: str = "starting"
    #: Packages the resolver has seen so far (pip names them one by one; uv says how many at the end).
    seen: int = 0
    resolved: int | None = None
    downloads_started: int = 0
    downloads_done: int = 0
    #: The file being fetched or the package being built, with its size where said.
    current: str = ""
    installed: int | None = None
    already: int | None = None
    notes: list[str] = field(default_factory=list)

    def feed(self, line: str) -> bool:
        """Take one line of output; whether the stage changed."""
        before = self.stage
        text = line.rstrip()
        if match := _UV_RESOLVED.match(text):
            self.resolved, self.stage = int(match[1]), "fetching"
            self.notes.append(f"resolved {match[1]} packages in {match[2]}")
        elif match := _UV_PREPARED.match(text):
            self.stage = "installing"
        elif match := _UV_INSTALLED.match(text):
            self.installed, self.stage = int(match[1]), "installed"
        elif match := _UV_AUDITED.match(text):
            self.already, self.stage = int(match[1]), "installed"
        elif match := _DOWNLOADING.match(text):
            if not match[1].endswith(".metadata") and ".metadata" not in text:
                self.downloads_started += 1
                self.current = f"{match[1]}, {match[2]}"
                self.stage = "fetching" if self.resolved is not None else self.stage
        elif match := _UV_DOWNLOADED.match(text):
            self.downloads_done += 1
        elif match := _PIP_COLLECTING.match(text):
            self.seen += 1
            self.current = match[1]
            self.stage = "resolving"
        elif match := _PIP_BUILDING.match(text):
            self.stage, self.current = "building", match[1]
        elif match := _UV_BUILDING.match(text):
            self.current = match[1]
        elif match := _PIP_INSTALLING.match(text):
            self.resolved = len(match[1].split(","))
            self.stage = "installing"
        elif match := _PIP_INSTALLED.match(text):
            self.installed, self.stage = len(match[1].split()), "installed"
        return self.stage != before

    def status(self) -> str:
        """Where it is now, in a few words."""
        if self.stage == "starting":
            return "starting"
        if self.stage == "resolving":
            return f"resolving ({self.seen} so far: {self.current})"
        if self.stage == "fetching":
            count = f" {self.resolved} packages" if self.resolved is not None else ""
            if not self.downloads_started:
                return f"fetching{count}"
            files = f"{self.downloads_done}/{self.downloads_started}"
            return f"fetching{count} (large files: {files}; {self.current})"
        if self.stage == "building":
            return f"building {self.current}"
        if self.stage == "installing":
            count = f" {self.resolved} packages" if self.resolved is not None else ""
            return f"installing{count}"
        return self.summary()

    def summary(self) -> str:
        """What it did, when it is over."""
        parts = []
        if self.installed is not None:
            parts.append(f"{self.installed} packages installed")
        if self.already is not None:
            parts.append(f"{self.already} already there")
        if not parts and self.seen:
            parts.append(f"{self.seen} packages, all there already")
        return ", ".join(parts) or "nothing to install"


def run_installer(
    argv: Sequence[str],
    out: TextIO,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    log: Path | None = None,
    indent: str = "      ",
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run pip or uv (``argv``), showing :class:`InstallProgress` in ``out`` instead of its output;
    the exit status. The output is appended to ``log`` if given, and its tail printed on failure."""
    now = clock
    progress = InstallProgress()
    tty = out.isatty()
    lock = threading.Lock()
    started = now()
    lines: list[str] = []
    print(f"{indent}$ {' '.join(argv)}", file=out, flush=True)

    def show() -> None:
        text = f"{indent}{progress.status()} ({now() - started:.0f}s)"
        if tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            out.write(f"\r\x1b[K{text[:width]}")
            out.flush()
        else:
            print(text, file=out, flush=True)

    finished = threading.Event()

    def tick() -> None:
        last = now()
        while not finished.wait(1.0):
            with lock:
                if tty or now() - last >= HEARTBEAT_S:
                    show()
                    last = now()

    log_file = None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log_file = log.open("a")
        log_file.write(f"$ {' '.join(argv)}\n")
    try:
        process = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )
    except OSError as exc:
        print(f"{indent}cannot run {argv[0]}: {exc}", file=out, flush=True)
        if log_file is not None:
            log_file.close()
        return 127
    ticker = threading.Thread(target=tick, name="install-progress", daemon=True)
    ticker.start()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if log_file is not None:
                log_file.write(line)
            with lock:
                if progress.feed(line) and progress.stage != "installed":
                    show()
        code = process.wait()
    finally:
        finished.set()
        ticker.join(timeout=5)
        if log_file is not None:
            log_file.close()
    with lock:
        if tty:
            out.write("\r\x1b[K")
        if code == 0:
            print(f"{indent}{progress.summary()} ({now() - started:.1f}s)", file=out, flush=True)
        else:
            where = f"; all of it in {log}" if log is not None else ""
            print(f"{indent}{argv[0]} failed (exit status {code}); its last lines{where}:", file=out)
            for line in lines[-FAILURE_TAIL:]:
                print(f"{indent}  {line.rstrip()}", file=out)
            out.flush()
    return code
