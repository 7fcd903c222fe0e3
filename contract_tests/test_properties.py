"""Generated programs whose answers are known without running them (hypothesis).

Bounded and derandomized by default; ``--contract-thorough`` runs many more examples, and
hypothesis' own ``--hypothesis-seed=N`` (with ``--contract-thorough``) picks other programs.
"""

from __future__ import annotations

import string

from contract_support import Target, b64
from hypothesis import given
from hypothesis import strategies as st

# Text that survives UTF-8 and JSON both ways: any code point but surrogates.
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300)
NAME_PART = st.text(string.ascii_lowercase + string.digits + "_", min_size=1, max_size=8)
FILE_NAME = st.lists(NAME_PART, min_size=1, max_size=3).map("/".join).map(lambda p: p + ".bin")


@given(out=TEXT, err=TEXT)
def test_text_to_stdout_and_stderr(target: Target, out: str, err: str) -> None:
    code = f"import sys\nsys.stdout.buffer.write({out.encode()!r})\nsys.stderr.buffer.write({err.encode()!r})"
    run = target.run_code(code)["run_result"]
    assert (run["stdout"], run["stderr"]) == (out, err)


@given(code=st.integers(0, 255))
def test_exit_codes(target: Target, code: int) -> None:
    body = target.run_code(f"import sys\nsys.exit({code})")
    assert body["run_result"]["return_code"] == code
    assert body["status"] == ("Success" if code == 0 else "Failed")


@given(text=TEXT)
def test_stdin_is_echoed(target: Target, text: str) -> None:
    code = "import sys\nsys.stdout.buffer.write(sys.stdin.buffer.read())"
    assert target.run_code(code, stdin=text)["run_result"]["stdout"] == text


@given(name=FILE_NAME, data=st.binary(max_size=2048))
def test_file_round_trip(target: Target, name: str, data: bytes) -> None:
    code = f"import shutil\nshutil.copyfile({name!r}, 'copy.bin')"
    body = target.run_code(code, files={name: b64(data)}, fetch_files=[name, "copy.bin"])
    assert body["status"] == "Success"
    assert body["files"] == {name: b64(data), "copy.bin": b64(data)}


@given(fraction=st.floats(0.0, 0.1))
def test_sleep_well_under_the_timeout_finishes(target: Target, fraction: float) -> None:
    run = target.run_code(f"import time\ntime.sleep({fraction * 3:.3f})\nprint('done')", run_timeout=3)[
        "run_result"
    ]
    assert (run["status"], run["stdout"]) == ("Finished", "done\n")


@given(factor=st.floats(3.0, 6.0))
def test_sleep_over_the_timeout_times_out(target: Target, factor: float) -> None:
    run = target.run_code(f"import time\ntime.sleep({0.3 * factor:.3f})\nprint('done')", run_timeout=0.3)[
        "run_result"
    ]
    assert (run["status"], run["return_code"], run["stdout"]) == ("TimeLimitExceeded", None, "")
