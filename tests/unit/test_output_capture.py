"""CapturedStream (capping, trimming a cut UTF-8 character) and decode_output (SandboxFusion's try_decode)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mocksandbox.execution.process import CapturedStream, decode_output


def stream(cap: int) -> CapturedStream:
    return CapturedStream(cap, bytearray())


# -- decode_output ---------------------------------------------------------------------------------


def test_decode_output_utf8() -> None:
    assert decode_output("héllo ✓\n".encode()) == "héllo ✓\n"
    assert decode_output(b"") == ""


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"\xff", "[DecodeError] 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
        (
            b"ok\xe2\x82",
            "[DecodeError] 'utf-8' codec can't decode bytes in position 2-3: unexpected end of data",
        ),
        (b"a\x80b", "[DecodeError] 'utf-8' codec can't decode byte 0x80 in position 1: invalid start byte"),
    ],
)
def test_decode_output_replaces_the_whole_stream(raw: bytes, expected: str) -> None:
    assert decode_output(raw) == expected


# -- CapturedStream --------------------------------------------------------------------------------


def test_keeps_everything_under_the_cap() -> None:
    captured = stream(10)
    captured.feed(b"abc")
    captured.feed(b"defg")
    assert bytes(captured.data) == b"abcdefg"
    assert not captured.truncated
    assert captured.text() == "abcdefg"


def test_exactly_the_cap_is_not_truncated() -> None:
    captured = stream(4)
    captured.feed(b"ab")
    captured.feed(b"cd")
    assert not captured.truncated
    assert captured.text() == "abcd"


def test_caps_and_marks_truncated() -> None:
    captured = stream(4)
    captured.feed(b"abc")
    captured.feed(b"defgh")
    captured.feed(b"ijk")  # further chunks are dropped whole
    assert bytes(captured.data) == b"abcd"
    assert captured.truncated
    assert captured.text() == "abcd"  # no truncation marker: SandboxFusion never adds one


@pytest.mark.parametrize(
    ("cap", "expected"),
    [
        (1, "a"),  # cut before the 2-byte é
        (2, "a"),  # half of é dropped
        (3, "aé"),
        (4, "aé"),  # first byte of the 3-byte ✓
        (5, "aé"),  # two bytes of ✓
        (6, "aé✓"),
        (7, "aé✓"),  # first byte of the 4-byte 😀
        (9, "aé✓"),  # three bytes of 😀
        (10, "aé✓😀"),
    ],
)
def test_truncation_drops_a_cut_character(cap: int, expected: str) -> None:
    captured = stream(cap)
    captured.feed("aé✓😀b".encode())
    assert captured.truncated
    assert captured.text() == expected


def test_invalid_bytes_are_not_trimmed_away() -> None:
    """Only an incomplete character at the cut is dropped; garbage before it still fails to decode."""
    captured = stream(3)
    captured.feed(b"\xff\xffabc")
    assert captured.text().startswith("[DecodeError]")


def test_untruncated_incomplete_character_is_a_decode_error() -> None:
    """A program that itself ends on half a character gets SandboxFusion's DecodeError."""
    captured = stream(100)
    captured.feed(b"ok\xe2\x82")
    assert captured.text().startswith("[DecodeError]")


chunks = st.lists(st.binary(max_size=40), max_size=8)


@settings(max_examples=50, derandomize=True)
@given(cap=st.integers(0, 64), parts=chunks)
def test_never_exceeds_cap_and_keeps_a_prefix(cap: int, parts: list[bytes]) -> None:
    captured = stream(cap)
    for part in parts:
        captured.feed(part)
    whole = b"".join(parts)
    assert len(captured.data) <= cap
    assert bytes(captured.data) == whole[:cap]
    assert captured.truncated == (len(whole) > cap)


@settings(max_examples=50, derandomize=True)
@given(cap=st.integers(0, 64), text=st.text(max_size=40), cuts=st.lists(st.integers(0, 200), max_size=5))
def test_valid_utf8_always_decodes_to_a_prefix(cap: int, text: str, cuts: list[int]) -> None:
    encoded = text.encode("utf-8")
    bounds = sorted({0, len(encoded), *(c % (len(encoded) + 1) for c in cuts)})
    captured = stream(cap)
    for start, end in itertools.pairwise(bounds):  # chunks may split characters
        captured.feed(encoded[start:end])
    decoded = captured.text()
    assert not decoded.startswith("[DecodeError]")
    assert text.startswith(decoded)
    # at most one (partial) character is lost at the cut
    assert len(encoded[:cap]) - len(decoded.encode()) < 4
    if not captured.truncated:
        assert decoded == text
