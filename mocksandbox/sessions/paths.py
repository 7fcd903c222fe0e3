"""Path translation: the agent sees ``/workspace`` and ``/tmp``; each session has its own of both.

The prompt tells the model its repository is at ``/workspace/<repo>__<version>``. Many sessions
run on one host at once, so each gets a private directory (``<session>/workspace/...`` and
``<session>/tmp``) and the paths are translated:

* in what the agent sends (a command, an editor path), a ``/workspace`` or ``/tmp`` that starts a
  path becomes the session's own directory;
* in what the agent gets back (command output, editor messages, tracebacks), the session's
  directories become ``/workspace`` and ``/tmp`` again.

Translation is textual, so a path the program builds at run time from pieces (``"/work" +
"space"``) is not seen; ``TMPDIR`` is set to the session's ``tmp`` so that temp files land there.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

#: The directories the agent sees, each mapped to a private one per session.
VIRTUAL_ROOTS = ("workspace", "tmp")
#: A virtual root at the start of a path: not preceded by a path or word character (so that
#: ``/var/tmp`` and ``x/workspace`` stay), and followed by the end of the path.
_VIRTUAL = re.compile(r"(?<![\w.~/-])/(" + "|".join(VIRTUAL_ROOTS) + r")(?![\w.~-])")
#: Characters a session root may have: it is written into shell commands unquoted.
SAFE_ROOT = re.compile(r"^/[A-Za-z0-9_./-]+$")


@dataclass(frozen=True)
class PathMap:
    """Translation between the agent's paths and one session's real directories."""

    #: The session's directory, holding ``workspace/`` and ``tmp/``.
    root: Path
    _real_prefixes: tuple[tuple[str, str], ...] = field(init=False, repr=False, compare=False)
    _back: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        root = str(self.root)
        if not SAFE_ROOT.match(root):
            raise ValueError(f"session root {root!r} has characters that are unsafe in a shell command")
        prefixes: list[tuple[str, str]] = []
        for candidate in dict.fromkeys([root, os.path.realpath(root)]):
            for name in VIRTUAL_ROOTS:
                prefixes.append((f"{candidate}/{name}", f"/{name}"))
        prefixes.sort(key=lambda pair: len(pair[0]), reverse=True)
        object.__setattr__(self, "_real_prefixes", tuple(prefixes))
        pattern = "|".join(re.escape(real) for real, _ in prefixes)
        object.__setattr__(self, "_back", re.compile(f"(?:{pattern})(?![\\w.~-])"))

    def real_dir(self, name: str) -> Path:
        """The session's own directory for the virtual root ``/name``."""
        return self.root / name

    def to_real(self, text: str) -> str:
        """``text`` (a command or a path) with the agent's ``/workspace`` and ``/tmp`` made real."""
        return _VIRTUAL.sub(lambda m: f"{self.root}/{m.group(1)}", text)

    def to_agent(self, text: str) -> str:
        """``text`` (output) with the session's directories shown as ``/workspace`` and ``/tmp``."""
        table = dict(self._real_prefixes)
        return self._back.sub(lambda m: table[m.group(0)], text)

    def real_path(self, agent_path: str) -> Path | None:
        """The real path for an absolute agent path inside ``/workspace`` or ``/tmp``, else ``None``."""
        path = os.path.normpath(agent_path)
        for name in VIRTUAL_ROOTS:
            virtual = f"/{name}"
            if path == virtual or path.startswith(virtual + "/"):
                return self.root / name / path[len(virtual) + 1 :] if path != virtual else self.root / name
        return None

    def agent_path(self, real: Path | str) -> str:
        """How the agent sees a real path of this session."""
        return self.to_agent(str(real))
