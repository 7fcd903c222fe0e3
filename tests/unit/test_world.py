"""The parts of a run's world that need no namespace: reading a request's files back through its
layers as overlayfs shows them, writing absolute ``files`` into them, and what looks like a secret."""

from __future__ import annotations

import base64
import fcntl
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mocksandbox.execution import world
from mocksandbox.execution.engine import restore_files
from mocksandbox.execution.world import (
    LayeredWorkspace,
    RunsRoot,
    holds_no_layers,
    is_credential_variable,
    path_in_run_dir,
    without_credentials,
)


class _Slots:
    """Stands in for :class:`RunsRoot` (no tmpfs needed to read layers back)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def new_slot(self) -> str:
        slot = self.path / f"slot{len(list(self.path.iterdir()))}"
        slot.mkdir()
        return str(slot)

    @staticmethod
    def relay_path(path: str) -> str:
        return path  # relays see the layers where the server does


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host tree on the root file system (the lowest layer), under the test's own dir."""
    root = tmp_path / "host"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "config").write_text("host config")
    (root / "secret").mkdir()
    (root / "secret" / "key").write_text("CANARY")
    (root / "lib-real").mkdir()
    (root / "lib-real" / "libc.so").write_text("libc")
    (root / "lib").symlink_to("lib-real")
    return root


def workspace(tmp_path: Path, host: Path) -> LayeredWorkspace:
    if os.stat(tmp_path).st_dev != os.stat("/").st_dev:
        pytest.skip("the test's tmp dir is not on the root file system, the lowest layer")
    slots = _Slots(tmp_path / "slots")
    slots.path.mkdir(exist_ok=True)
    # (The host tree stands under tmp_path, in /tmp: not a dir that starts empty here.)
    return LayeredWorkspace(slots, str(tmp_path / "view-tmp"), (str(host / "secret"),), fresh_dirs=())  # type: ignore[arg-type]


def test_the_cwd_is_made_in_the_first_layer_with_a_fresh_name(tmp_path: Path, host: Path) -> None:
    first, second = workspace(tmp_path, host), workspace(tmp_path, host)
    assert first.cwd != second.cwd and os.path.basename(first.cwd).startswith("tmp")
    assert Path(first.host_cwd).is_dir() and first.host_cwd.endswith(first.cwd)
    assert oct(os.stat(first.host_cwd).st_mode & 0o777) == "0o700"


def test_reads_go_through_the_layers_top_first(tmp_path: Path, host: Path) -> None:
    space = workspace(tmp_path, host)
    assert space.read_file(str(host / "etc" / "config")) == b"host config"  # the host, read through
    space.next_command()
    layer = space.next_command()  # the second command's layer is on top
    upper = Path(layer["upper"])
    (upper / str(host / "etc")[1:]).mkdir(parents=True)
    (upper / str(host / "etc" / "config")[1:]).write_text("changed by the run")
    assert space.read_file(str(host / "etc" / "config")) == b"changed by the run"
    assert layer["lowers"] == [str(Path(layer["upper"]).parent.parent / "0" / "u")]


def test_a_whiteout_hides_and_an_opaque_dir_empties(tmp_path: Path, host: Path) -> None:
    space = workspace(tmp_path, host)
    upper = Path(space.next_command()["upper"])
    etc = upper / str(host / "etc")[1:]
    etc.mkdir(parents=True)
    os.mknod(etc / "config", 0o600 | 0o020000, os.makedev(0, 0))  # what overlayfs leaves for rm
    assert space.read_file(str(host / "etc" / "config")) is None
    os.unlink(etc / "config")
    os.setxattr(etc, "trusted.overlay.opaque", b"y")  # what it leaves for rm -r; mkdir
    assert space.read_file(str(host / "etc" / "config")) is None
    (etc / "config").write_text("new")
    assert space.read_file(str(host / "etc" / "config")) == b"new"


def test_symlinks_are_followed_in_the_runs_view(tmp_path: Path, host: Path) -> None:
    space = workspace(tmp_path, host)
    assert space.read_file(str(host / "lib" / "libc.so")) == b"libc"
    upper = Path(space.next_command()["upper"])
    # The run points a link at a secret of the host: it reads what the run sees there (empty).
    (upper / space.cwd[1:] / "link").symlink_to(host / "secret" / "key")
    assert space.read_file(os.path.join(space.cwd, "link")) is None
    assert space.read_file(str(host / "secret" / "key")) is None
    assert space.resolve(str(host / "lib")) == str(host / "lib-real")


def test_an_absolute_file_is_written_where_the_run_sees_it(tmp_path: Path, host: Path) -> None:
    space = workspace(tmp_path, host)
    space.write_file(str(host / "lib" / "extra.so"), b"x")  # through the host's symlink
    space.write_file(str(tmp_path / "new" / "dir" / "f.txt"), b"y")
    assert space.read_file(str(host / "lib-real" / "extra.so")) == b"x"
    assert space.read_file(str(tmp_path / "new" / "dir" / "f.txt")) == b"y"
    assert not (host / "lib-real" / "extra.so").exists()  # the host is untouched
    # The dirs made in the layer keep the host's mode, as the run would see them.
    made = Path(space.host_cwd).parents[-2]  # a top-level dir of the layer
    assert made.is_dir()


def test_a_file_named_by_its_absolute_path_in_the_runs_dir_goes_into_the_layer(
    tmp_path: Path, host: Path
) -> None:
    space = workspace(tmp_path, host)
    named = os.path.join(space.cwd, "sub", "..", "a.txt")
    restore_files(space, {named: base64.b64encode(b"in the run's dir").decode()})
    assert space.read_file(os.path.join(space.cwd, "a.txt")) == b"in the run's dir"
    assert Path(space.host_cwd, "a.txt").read_bytes() == b"in the run's dir"
    assert not os.path.exists(space.cwd)  # the view's path, never made on the host


@pytest.mark.parametrize(
    ("name", "inside"),
    [
        ("a.txt", "a.txt"),
        ("sub/../b.txt", "b.txt"),
        ("..hidden", "..hidden"),
        ("/run/dir/c/d.txt", "c/d.txt"),
        (".", None),
        ("", None),
        ("..", None),
        ("a/../../x", None),
        ("/run/dir", None),
        ("/run/dirx/y", None),
        ("/etc/passwd", None),
    ],
)
def test_a_files_name_is_inside_the_runs_dir_or_not(name: str, inside: str | None) -> None:
    assert path_in_run_dir("/run/dir", name) == inside


def test_other_file_systems_are_not_read_through(tmp_path: Path, host: Path) -> None:
    space = workspace(tmp_path, host)
    assert space.read_file("/proc/self/status") is None  # a mount: the run has its own there


@pytest.mark.parametrize(
    "name",
    [
        "GITHUB_TOKEN",
        "OPENAI_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "HF_TOKEN",
        "DB_PASSWORD",
        "my_secret",
        "SSH_AUTH_SOCK",
    ],
)
def test_credential_variables_are_recognised(name: str) -> None:
    assert is_credential_variable(name)


@pytest.mark.parametrize(
    "name",
    ["PATH", "HOME", "LANG", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "TOKENIZERS_PARALLELISM", "HF_HOME"],
)
def test_ordinary_variables_are_kept(name: str) -> None:
    assert not is_credential_variable(name)
    assert without_credentials({name: "v"}) == {name: "v"}


def test_a_named_credential_is_kept() -> None:
    assert without_credentials({"HF_TOKEN": "t", "PATH": "/bin"}, keep=["HF_TOKEN"]) == {
        "HF_TOKEN": "t",
        "PATH": "/bin",
    }
    assert without_credentials({"HF_TOKEN": "t", "PATH": "/bin"}) == {"PATH": "/bin"}


@given(st.dictionaries(st.from_regex(r"[A-Z_]{1,12}", fullmatch=True), st.text(max_size=5)))
def test_without_credentials_keeps_exactly_what_is_not_one_or_is_named(environ: dict[str, str]) -> None:
    keep = sorted(environ)[:1]
    kept = without_credentials(environ, keep)
    assert set(kept) == {k for k in environ if k in keep or not is_credential_variable(k)}


def test_a_runs_root_of_a_dead_server_is_reclaimed(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    live = RunsRoot(str(tmp_path))
    dead = RunsRoot(str(tmp_path))
    os.close(dead._owner)  # as if its server died: nobody holds its locks
    os.close(dead._alive)
    dead._closed = True
    fresh = RunsRoot(str(tmp_path))  # a new server reclaims it at start-up
    try:
        assert not os.path.exists(dead.path)
        assert os.path.ismount(live.path) and os.path.ismount(fresh.path)
    finally:
        live.close()
        fresh.close()
    assert list(tmp_path.iterdir()) == []


def _another_server_looks_before_each_lock(monkeypatch: pytest.MonkeyPatch, look: Any) -> list[Any]:
    """Each ``flock`` this process takes is preceded by ``look()`` (another server reclaiming
    stale dirs at that moment); what each look returned."""
    real_flock, looks, inside = fcntl.flock, [], []

    def flock(fd: int, operation: int) -> None:
        if not inside:
            inside.append(True)
            try:
                looks.append(look())
            finally:
                inside.clear()
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    return looks


def test_a_runs_root_is_never_seen_without_its_lock_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks = _another_server_looks_before_each_lock(
        monkeypatch, lambda: world.reclaim_stale_runs_roots(str(tmp_path))
    )
    made = RunsRoot(str(tmp_path), mount=False)
    try:
        monkeypatch.undo()
        assert looks and all(look == [] for look in looks)
        assert os.path.isdir(made.scratch)
    finally:
        made.close()


def test_a_locked_dir_is_never_seen_unlocked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    looks = _another_server_looks_before_each_lock(
        monkeypatch, lambda: world.remove_unlocked_dirs(str(tmp_path), "dir-", "lock")
    )
    path, lock = world.make_locked_dir(str(tmp_path), "dir-", "lock")
    monkeypatch.undo()
    assert looks == [[]] and os.path.basename(path).startswith("dir-")
    assert os.listdir(tmp_path) == [os.path.basename(path)]
    assert world.remove_unlocked_dirs(str(tmp_path), "dir-", "lock") == []  # held
    os.close(lock)
    assert world.remove_unlocked_dirs(str(tmp_path), "dir-", "lock") == [path]


def test_a_runs_root_holds_no_layers_with_only_its_own_files_and_kept_roots(tmp_path: Path) -> None:
    (tmp_path / ".owner").touch()
    (tmp_path / ".world").mkdir()
    assert holds_no_layers(tmp_path)
    kept = tmp_path / "kept-0a1b"
    kept.mkdir()
    assert holds_no_layers(tmp_path)  # a relay making one (or dropping it) as this looks
    (kept / "u").mkdir()
    (kept / "w").mkdir()
    assert holds_no_layers(tmp_path)
    (kept / "u" / "tmp").mkdir()  # the way down to the runs' dirs
    assert holds_no_layers(tmp_path)
    for name in ("tmpabcdefgh", "tmpijklmnop"):  # the mount points of its runs' dirs
        (kept / "u" / "tmp" / name).mkdir()
    assert holds_no_layers(tmp_path)
    (kept / "u" / "tmp" / "tmpijklmnop" / "left").touch()  # (a mount point holds nothing there)
    assert not holds_no_layers(tmp_path)
    (kept / "u" / "tmp" / "tmpijklmnop" / "left").unlink()
    (kept / "u" / "tmp" / "left").touch()
    assert not holds_no_layers(tmp_path)
    (kept / "u" / "tmp" / "left").unlink()
    (kept / "stray").touch()
    assert not holds_no_layers(tmp_path)
    (kept / "stray").unlink()
    (kept / "u" / "var").mkdir()  # a run wrote outside its dir, and its root was not dropped
    (kept / "u" / "var" / "hog").touch()
    assert not holds_no_layers(tmp_path)
    (kept / "u" / "var" / "hog").unlink()
    (kept / "u" / "var").rmdir()
    (kept / "u" / "tmp" / "left").touch()
    assert not holds_no_layers(tmp_path)
    (kept / "u" / "tmp" / "left").unlink()
    (kept / "lock").touch()  # held by its relay
    assert holds_no_layers(tmp_path)
    request = tmp_path / "0123456789abcdef"  # a request's layers, left behind
    request.mkdir()
    assert not holds_no_layers(tmp_path)
    request.rmdir()
    run_dir = tmp_path / "dirs" / "tmpabcdefgh"  # an empty run dir, kept for the next run
    run_dir.mkdir(parents=True)
    assert holds_no_layers(tmp_path)
    (run_dir / "left").touch()  # one a run is in, or one a run left files in
    assert not holds_no_layers(tmp_path)
    (run_dir / "left").unlink()
    (tmp_path / ".owner").unlink()
    assert not holds_no_layers(tmp_path)


def test_a_runs_root_that_changes_as_it_is_looked_at_holds_layers_until_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relay takes a run's mount point out of its kept root after it has answered: a dir that
    goes while ``holds_no_layers`` looks is "not yet", not an error."""
    (tmp_path / ".owner").touch()
    (tmp_path / ".world").mkdir()
    (tmp_path / "kept-0a1b" / "u" / "tmp").mkdir(parents=True)

    def gone(path: str) -> bool:
        raise FileNotFoundError(path)

    monkeypatch.setattr(world, "_only_the_way_down", gone)
    assert not holds_no_layers(tmp_path)
    monkeypatch.undo()
    assert holds_no_layers(tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another uid takes root")
def test_without_idmapped_mounts_what_the_server_makes_for_a_run_is_the_runs(
    tmp_path: Path, host: Path
) -> None:
    """A root server's runs without idmapped mounts: the run's dir and what the server writes in
    it, absolute files and the dirs made for them are the run root's uid's; the temp root's dirs on
    the way keep their host owners, shifted into the run's namespace (the host's root: its root)."""
    if os.stat(tmp_path).st_dev != os.stat("/").st_dev:
        pytest.skip("the test's tmp dir is not on the root file system, the lowest layer")
    owner = world.RunOwner(1 << 30, (1 << 30) + 7)
    assert owner.shifted(0, 0) == (1 << 30, (1 << 30) + 7)
    assert owner.shifted(1000, 65535) == ((1 << 30) + 1000, (1 << 30) + 7 + 65535)
    assert owner.shifted(70000, 65536) == (70000, 65536)  # not mapped: nobody's to the run
    slots = _Slots(tmp_path / "slots")
    slots.path.mkdir()
    space = LayeredWorkspace(slots, str(tmp_path / "view-tmp"), (), owner=owner)  # type: ignore[arg-type]
    restore_files(space, {"in.txt": base64.b64encode(b"x").decode(), "sub/deep.txt": ""})
    (Path(space.host_cwd) / "link").symlink_to("/etc/passwd")
    space.hand_over()
    space.write_file("/data/abs.txt", b"y")
    cwd = Path(space.host_cwd)
    made = [cwd, cwd / "in.txt", cwd / "sub", cwd / "sub" / "deep.txt", cwd / "link"]
    layer = Path(space._layers[0])  # (the layer's own dirs)
    made += [layer / "data", layer / "data" / "abs.txt"]
    assert {(p.lstat().st_uid, p.lstat().st_gid) for p in made} == {(owner.uid, owner.gid)}
    assert Path("/etc/passwd").stat().st_uid == 0  # (a link given, never what it names)
    # The dirs on the way to the run's dir, as the host has them (root's), shifted.
    on_the_way = layer / str(tmp_path).lstrip("/")
    assert on_the_way.stat().st_uid == owner.uid + tmp_path.stat().st_uid


def test_tmp_and_run_start_empty_in_the_runs_view(tmp_path: Path) -> None:
    """What the host keeps in /tmp and /run is not in the run's view (the launcher's mask makes
    them empty); the rest of the host is; /tmp keeps the host's mode (1777) on the way to the
    run's dir."""
    slots = _Slots(tmp_path / "slots")
    slots.path.mkdir()
    view = LayeredWorkspace(slots, "/tmp", ())  # type: ignore[arg-type]
    fd, canary = tempfile.mkstemp(prefix="host-canary-", dir="/tmp")
    try:
        os.write(fd, b"host")
        os.close(fd)
        assert view.read_file(canary) is None and view.resolve(canary) is None
        assert view.read_file("/etc/passwd") == Path("/etc/passwd").read_bytes()
        assert os.path.dirname(view.cwd) == "/tmp"
        assert os.stat(os.path.dirname(view.host_cwd)).st_mode & 0o7777 == os.stat("/tmp").st_mode & 0o7777
        if os.path.isdir("/run"):
            assert view.resolve("/run") == "/run" and view.read_file("/run/" + "x") is None
    finally:
        os.unlink(canary)
