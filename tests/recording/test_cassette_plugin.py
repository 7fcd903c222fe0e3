"""``@pytest.mark.mocksandbox_cassette`` and ``--mocksandbox-record URL``, in separate pytest runs
(pytester) as users run them: re-record against a live deployment under xdist with one cassette
shared by both workers, then replay with the deployment stopped."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import requests

from mocksandbox.recording.cassette import read_cassette
from mocksandbox.serving.single import running_server
from mocksandbox.settings import load_settings

pytestmark = pytest.mark.slow

SUITE = """
import pytest, requests

@pytest.mark.mocksandbox_cassette("cassettes/shared.jsonl")
@pytest.mark.parametrize("n", range(4))
def test_program(mocksandbox, n):
    answer = requests.post(mocksandbox.url + "/run_code", json={"code": f"print({n} * 11)", "language": "python"})
    assert answer.json()["run_result"]["stdout"] == f"{n * 11}\\n"
    (entry,) = mocksandbox.requests(path="/run_code")
    assert entry.status == 200

def test_unmarked_runs_here(mocksandbox):
    answer = requests.post(mocksandbox.url + "/run_code", json={"code": "print('here')", "language": "python"})
    assert answer.json()["run_result"]["stdout"] == "here\\n"
    assert mocksandbox.requests()[0].replayed is None
"""

MISS = """
import pytest, requests

@pytest.mark.mocksandbox_cassette("cassettes/shared.jsonl")
def test_unrecorded(mocksandbox):
    requests.post(mocksandbox.url + "/run_code", json={"code": "print(0 * 12)", "language": "python"})

@pytest.mark.mocksandbox_cassette("cassettes/shared.jsonl", mode="fallback")
def test_unrecorded_in_fallback(mocksandbox):
    answer = requests.post(mocksandbox.url + "/run_code", json={"code": "print(0 * 12)", "language": "python"})
    assert answer.json()["run_result"]["stdout"] == "0\\n"

@pytest.mark.mocksandbox_cassette("cassettes/replayed_marks.jsonl")
def test_missing_cassette(mocksandbox):
    pass
"""


def test_rerecord_under_xdist_then_replay_with_the_deployment_stopped(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    cassette = Path(pytester.path) / "cassettes" / "shared.jsonl"
    cassette.parent.mkdir()
    cassette.write_text('{"request": {}, "run": "an older run"}\n')  # replaced by the re-record
    with running_server(load_settings(overrides={"port": 0})) as live:
        # --dist each: every test runs on both workers, so both write the shared cassette at once.
        recorded = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "-n", "2", "--dist", "each", "--mocksandbox-record", live.url
        )
        recorded.assert_outcomes(passed=10)
        assert Counter(e.path for e in live.sandbox.requests()) == {"/run_code": 8}
    with pytest.raises(requests.ConnectionError):
        requests.get(live.url + "/v1/ping", timeout=5)
    exchanges = read_cassette(cassette)
    # Both workers' exchanges, one run, none lost (the old run's line is gone).
    assert len(exchanges) == 8 and len({e.run for e in exchanges}) == 1
    assert Counter(e.request.json_field("code") for e in exchanges) == {
        f"print({n} * 11)": 2 for n in range(4)
    }

    replayed = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    replayed.assert_outcomes(passed=5)

    pytester.makepyfile(test_miss=MISS)
    misses = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_miss.py")
    misses.assert_outcomes(passed=2, errors=2)  # the miss errs at teardown, its call passed
    output = misses.stdout.str()
    # The strict miss fails its test with the replay's message, nearest recording and difference.
    assert "CassetteMiss: mocksandbox replay (strict): no recording in" in output
    assert "code: sent 'print(0 * 12)', recorded 'print(0 * 11)' (first difference at character 11)" in output
    assert (
        "replayed_marks.jsonl does not exist: record it against a live deployment with pytest --mocksandbox-record URL"
        in output
    )
