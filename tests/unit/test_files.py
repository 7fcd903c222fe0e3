"""restore_files / fetch_files: SandboxFusion's files-in, files-out semantics (contract §2.1)."""

from __future__ import annotations

import base64
import binascii
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mocksandbox.execution.engine import fetch_files, restore_files


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# -- restore_files ---------------------------------------------------------------------------------


def test_restores_relative_paths_creating_parents(tmp_path: Path) -> None:
    restore_files(str(tmp_path), {"a.txt": b64(b"A"), "deep/er/b.bin": b64(b"\x00\xff")})
    assert (tmp_path / "a.txt").read_bytes() == b"A"
    assert (tmp_path / "deep" / "er" / "b.bin").read_bytes() == b"\x00\xff"


def test_null_values_are_skipped(tmp_path: Path) -> None:
    restore_files(str(tmp_path), {"skip.txt": None, "sub/skip.txt": None})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["IGNORE_THIS_FILE", "x_IGNORE_THIS_FILE.py", "IGNORE_THIS_FILE/inner.txt"])
def test_ignore_this_file_keys_are_skipped_before_any_directory_is_made(tmp_path: Path, name: str) -> None:
    restore_files(str(tmp_path), {name: b64(b"x")})
    assert list(tmp_path.iterdir()) == []


def test_ignore_match_is_case_sensitive(tmp_path: Path) -> None:
    restore_files(str(tmp_path), {"ignore_this_file": b64(b"x")})
    assert (tmp_path / "ignore_this_file").read_bytes() == b"x"


def test_absolute_paths_are_honoured(tmp_path: Path) -> None:
    workdir, elsewhere = tmp_path / "work", tmp_path / "elsewhere" / "f.txt"
    workdir.mkdir()
    restore_files(str(workdir), {str(elsewhere): b64(b"abs")})
    assert elsewhere.read_bytes() == b"abs"
    assert list(workdir.iterdir()) == []


def test_empty_content_writes_an_empty_file(tmp_path: Path) -> None:
    restore_files(str(tmp_path), {"empty": ""})
    assert (tmp_path / "empty").read_bytes() == b""


def test_later_keys_overwrite(tmp_path: Path) -> None:
    restore_files(str(tmp_path), {"f": b64(b"one"), "./f": b64(b"two")})
    assert (tmp_path / "f").read_bytes() == b"two"


def test_bad_base64_raises_binascii_error(tmp_path: Path) -> None:
    with pytest.raises(binascii.Error, match=r"number of data characters \(9\)"):
        restore_files(str(tmp_path), {"a.txt": "aGVsbG8gd"})


def test_files_before_the_bad_one_are_written(tmp_path: Path) -> None:
    with pytest.raises(binascii.Error):
        restore_files(str(tmp_path), {"good": b64(b"g"), "bad": "aGVsbG8gd"})
    assert (tmp_path / "good").read_bytes() == b"g"


# -- fetch_files -----------------------------------------------------------------------------------


def test_fetches_regular_files_keyed_by_the_string_asked_for(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x")
    (tmp_path / "out.txt").write_bytes(b"written by code")
    fetched = fetch_files(str(tmp_path), ["out.txt", "missing.txt", "d", "d/f", "./d/f", "d/../out.txt"])
    assert list(fetched.items()) == [
        ("out.txt", b64(b"written by code")),
        ("d/f", "eA=="),
        ("./d/f", "eA=="),
        ("d/../out.txt", b64(b"written by code")),
    ]


def test_fetches_absolute_and_outside_paths(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    (tmp_path / "outside.bin").write_bytes(b"\x00\x01")
    absolute = str(tmp_path / "outside.bin")
    assert fetch_files(str(workdir), [absolute, "../outside.bin"]) == {
        absolute: "AAE=",
        "../outside.bin": "AAE=",
    }


def test_follows_symlinks_to_files_but_not_dangling_ones(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(b"r")
    os.symlink(tmp_path / "real", tmp_path / "link")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    assert fetch_files(str(tmp_path), ["link", "dangling"]) == {"link": "cg=="}


def test_duplicates_give_one_key_and_nothing_asked_gives_empty(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"f")
    assert fetch_files(str(tmp_path), ["f", "f"]) == {"f": "Zg=="}
    assert fetch_files(str(tmp_path), []) == {}


# -- together --------------------------------------------------------------------------------------

component = st.text(alphabet="abcdefghij0123456789_-.", min_size=1, max_size=6).filter(
    lambda c: c not in (".", "..")
)
# Two components each: no name can be both a file and another name's directory.
relative_names = st.tuples(component, component).map("/".join)


@settings(max_examples=50, derandomize=True, deadline=None)  # file I/O: no time limit
@given(st.dictionaries(relative_names, st.binary(max_size=64), max_size=6))
def test_restore_then_fetch_round_trips(files: dict[str, bytes]) -> None:
    encoded = {name: b64(data) for name, data in files.items()}
    with tempfile.TemporaryDirectory() as workdir:
        restore_files(workdir, encoded)
        fetched = fetch_files(workdir, [*files, *(f"./{name}" for name in files)])
    assert {k: v for k, v in fetched.items() if not k.startswith("./")} == encoded
    assert {k[2:]: v for k, v in fetched.items() if k.startswith("./")} == encoded
