"""A run's world (DESIGN seam 8): what a program can see and touch, made before it starts and gone
with it.

Two isolation modes, chosen once per server (setting ``isolation``):

``none``  today's behaviour: programs run in the host's file system, network and process table
          (SandboxFusion's ``isolation: none``).
``lite``  SandboxFusion's ``lite`` isolation, made of system calls instead of a dozen ``sudo``
          subprocesses per run, and safer:

  * **Files.** Each request gets a *slot* on a tmpfs the server mounts for itself
    (``<tmp root>/mocksandbox-<id>``): one overlay upper layer per command of the request (setup,
    compile, run), each command's layers stacked over the last ones', a mask layer and the host's
    root file system (read-only through the overlay). The server writes the code and ``files``
    into the first layer and reads ``fetch_files`` through the layers as the run saw them
    (:class:`LayeredWorkspace`); everything goes when the request ends. The runs' slots are not
    on the root file system, so no run sees another's.
  * **Processes.** Every relay of the launcher is PID 1 of a PID namespace of its own and serves
    one run at a time: a run sees its own processes and the relay (which no signal from inside can
    reach), ``kill(-1)`` ends only its own. The relay reaps the run's orphans.
  * **Network.** A network namespace per relay with only loopback, up: a run serves and reaches
    its own ports, two runs can bind one port at once, and nothing of the host (its loopback
    services, this server's API) is reachable. ``run_network: host`` keeps the host's network.
  * IPC and UTS namespaces per relay.
  * **Secrets.** The server user's credential dirs and files (``~/.ssh``, ``~/.aws``, ...), the
    server's state dir and cassettes look empty (the mask layer), and credential-like environment
    variables are left out of the run's environment unless ``run_env_keep`` names them.
  * **Privileges.** Runs stay root (as on SandboxFusion) but keep only Docker's default capability
    set less ``CAP_MKNOD`` and ``CAP_SYS_CHROOT``: no mounts, no raw devices, no chroot escape, no
    reading the relay's ``/proc/1/root``. ``/proc/sys`` is read-only, ``/proc/sysrq-trigger`` is
    ``/dev/null``, ``/sys`` is a read-only sysfs without cgroups, ``/dev`` holds only ``null``,
    ``zero``, ``full``, ``random``, ``urandom``, ``tty`` and a private ``pts``.

swedev sessions (``mocksandbox.sessions.isolation.RunWorld``: a layer kept per session, the
session's dirs bound) and Jupyter kernels (``mocksandbox/jupyter/_zygote.py``: a world made per
kernel by the relay's own ``World``, of ``launcher/_launcher_world.py``) run in worlds too.

``auto`` is ``lite`` where this host allows it (root, cgroup confinement, overlayfs, namespaces;
proved by one real run at start-up), else ``none`` with the reason.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mocksandbox.execution.workdirs import temp_name

#: Capabilities a run keeps (Docker's default set less CAP_MKNOD and CAP_SYS_CHROOT): numbers from
#: linux/capability.h. CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP,
#: NET_BIND_SERVICE, NET_RAW, AUDIT_WRITE, SETFCAP.
KEPT_CAPABILITIES = (0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 29, 31)

#: The server user's credentials, relative to its home: they appear empty to a run.
CREDENTIAL_PATHS = (
    ".ssh",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".docker",
    ".kube",
    ".netrc",
    ".gnupg",
    ".pypirc",
    ".git-credentials",
    ".config/gh",
    ".config/hub",
    ".npmrc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".cache/huggingface/token",
    ".huggingface",
    ".config/rclone",
    ".terraform.d",
    ".vault-token",
)

#: Words (``_``-separated parts of a name) that say a variable holds a credential: ``GITHUB_TOKEN``,
#: ``DB_PASSWORD``, ``AZURE_CLIENT_SECRET``; not ``TOKENIZERS_PARALLELISM``.
_CREDENTIAL_WORDS = frozenset(
    {
        "TOKEN",
        "TOKENS",
        "SECRET",
        "SECRETS",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "CREDENTIALS",
        "APIKEY",
        "AUTH",
    }
)
#: Word pairs that say it too: ``OPENAI_API_KEY``, ``AWS_ACCESS_KEY_ID``.
_CREDENTIAL_PAIRS = frozenset({("API", "KEY"), ("ACCESS", "KEY"), ("PRIVATE", "KEY"), ("SESSION", "KEY")})
#: Prefixes of the clouds' variables, whose credentials do not always say so in their names.
_CREDENTIAL_PREFIXES = (
    "AWS_",
    "AZURE_",
    "GOOGLE_",
    "GCLOUD_",
    "GCP_",
    "VAULT_",
    "DATABRICKS_",
    "KUBECONFIG",
    "SSH_AUTH_SOCK",
)


def is_credential_variable(name: str) -> bool:
    """Whether an environment variable's name looks like it holds a credential."""
    upper = name.upper()
    if upper.startswith(_CREDENTIAL_PREFIXES):
        return True
    words = upper.split("_")
    return any(word in _CREDENTIAL_WORDS for word in words) or any(
        pair in _CREDENTIAL_PAIRS for pair in itertools.pairwise(words)
    )


def without_credentials(environ: Mapping[str, str], keep: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """``environ`` without the variables that look like credentials, but for those ``keep`` names."""
    kept = set(keep)
    return {k: v for k, v in environ.items() if k in kept or not is_credential_variable(k)}


#: The host's own secrets. A run whose world shows the host's root's files as its root's (a user
#: namespace with idmapped layers) could read them like the host's root: the mask is what keeps them.
SYSTEM_SECRET_PATTERNS = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/security/opasswd",
    "/etc/ssh/ssh_host_*_key",
    "/etc/ssl/private",
)


def hidden_system_secrets() -> list[str]:
    """The host's secrets (:data:`SYSTEM_SECRET_PATTERNS`) that exist here."""
    import glob

    found: list[str] = []
    for pattern in SYSTEM_SECRET_PATTERNS:
        found += sorted(path for path in glob.glob(pattern) if os.path.lexists(path))
    return found


def hidden_credential_paths(home: str | None = None) -> list[str]:
    """The credential paths of the server's user that exist here."""
    home = home if home is not None else os.path.expanduser("~")
    paths = [os.path.join(home, relative) for relative in CREDENTIAL_PATHS]
    return [path for path in paths if os.path.lexists(path)]


@dataclass(frozen=True)
class Isolation:
    """The isolation in force, and why (shown in the banner)."""

    mode: str  # "lite" or "none"
    network: str = "private"
    #: Why ``auto`` chose ``none`` (and what it would take), else empty.
    reason: str = ""
    hidden_paths: tuple[str, ...] = ()
    hidden_variables: tuple[str, ...] = ()
    #: ``(dir, prefix)``: entries of ``dir`` whose names start with ``prefix`` are hidden too, as
    #: they come and go (what servers keep in their temp roots).
    hidden_prefixed: tuple[tuple[str, str], ...] = ()
    #: The host uid a run's root is (its user namespace maps 0 to it), or ``None``: the host's root.
    run_uid: int | None = None
    #: Why runs are the host's root although ``run_as: auto`` asked for less, else empty.
    run_as_reason: str = ""
    #: Whether runs start under the seccomp filter (``syscall_filter.py``), and if not, why.
    syscall_filter: bool = False
    syscall_filter_reason: str = ""
    #: Where a root server's runs are ``run_uid`` without idmapped mounts (their programs join the
    #: runs' user namespace: ``_launcher_users.RunUsers.programs_join``), why it has none (the
    #: kernel refused them, or ``idmapped_mounts: off``); else empty. The host's files keep their
    #: host owners in a run's view then (the host root's are nobody's: read-only to it), and what
    #: the server makes for a run it gives to the run's uid (:meth:`run_owner`).
    without_idmapped_mounts: str = ""

    def describe(self) -> str:
        if self.mode == "none":
            because = f" ({self.reason})" if self.reason else ""
            return f"none: runs share this host's files, processes and network{because}"
        network = "own loopback only" if self.network == "private" else "the host's network"
        return (
            "lite: every run in a world of its own (copy-on-write files, own PID, IPC and UTS "
            f"namespaces; network: {network}); {self.describe_user()}"
        )

    def missing(self) -> list[str]:
        """The protections ``auto`` asked for and this host did not give, each with why: said at
        start-up and beside every answer (DESIGN seam 10)."""
        missing: list[str] = []
        if self.mode == "none" and self.reason:
            missing.append(f"a world of its own ({self.reason})")
        if self.mode == "lite" and self.run_uid is None and self.run_as_reason:
            missing.append(f"an unprivileged uid: runs are the host's root ({self.run_as_reason})")
        if self.mode == "lite" and not self.syscall_filter and self.syscall_filter_reason:
            missing.append(f"the seccomp filter ({self.syscall_filter_reason})")
        return missing

    def run_owner(self) -> RunOwner | None:
        """Whom the server gives what it makes for a run, where what it writes as itself would
        not be the run's own (see :attr:`without_idmapped_mounts`), else ``None``."""
        if self.mode != "lite" or self.run_uid is None or not self.without_idmapped_mounts:
            return None
        return RunOwner(self.run_uid, self.run_uid)

    def describe_user(self) -> str:
        """Who a run is on the host."""
        if self.mode == "none":
            return "runs are this server's user"
        if self.run_uid is not None and self.without_idmapped_mounts:
            return (
                f"runs are uid {self.run_uid} on the host (root only in a user namespace of their own, "
                f"without idmapped mounts: {self.without_idmapped_mounts}; the host's files owned by "
                "others are read-only to them)"
            )
        if self.run_uid is not None and self.run_uid == os.geteuid():
            return (
                f"runs are uid {self.run_uid} on the host, this server's user (root only in a user "
                "namespace of their own; the host's other files are read-only to them, as to this user)"
            )
        if self.run_uid is not None:
            return f"runs are uid {self.run_uid} on the host (root only in a user namespace of their own)"
        because = f" ({self.run_as_reason})" if self.run_as_reason else ""
        return f"runs are the host's root, with fewer capabilities{because}"

    def describe_hidden(self) -> str:
        paths = ", ".join([*self.hidden_paths, *(os.path.join(d, p + "*") for d, p in self.hidden_prefixed)])
        paths = paths or "none here"
        variables = ", ".join(self.hidden_variables) or "none here"
        return f"hidden from runs: paths {paths}; variables {variables}"


#: What servers name the dirs and files they keep in a temp root (state, control sockets, shared
#: counters, kernels' connection files, runs' tmpfs): hidden from runs.
SERVER_PRIVATE_PREFIX = "mocksandbox-"


def server_private_prefixes(tmp_root: str | None) -> tuple[tuple[str, str], ...]:
    """Where servers keep what runs must not see: the system temp dir and ``tmp_root``."""
    import tempfile

    roots = {os.path.realpath(tempfile.gettempdir()), "/tmp"}
    if tmp_root:
        roots.add(os.path.realpath(tmp_root))
    return tuple((root, SERVER_PRIVATE_PREFIX) for root in sorted(roots))


#: How many uids a run's user namespace maps (0 is its root; the others are there for programs that
#: change user, as ``apt`` and ``su`` do).
RUN_UID_COUNT = 65536


@dataclass(frozen=True)
class RunOwner:
    """Whom the server gives what it makes for a run, where what it writes as itself (the host's
    root) would not be the run's: a root server's runs without idmapped mounts
    (:attr:`Isolation.without_idmapped_mounts`). The run's root is host uid ``uid`` and gid
    ``gid``; its user namespace maps ``count`` ids from there. The server reads and removes what
    runs write as ever: it is root."""

    uid: int
    gid: int
    count: int = RUN_UID_COUNT

    def shifted(self, uid: int, gid: int) -> tuple[int, int]:
        """The owner a host owner is in the run's namespace, as a host id: the host's root is the
        run's root (``uid``), a host user ``n`` below ``count`` its ``n``; one it does not map
        stays as it is (the run sees nobody)."""
        return (
            self.uid + uid if 0 <= uid < self.count else uid,
            self.gid + gid if 0 <= gid < self.count else gid,
        )

    def give(self, path: str) -> None:
        """``path`` (a symlink itself, not what it names) made the run's root's."""
        os.chown(path, self.uid, self.gid, follow_symlinks=False)

    def give_tree(self, path: str) -> None:
        """``path`` and everything below it that is not the run's root's already, made so."""
        info = os.lstat(path)
        if (info.st_uid, info.st_gid) != (self.uid, self.gid):
            self.give(path)
        if not stat.S_ISDIR(info.st_mode):
            return
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    self.give_tree(entry.path)
                    continue
                found = entry.stat(follow_symlinks=False)
                if (found.st_uid, found.st_gid) != (self.uid, self.gid):
                    self.give(entry.path)


def run_owner_of(world: Mapping[str, Any] | None) -> RunOwner | None:
    """The :class:`RunOwner` of runs made of the world settings ``world`` (the engine's, which
    Jupyter kernels and swedev sessions share), or ``None`` where the server's own writes are the
    run's as they are."""
    users = (world or {}).get("userns") or {}
    if not users.get("programs_join"):
        return None
    return RunOwner(int(users["uid"]), int(users["gid"]), int(users.get("count", RUN_UID_COUNT)))


#: Where the runs' uids are reserved: a block at a random place per server (never derived from a
#: pid, which repeats in every container), far above any uid a distribution gives its users or
#: lists in ``/etc/subuid``.
_RUN_UIDS_FROM = 1 << 30
_RUN_UIDS_TO = (1 << 31) - RUN_UID_COUNT


def reserve_run_uids() -> int:
    """The first host uid of a block of :data:`RUN_UID_COUNT` for this server's runs."""
    return secrets.SystemRandom().randrange(_RUN_UIDS_FROM, _RUN_UIDS_TO, RUN_UID_COUNT)


def run_as_user_unavailable_reason() -> str | None:
    """Why runs cannot be root only in a user namespace of their own here (``None``: they may; the
    start-up run proves it). A root server maps them to a range of unprivileged uids; any other
    server to its own uid, which needs unprivileged user namespaces."""
    if not os.path.exists("/proc/self/ns/user"):
        return "this kernel has no user namespaces"
    if os.geteuid() == 0:
        return None
    for knob, off in (
        ("/proc/sys/user/max_user_namespaces", "0"),
        ("/proc/sys/kernel/unprivileged_userns_clone", "0"),
    ):
        try:
            if Path(knob).read_text().strip() == off:
                setting = knob.removeprefix("/proc/sys/").replace("/", ".")
                return f"this host allows users no user namespaces ({setting} = {off})"
        except OSError:
            continue
    return None


def lite_unavailable_reason(confinement_name: str = "") -> str | None:
    """Why ``lite`` cannot work here (``None``: it may; the start-up run proves it). Worlds need
    namespaces and overlayfs, and root or unprivileged user namespaces; confinement (cgroups or
    rlimits) is apart (``confinement_name`` is no longer a condition)."""
    if os.geteuid() != 0 and run_as_user_unavailable_reason() is not None:
        return f"lite needs root or unprivileged user namespaces: {run_as_user_unavailable_reason()}"
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        return "no /proc/filesystems here"
    if "overlay" not in filesystems:
        return "lite needs overlayfs (modprobe overlay)"
    for kind in ("mnt", "pid", "net", "ipc", "uts"):
        if not os.path.exists(f"/proc/self/ns/{kind}"):
            return f"this kernel has no {kind} namespaces"
    return None


#: Top-level dirs every run finds empty but for its own files, as in a fresh container: what the
#: host keeps there is not in a run's view (the launcher's mask makes them so: the world's
#: ``config["fresh"]``).
FRESH_DIRS = ("/tmp", "/run")


# -- the runs' tmpfs ---------------------------------------------------------------------------------

#: The size of the tmpfs every request's layers live on: what bounds all runs' files together where
#: no cgroup counts them against a run's memory (a quarter of the machine's memory), unless the
#: setting ``runs_scratch_mb`` says otherwise (:func:`runs_tmpfs_size`).
RUNS_TMPFS_SIZE = "size=25%"


def runs_tmpfs_size(megabytes: int | None) -> str:
    """The runs' tmpfs ``size=`` option: ``megabytes`` MiB, or :data:`RUNS_TMPFS_SIZE`."""
    return RUNS_TMPFS_SIZE if megabytes is None else f"size={megabytes}m"


_RUNS_ROOT_PREFIX = "mocksandbox-"
_OWNER_FILE = ".owner"
#: Where each relay mounts its own scratch tmpfs (see :attr:`RunsRoot.scratch`).
_SCRATCH_DIR = ".world"
#: In the runs' tmpfs: the dirs of runs that relays run in their kept roots (``KeptRootWorkspace``).
RUN_DIRS = "dirs"
#: The roots relays keep from run to run: ``kept-<random>/u`` (an upper layer), ``/w`` (its work
#: dir), ``/r`` (the runs' parent dir in it, which each run's dir is moved into) and ``/lock``
#: (held by the relay while it lives). The launcher (``launcher/_launcher_kept.py``,
#: which imports nothing of the package) makes them.
_KEPT_ROOT_PREFIX = "kept-"
_KEPT_ROOT_PARTS = frozenset({"u", "w", "r", "lock"})
#: Beside a runs' dir: locked while its server lives (``RunsRoot``).
_ALIVE_SUFFIX = ".lock"
_UMOUNT_DETACH = 2


def _umount(path: str) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(path), _UMOUNT_DETACH) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)


def _mount_tmpfs(path: str, options: str) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    nosuid_nodev = 2 | 4
    if libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", nosuid_nodev, options.encode()) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"cannot mount a tmpfs on {path}: {os.strerror(code)}")


class RunsRoot:
    """The tmpfs holding every request's layers, mounted at ``<tmp root>/mocksandbox-<random>``;
    for a server that may not mount (not root: ``mount=False``), a plain dir there.

    Its name is random (never derived from a pid, which repeats in every container); a lock held
    on its ``.owner`` file while the server lives tells a later server whether it is stale. So does
    one on ``<dir>.lock`` beside it, which every mount namespace sees: a server in a mount
    namespace of its own (a container, a test's) that dies leaves an empty dir here, which only
    that lock tells from a live one's (whose tmpfs this namespace does not see).
    """

    def __init__(self, parent: str, mount: bool = True, size: str = RUNS_TMPFS_SIZE) -> None:
        self.parent = parent
        self.mounted = mount
        reclaim_stale_runs_roots(parent)
        # The lock beside it first, then the dir: another server starting now (reclaiming stale
        # ones) must never find the dir without a held lock.
        while True:
            path = os.path.join(parent, _RUNS_ROOT_PREFIX + secrets.token_hex(6))
            try:
                alive = os.open(
                    path + _ALIVE_SUFFIX, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600
                )
            except FileExistsError:
                continue
            fcntl.flock(alive, fcntl.LOCK_EX | fcntl.LOCK_NB)
            try:
                os.mkdir(path, 0o700)
                break
            except FileExistsError:
                os.unlink(path + _ALIVE_SUFFIX)
                os.close(alive)
        self.path = path
        self._closed = False
        self._alive = alive
        if mount:
            try:
                _mount_tmpfs(path, f"mode=0700,{size}")
            except OSError:
                os.rmdir(path)
                os.unlink(path + _ALIVE_SUFFIX)
                os.close(alive)
                raise
        self._owner = os.open(os.path.join(path, _OWNER_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        #: Where each relay mounts its own scratch tmpfs (in its private mount namespace).
        self.scratch = os.path.join(path, _SCRATCH_DIR)
        os.mkdir(self.scratch, 0o700)

    #: Where the server reaches the runs' files, when not at :attr:`path` (a server that is not
    #: root: the launcher keeps their tmpfs in mount namespaces of its own, and the server reaches
    #: it through ``/proc/<launcher>/root``; set by :meth:`seen_through`). Relays use ``path``.
    access: str | None = None

    def seen_through(self, pid: int | None) -> None:
        """The runs' files are in the mount namespace of process ``pid`` (``None``: here)."""
        self.access = None if pid is None else f"/proc/{pid}/root{self.path}"

    def new_slot(self) -> str:
        """A new request's dir, as the server reaches it (see :meth:`relay_path`)."""
        base = self.access or self.path
        while True:
            slot = os.path.join(base, secrets.token_hex(8))
            try:
                os.mkdir(slot, 0o700)
                return slot
            except FileExistsError:
                continue

    def relay_path(self, path: str) -> str:
        """``path`` (one of :meth:`new_slot`'s) as relays see it."""
        if self.access is not None and path.startswith(self.access):
            return self.path + path[len(self.access) :]
        return path

    def reclaim_dropped_kept_roots(self) -> list[str]:
        """Remove the roots kept by relays that died without dropping them (killed from outside:
        a relay drops its own when it leaves): the ``kept-*`` dirs whose ``lock`` nobody holds.
        What a run wrote outside its dir is in there, on the runs' tmpfs. Returns what went."""
        return remove_unlocked_dirs(self.access or self.path, _KEPT_ROOT_PREFIX, "lock")

    def close(self) -> None:
        """Unmount the tmpfs (lazily: a run still being torn down keeps it until it is gone).
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            os.close(self._owner)
        except OSError:
            pass
        try:
            os.unlink(self.path + _ALIVE_SUFFIX)
            os.close(self._alive)
        except OSError:
            pass
        if not self.mounted:
            remove_own_tree(self.path)
            return
        try:
            _umount(self.path)
        except OSError:
            pass
        try:
            os.rmdir(self.path)
        except OSError:
            pass


def remove_own_tree(path: str | os.PathLike[str]) -> None:
    """Remove ``path`` and all below it, all this user's: also what sits in a dir its owner may
    not write or read, whose modes are widened for it first: a relay's mask on the host's disk
    copies the modes of the host dirs it hides (``_launcher_mask``), and overlayfs makes its work
    dir's own ``work`` dir with mode 000, which a server that is not root cannot otherwise enter."""
    path = os.fspath(path)
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path):
        return
    try:
        os.chmod(path, 0o700)
    except OSError:
        return
    for top, dirs, _ in os.walk(path):
        for name in dirs:
            try:
                os.chmod(os.path.join(top, name), 0o700, follow_symlinks=False)
            except (OSError, NotImplementedError):
                pass
    shutil.rmtree(path, ignore_errors=True)


def _stale_by_lock(path: str) -> bool | None:
    """``False`` when the lock file ``path`` is held (an ``flock`` its owner keeps while it lives),
    ``True`` when it is not, ``None`` when there is none (or a symlink is there instead)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def make_locked_dir(parent: str, prefix: str, lock_name: str) -> tuple[str, int]:
    """A new dir ``<parent>/<prefix><random>`` (mode 0700) and the descriptor of its lock file
    ``lock_name``, locked (``flock``) for as long as the caller keeps it open. It is made under a
    hidden name and renamed once locked: :func:`remove_unlocked_dirs`, run by another server
    starting at that moment, must never find it unlocked."""
    building = tempfile.mkdtemp(prefix="." + prefix, dir=parent)
    try:
        lock = os.open(os.path.join(building, lock_name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path = os.path.join(parent, os.path.basename(building)[1:])
            os.rename(building, path)
        except BaseException:
            os.close(lock)
            raise
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return path, lock


def remove_unlocked_dirs(parent: str, prefix: str, lock_name: str) -> list[str]:
    """Remove the dirs of ``parent`` named ``prefix*`` whose lock file ``lock_name`` nobody holds
    (an ``flock`` its owner keeps while it lives); one without that file is left alone (not one
    that says whose it is, or one still being made). Returns what was removed."""
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(parent, name)
        if not _stale_by_lock(os.path.join(path, lock_name)):
            continue  # its owner lives, or it has no lock
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _empty_dir(path: str) -> bool:
    try:
        return os.path.isdir(path) and not os.listdir(path)
    except OSError:
        return False


def holds_no_layers(path: str | os.PathLike[str]) -> bool:
    """Whether the runs' tmpfs (or dir) at ``path`` holds no request's layers and nothing a run
    left: only its ``.owner`` lock file, the relays' scratch mount point, empty run dirs
    (``dirs/*``) and the roots relays keep from run to run (``kept-*``: each holds no more than
    its upper layer, work dir, runs' parent dir and lock, as a relay may be making or dropping one
    as this looks; the upper layer only the dirs on the way to the runs' parent dir, one below
    the other, and that parent dir only dirs: what every run of such a root must leave).
    ``False`` too where something went as this looked (a relay dropping its kept root): ask
    again."""
    try:
        return _holds_no_layers(path)
    except FileNotFoundError:
        return False


def _holds_no_layers(path: str | os.PathLike[str]) -> bool:
    entries = list(os.scandir(path))
    others = [e.name for e in entries if not e.name.startswith(_KEPT_ROOT_PREFIX) and e.name != RUN_DIRS]
    if sorted(others) != sorted([_OWNER_FILE, _SCRATCH_DIR]):
        return False
    for run_dirs in (e for e in entries if e.name == RUN_DIRS):  # empty ones, kept for the next runs
        if not all(_empty_dir(d.path) for d in os.scandir(run_dirs.path)):
            return False
    for kept in (e for e in entries if e.name.startswith(_KEPT_ROOT_PREFIX)):
        if not kept.is_dir(follow_symlinks=False) or not set(os.listdir(kept.path)) <= _KEPT_ROOT_PARTS:
            return False
        upper = os.path.join(kept.path, "u")
        if os.path.isdir(upper) and not _only_the_way_down(upper):
            return False
        runs_here = os.path.join(kept.path, "r")
        if os.path.isdir(runs_here) and not _only_dirs(runs_here):
            return False
    return True


def _only_dirs(path: str) -> bool:
    """Whether ``path`` holds dirs only, and they the same, all the way down (a kept root's runs'
    parent dir between runs: nothing, or the ways to the host dirs shown in it)."""
    return all(e.is_dir(follow_symlinks=False) and _only_dirs(e.path) for e in os.scandir(path))


def _only_the_way_down(path: str) -> bool:
    """Whether ``path`` holds one dir holding the same, and so on down to a dir holding nothing
    but empty dirs, or nothing."""
    entries = list(os.scandir(path))
    if not all(e.is_dir(follow_symlinks=False) for e in entries):
        return False
    if len(entries) == 1 and _only_the_way_down(entries[0].path):
        return True
    return all(_empty_dir(e.path) for e in entries)


def reclaim_stale_runs_roots(parent: str) -> list[str]:
    """Unmount and remove the runs' tmpfs of servers that died without doing it (SIGKILL): those
    whose ``.owner`` lock nobody holds. Returns what was reclaimed."""
    reclaimed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return reclaimed
    for name in names:
        if not name.startswith(_RUNS_ROOT_PREFIX) or name.endswith(_ALIVE_SUFFIX):
            continue
        path = os.path.join(parent, name)
        stale = _stale_by_lock(path + _ALIVE_SUFFIX)
        if stale is False:
            continue  # its server lives (here or in a mount namespace of its own)
        if stale and not os.path.ismount(path) and _empty_dir(path):
            # Its server died in a mount namespace of its own, whose tmpfs went with it.
            try:
                os.rmdir(path)
                os.unlink(path + _ALIVE_SUFFIX)
                reclaimed.append(path)
            except OSError:
                pass
            continue
        mounted = os.path.ismount(path)
        if not mounted and not os.path.isdir(os.path.join(path, _SCRATCH_DIR)):
            continue  # neither a runs' tmpfs nor a runs' dir
        if not _stale_by_lock(os.path.join(path, _OWNER_FILE)):
            continue  # alive, or not one of ours (no owner lock)
        if not mounted:
            remove_own_tree(path)
        else:
            try:
                _umount(path)
                os.rmdir(path)
            except OSError:
                continue
        reclaimed.append(path)
        try:
            os.unlink(path + _ALIVE_SUFFIX)
        except OSError:
            pass
    return reclaimed


# -- one request's files -----------------------------------------------------------------------------

_MAX_SYMLINKS = 40


def path_in_run_dir(cwd: str, name: str) -> str | None:
    """``name`` (a ``files`` key: relative to the run's dir ``cwd``, or absolute in the run's view)
    relative to ``cwd`` when it names something inside that dir, else ``None`` (the dir itself,
    or a path outside it)."""
    relative = os.path.relpath(os.path.normpath(os.path.join(cwd, name)), cwd)
    if relative in (".", "..") or relative.startswith("../"):
        return None
    return relative


class HostWorkspace:
    """Isolation ``none``: the request's temp dir on the host, as SandboxFusion's."""

    def __init__(self, cwd: str, pool: Any = None) -> None:
        #: The ``WorkdirPool`` the dir came from (and goes back to), if any.
        self._pool = pool
        self.cwd = cwd
        #: Where the cwd's contents are written from the server: the cwd itself.
        self.host_cwd = cwd

    def write_file(self, view_path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(view_path), exist_ok=True)
        with open(view_path, "wb") as handle:
            handle.write(data)

    def read_file(self, view_path: str) -> bytes | None:
        if not os.path.isfile(view_path):
            return None
        with open(view_path, "rb") as handle:
            return handle.read()

    def next_command(self, last: bool = False, keep: bool = False) -> dict[str, Any] | None:
        return None

    def hand_over(self) -> None:
        """What the server wrote in the run's dir is the run's as it is (see :class:`RunOwner`)."""

    def close(self, code_path: str | None) -> None:
        if self._pool is not None:
            self._pool.give_back(self.cwd, code_path)


@dataclass
class _Found:
    kind: str  # "dir", "file", "other"
    host: str | None  # the file's path on the server (None: empty)
    #: For a dir: the layers to look further in, top first, as (host root, is the lower).
    layers: list[tuple[str, bool]] = field(default_factory=list)


class KeptRootWorkspace:
    """Isolation ``lite``, for a request that its relay runs in a root it keeps
    (``_launcher_kept.KeptRoot``): one command, every file in the run's dir, no ``fetch_files``, on a
    host where relays keep roots. Such a run sees nothing of the request but its dir, which the
    relay moves into its root, at ``cwd``: no layers are made for it. The dir comes from ``pool``,
    a ``WorkdirPool`` of dirs on the runs' tmpfs (``<runs root>/dirs``) made fresh for each run (no
    reuse: the relay takes the dir away), under a ``tmpXXXXXXXX`` name, which is also the run's
    ``cwd`` under the temp root it sees. The relay removes it once the run's processes are gone,
    before it answers; the server removes it where the run never got that far (its relay never
    took it), and the relay's root goes with what it holds where its relay is gone."""

    def __init__(
        self, pool: Any, runs_root: RunsRoot, view_tmp_root: str, owner: RunOwner | None = None
    ) -> None:
        self._pool = pool
        self._runs_root = runs_root
        #: Whom what the server writes for the run is given to (see :class:`RunOwner`), if anyone.
        self._owner = owner
        #: Where the server writes the run's files.
        self.host_cwd: str = pool.take()
        if owner is not None:
            owner.give(self.host_cwd)
        #: The run's dir as the run sees it.
        self.cwd = os.path.join(view_tmp_root, os.path.basename(self.host_cwd))

    def _host(self, view_path: str) -> str:
        relative = path_in_run_dir(self.cwd, view_path)
        if relative is None:
            raise ValueError(f"{view_path} is not inside the run's dir {self.cwd}")
        return os.path.join(self.host_cwd, relative)

    def write_file(self, view_path: str, data: bytes) -> None:
        """Write a file of the run's dir (nothing else is seen by a run in a kept root)."""
        path = self._host(view_path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)

    def hand_over(self) -> None:
        """What the server wrote in the run's dir given to the run, where that must be done
        (:class:`RunOwner`): before its first command, once the files are written."""
        if self._owner is not None:
            self._owner.give_tree(self.host_cwd)

    def read_file(self, view_path: str) -> bytes | None:
        """The regular file of the run's dir at ``view_path``, or ``None``."""
        try:
            path = self._host(view_path)
        except ValueError:
            return None
        if os.path.islink(path) or not os.path.isfile(path):
            return None
        with open(path, "rb") as handle:
            return handle.read()

    def next_command(self, last: bool = False, keep: bool = False) -> dict[str, Any]:
        """The run's world (sent to the relay): its dir, to be moved into the relay's kept root."""
        relay = self._runs_root.relay_path
        cwd_host = relay(self.host_cwd)
        return {
            "upper": cwd_host,  # (where the relay asks how full the runs' tmpfs is)
            "lowers": [],
            "last": last,
            "keep": {"dir": relay(self._runs_root.path), "cwd_host": cwd_host},
        }

    def close(self, code_path: str | None = None) -> None:
        """The run is over: its dir removed, if its relay has not already removed it."""
        self._pool.give_back(self.host_cwd, None)


class LayeredWorkspace:
    """Isolation ``lite``: one request's layers, and its files as its runs see them.

    Layer *k* (``<slot>/<k>/u``, with its overlay work dir ``<slot>/<k>/w``) is the upper layer of
    the request's *k*-th command; the earlier ones are its lower layers, over the mask and the
    host's root file system. The server writes the code and the ``files`` into layer 0 before the
    first command, and reads ``fetch_files`` through all of them after the last.
    """

    def __init__(
        self,
        runs_root: RunsRoot,
        view_tmp_root: str,
        hidden_paths: tuple[str, ...],
        skeleton: list[tuple[str, int, int, int]] | None = None,
        hidden_prefixed: tuple[tuple[str, str], ...] = (),
        owner: RunOwner | None = None,
        fresh_dirs: tuple[str, ...] = FRESH_DIRS,
    ) -> None:
        self.slot = runs_root.new_slot()
        self._runs_root = runs_root
        #: Whom what the server writes for the run is given to (see :class:`RunOwner`), if anyone.
        self._owner = owner
        self._hidden_prefixed = hidden_prefixed
        #: Dirs the run finds empty but for its own files (:data:`FRESH_DIRS`; a test that stands
        #: a host tree of its own in for the host's, under /tmp, passes none).
        self._fresh = fresh_dirs
        self._layers: list[str] = []
        self._commands = 0
        #: Whether the server wrote a file outside the run's dir (see next_command's ``keep``).
        self._outside_cwd = False
        self._hidden = hidden_paths
        self._root_device = os.stat("/").st_dev
        self._add_layer()
        name = temp_name()
        self.cwd = os.path.join(view_tmp_root, name)
        self.host_cwd = self._host(self.cwd, 0)
        if skeleton is None:
            skeleton = self.skeleton(view_tmp_root)
        self._make_skeleton(skeleton)  # the temp root's dirs, as the run sees them
        #: What the first layer started with (given to the next requests of this server).
        self.skeleton_used = skeleton
        os.mkdir(self.host_cwd, 0o700)
        if owner is not None:
            owner.give(self.host_cwd)

    def skeleton(self, view_dir: str) -> list[tuple[str, int, int, int]]:
        """``view_dir`` and its parents, each with the mode and owner the run sees it with (the
        topmost layer holding a dir gives it its attributes): what every request's first layer
        starts with. Worked out once per server (:meth:`ExecutionEngine.new_workspace`)."""
        made: list[tuple[str, int, int, int]] = []
        current = ""
        for part in [p for p in view_dir.split("/") if p]:
            current += "/" + part
            found = self._lookup(current)
            # (A dir of the mask, host None, has the host's attributes: /tmp is 1777 there.)
            host = found.host if found is not None and found.host is not None else current
            if found is not None and found.kind == "dir" and os.path.isdir(host):
                info = os.stat(host)
                made.append((current, stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid))
            else:
                made.append((current, 0o755, 0, 0))
        return made

    def _add_layer(self) -> None:
        base = os.path.join(self.slot, str(len(self._layers)))
        os.mkdir(base)
        os.mkdir(os.path.join(base, "u"), 0o755)
        os.mkdir(os.path.join(base, "w"), 0o700)
        self._layers.append(os.path.join(base, "u"))

    def _host(self, view_path: str, layer: int) -> str:
        return self._layers[layer] + view_path

    def _make_skeleton(self, skeleton: list[tuple[str, int, int, int]]) -> None:
        """The dirs of ``skeleton`` (see :meth:`skeleton`) in layer 0, but for those already there."""
        for view_dir, mode, uid, gid in skeleton:
            host = self._host(view_dir, 0)
            if os.path.isdir(host):
                continue
            os.mkdir(host)
            os.chmod(host, mode)
            if self._owner is not None:
                # As the run's namespace has their host owners (the host root's: the run root's),
                # so that the run reaches its dir through dirs the host's root keeps to itself.
                os.chown(host, *self._owner.shifted(uid, gid))
            elif (uid, gid) != (os.geteuid(), os.getegid()) and os.geteuid() == 0:
                os.chown(host, uid, gid)  # (a server that is not root leaves them its own)

    # -- the server's writes and reads ------------------------------------------------------------

    def write_file(self, view_path: str, data: bytes) -> None:
        """Write a file where the run will see it at ``view_path`` (an absolute ``files`` key):
        its parent is looked up as the run would (symlinks followed inside the run's view)."""
        parent = self.resolve(os.path.dirname(view_path)) or os.path.normpath(os.path.dirname(view_path))
        if parent != self.cwd and not parent.startswith(self.cwd + "/"):
            self._outside_cwd = True  # not in the run's dir: only a root of its own shows it
        self._make_skeleton(self.skeleton(parent))
        path = self._host(os.path.join(parent, os.path.basename(view_path)), 0)
        with open(path, "wb") as handle:
            handle.write(data)
        if self._owner is not None:
            self._owner.give(path)

    def hand_over(self) -> None:
        """What the server wrote in the run's dir given to the run, where that must be done
        (:class:`RunOwner`): before its first command, once the files are written."""
        if self._owner is not None:
            self._owner.give_tree(self.host_cwd)

    def read_file(self, view_path: str) -> bytes | None:
        """The regular file the run sees at ``view_path``, or ``None``."""
        found = self._lookup(view_path)
        if found is None or found.kind != "file":
            return None
        if found.host is None:
            return b""
        with open(found.host, "rb") as handle:
            return handle.read()

    def resolve(self, view_path: str) -> str | None:
        """``view_path`` with every symlink followed in the run's view, or ``None`` if missing."""
        result = self._walk(view_path, 0)
        return None if result is None else result[0]

    def _lookup(self, view_path: str) -> _Found | None:
        result = self._walk(view_path, 0)
        return None if result is None else result[1]

    def _top_layers(self) -> list[tuple[str, bool]]:
        return [(layer, False) for layer in reversed(self._layers)] + [("", True)]

    def _hidden_kind(self, view_path: str) -> str | None:
        """``dir``/``file`` when the mask covers ``view_path`` (it is hidden or below a hidden
        dir: those below are gone), ``below`` for a path inside a hidden dir, else ``None``."""
        for fresh in ("/dev", *self._fresh):
            if view_path == fresh or view_path.startswith(fresh + "/"):
                return "dir" if view_path == fresh else "below"
        hidden_here = list(self._hidden)
        for directory, prefix in self._hidden_prefixed:
            if view_path.startswith(directory + "/" + prefix):
                name = view_path[len(directory) + 1 :].split("/", 1)[0]
                hidden_here.append(os.path.join(directory, name))
        for hidden in hidden_here:
            if view_path == hidden:
                return "dir" if os.path.isdir(hidden) else "file"
            if view_path.startswith(hidden + "/"):
                return "below"
        return None

    def _walk(self, view_path: str, depth: int) -> tuple[str, _Found] | None:
        if depth > _MAX_SYMLINKS:
            return None
        parts = [p for p in os.path.normpath(view_path).split("/") if p and p != "."]
        current = "/"
        found = _Found("dir", "/", self._top_layers())
        for index, part in enumerate(parts):
            if found.kind != "dir":
                return None
            if part == "..":
                parent = os.path.dirname(current)
                rest = "/".join(parts[index + 1 :])
                return self._walk(os.path.join(parent, rest), depth)
            candidate = os.path.join(current, part)
            step = self._step(candidate, found.layers)
            if step is None:
                return None
            if step.kind == "symlink":
                assert step.host is not None
                target = os.readlink(step.host)
                base = target if target.startswith("/") else os.path.join(current, target)
                rest = "/".join(parts[index + 1 :])
                return self._walk(os.path.join(base, rest) if rest else base, depth + 1)
            current, found = candidate, step
        return current, found

    def _step(self, candidate: str, layers: list[tuple[str, bool]]) -> _Found | None:
        """Look ``candidate`` up in ``layers`` (top first) as overlayfs does."""
        below: list[tuple[str, bool]] = []
        kind: str | None = None
        host: str | None = None
        for root, is_lower in layers:
            if is_lower:
                hidden = self._hidden_kind(candidate)
                if hidden == "below":
                    break
                if hidden is not None:
                    if kind is None:
                        return _Found(hidden, None, [])
                    break  # an opaque mask dir: nothing of the host below it
            path = root + candidate
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if is_lower and info.st_dev != self._root_device:
                continue  # another file system mounted here: the run sees the root's dir under it
            if kind is None:
                if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
                    return None  # a whiteout: deleted by the run
                if stat.S_ISLNK(info.st_mode):
                    return _Found("symlink", path)
                if not stat.S_ISDIR(info.st_mode):
                    return _Found("file" if stat.S_ISREG(info.st_mode) else "other", path)
                kind, host = "dir", path
                below.append((root, is_lower))
                if not is_lower and _is_opaque(path):
                    break
            elif stat.S_ISDIR(info.st_mode):
                below.append((root, is_lower))
                if not is_lower and _is_opaque(path):
                    break
            else:
                break  # a non-dir under a dir ends the merge
        if kind is None:
            return None
        return _Found(kind, host, below)

    # -- the commands ----------------------------------------------------------------------------

    def next_command(self, last: bool = False, keep: bool = False) -> dict[str, Any]:
        """The layers of the request's next command (sent to the relay): a new upper layer over
        the ones the earlier commands wrote. ``last``: no command of this request comes after it
        (the relay may then unmount its root once it has said that the run is over). ``keep``: it
        is the request's only command, and nothing of the request but the run's dir is read or
        written outside the run (no ``files`` outside it, no ``fetch_files``): the relay may run it
        in a root it keeps from run to run, with the run's dir bound in (``_launcher_kept.KeptRoot``)."""
        if self._commands:
            self._add_layer()
        self._commands += 1
        upper = self._layers[-1]
        relay = self._runs_root.relay_path
        return {
            "upper": relay(upper),
            "work": relay(os.path.join(os.path.dirname(upper), "w")),
            "lowers": [relay(layer) for layer in reversed(self._layers[:-1])],
            "last": last,
            "keep": (
                {"dir": relay(self._runs_root.path), "cwd_host": relay(self.host_cwd)}
                if keep and last and len(self._layers) == 1 and not self._outside_cwd
                else None
            ),
        }

    def close(self, code_path: str | None = None) -> None:
        """Remove the request's layers: what most requests leave (their code file in their dir, the
        dirs made for it, overlayfs' work dirs) with a few calls, anything else with ``rmtree``."""
        try:
            if code_path is not None:
                os.unlink(self.host_cwd + "/" + os.path.basename(code_path))
            os.rmdir(self.host_cwd)
            for view_dir, *_ in reversed(self.skeleton_used):
                os.rmdir(self._host(view_dir, 0))
            for index, upper in enumerate(self._layers):
                if index:
                    os.rmdir(upper)
                base = os.path.dirname(upper)
                work = os.path.join(base, "w")
                if os.path.isdir(work + "/work"):
                    os.rmdir(work + "/work")
                os.rmdir(work)
                if not index:
                    os.rmdir(upper)
                os.rmdir(base)
            os.rmdir(self.slot)
        except OSError:
            shutil.rmtree(self.slot, ignore_errors=True)


#: One request's files, however its runs see them.
Workspace = HostWorkspace | KeptRootWorkspace | LayeredWorkspace


def _is_opaque(path: str) -> bool:
    # trusted.*: an overlay the host's root mounted; user.*: one mounted in the runs' user namespace.
    for name in ("trusted.overlay.opaque", "user.overlay.opaque"):
        try:
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
        except OSError:  # no such attribute (ENODATA), or none on this file system
            continue
    return False
