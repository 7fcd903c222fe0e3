"""The pytest plugin, exercised the way users run it: in a separate pytest run (pytester)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_fixtures_give_a_real_server_reset_per_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import requests

        def test_first(mocksandbox, mocksandbox_url):
            r = requests.post(mocksandbox_url + "/run_code", json={"code": "print(1)", "language": "python"})
            assert r.json()["run_result"]["stdout"] == "1\\n"
            mocksandbox.assert_requests(1, path="/run_code")
            mocksandbox.fail(503)

        def test_second_starts_clean(mocksandbox, mocksandbox_url):
            # The fault and the journal of the first test are gone.
            assert mocksandbox.stats()["requests_total"] == 0
            r = requests.post(mocksandbox_url + "/run_code", json={"code": "print(2)", "language": "python"})
            assert r.status_code == 200
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_per_worker_servers_under_xdist(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(
        """
        import json, os, pathlib, requests, pytest

        @pytest.mark.parametrize("i", range(6))
        def test_each(i, mocksandbox, mocksandbox_url, tmp_path_factory):
            assert mocksandbox.stats()["requests_total"] == 0
            requests.get(mocksandbox_url + "/v1/ping")
            mocksandbox.assert_requests(1)
            out = pathlib.Path(os.environ["RESULTS_DIR"]) / f"{i}.json"
            out.write_text(json.dumps({"worker": os.environ.get("PYTEST_XDIST_WORKER"), "url": mocksandbox_url}))
        """
    )
    results = pytester.mkdir("results")
    monkeypatch.setenv("RESULTS_DIR", str(results))
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)
    seen = [json.loads(p.read_text()) for p in results.iterdir()]
    urls_by_worker: dict[str, set[str]] = {}
    for item in seen:
        urls_by_worker.setdefault(item["worker"], set()).add(item["url"])
    assert set(urls_by_worker) == {"gw0", "gw1"}
    # One server per worker, each on its own port.
    assert all(len(urls) == 1 for urls in urls_by_worker.values())
    assert len({next(iter(u)) for u in urls_by_worker.values()}) == 2


def test_markers_env_and_server_errors(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import os, pytest, requests

        @pytest.mark.mocksandbox_faults({"match": {"path": "/run_code"}, "action": {"type": "status", "status": 504}, "schedule": {"first": 1}})
        def test_marker_fault(mocksandbox_env):
            url = os.environ["SANDBOX_FUSION_URL"]
            assert url.endswith("/run_code")
            body = {"code": "print(1)", "language": "python"}
            assert requests.post(url, json=body).status_code == 504
            assert requests.post(url, json=body).status_code == 200

        @pytest.mark.mocksandbox_capacity(max_in_flight=2)
        def test_marker_capacity(mocksandbox):
            assert mocksandbox.stats()["max_in_flight_cap"] == 2

        def test_server_error_is_reraised(mocksandbox, mocksandbox_url):
            def explode(request):
                raise RuntimeError("kaboom inside the server")
            mocksandbox.sandbox.engine.run_code = explode
            r = requests.post(mocksandbox_url + "/run_code", json={"code": "x", "language": "python"})
            assert r.status_code == 500
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*RuntimeError: kaboom inside the server*",
            "*raised inside the mocksandbox server while serving /run_code*",
        ]
    )


def test_inprocess_mode_needs_no_socket(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import requests

        def test_inprocess(mocksandbox_inprocess):
            url = mocksandbox_inprocess.url + "/run_code"
            r = requests.post(url, json={"code": "print(40 + 2)", "language": "python"})
            assert r.json()["run_result"]["stdout"] == "42\\n"
            mocksandbox_inprocess.drop("reset", first=1)
            try:
                requests.post(url, json={"code": "print(1)", "language": "python"})
            except requests.ConnectionError:
                pass
            else:
                raise AssertionError("expected a dropped connection")
            mocksandbox_inprocess.assert_requests(2, path="/run_code")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_config_option_reaches_the_server(pytester: pytest.Pytester) -> None:
    config = pytester.makefile(".toml", mockconf='max_in_flight = 5\npod_name = "pod-from-config"\n')
    pytester.makepyfile(
        """
        import requests

        def test_config(mocksandbox, mocksandbox_url):
            assert mocksandbox.stats()["max_in_flight_cap"] == 5
            r = requests.post(mocksandbox_url + "/run_code", json={"code": "print(1)", "language": "python"})
            assert r.json()["executor_pod_name"] == "pod-from-config"
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--mocksandbox-config={config}")
    result.assert_outcomes(passed=1)


def test_suite_skipped_without_a_live_url_runs_under_xdist(pytester: pytest.Pytester) -> None:
    """A verl-style suite that decides at import time whether a sandbox exists."""
    pytester.makepyfile(
        test_sandbox_suite="""
        import os, pytest, requests

        SANDBOX_URL = os.environ.get("SANDBOX_FUSION_URL")
        pytestmark = pytest.mark.skipif(not SANDBOX_URL, reason="SANDBOX_FUSION_URL not set")

        @pytest.mark.parametrize("n", range(4))
        def test_sandbox_runs(n):
            r = requests.post(SANDBOX_URL, json={"code": f"print({n} * 2)", "language": "python"})
            assert r.json()["run_result"]["stdout"] == f"{n * 2}\\n"
        """
    )
    skipped = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    skipped.assert_outcomes(skipped=4)
    ran = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--mocksandbox-export-env")
    ran.assert_outcomes(passed=4)


def test_a_test_asks_for_worker_processes(pytester: pytest.Pytester) -> None:
    """``mocksandbox_workers(2)``: the handle's server is two worker processes over one state; the
    other tests keep the one in-process server."""
    pytester.makepyfile(
        """
        import concurrent.futures, requests, pytest

        def run(url, i):
            return requests.post(url + "/run_code", json={"code": f"print({i})", "language": "python"})

        @pytest.mark.mocksandbox_workers(2)
        def test_two_workers(mocksandbox):
            mocksandbox.fail(503, first=2)
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                statuses = [r.status_code for r in pool.map(lambda i: run(mocksandbox.url, i), range(20))]
            assert statuses.count(503) == 2 and statuses.count(200) == 18
            entries = mocksandbox.assert_requests(20, path="/run_code")
            assert [e.id for e in entries] == list(range(1, 21))
            assert {e.worker for e in entries} <= {"worker-1", "worker-2"}

        @pytest.mark.mocksandbox_workers(2)
        def test_two_workers_start_clean(mocksandbox):
            assert mocksandbox.stats()["requests_total"] == 0
            assert run(mocksandbox.url, 1).status_code == 200

        def test_one_server_otherwise(mocksandbox):
            assert run(mocksandbox.url, 1).status_code == 200
            (entry,) = mocksandbox.requests()
            assert entry.worker is None
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_divergences_are_reported_and_fail_on_request_and_output_mode_reproduces_production(
    pytester: pytest.Pytester,
) -> None:
    """A program printing 100000 lines passes on the mock; the summary says SandboxFusion would
    have stalled on it; the option (or marker) fails the test; the output-mode marker answers as
    SandboxFusion does (TimeLimitExceeded, output cut), with no divergence left to report."""
    pytester.makepyfile(
        """
        import pytest, requests
        from mocksandbox.divergence import SANDBOXFUSION_READER_PAUSE_BYTES as PAUSE
        from mocksandbox.execution.process import _SANDBOXFUSION_READ_CHUNK as CHUNK

        PROGRAM = "for i in range(100000): print(i)"

        def run(url, run_timeout=30):
            # 30 s where the run must finish: 100000 prints can take seconds on a loaded machine.
            body = {"code": PROGRAM, "language": "python", "run_timeout": run_timeout}
            return requests.post(url + "/run_code", json=body).json()["run_result"]

        def test_floods_stdout(mocksandbox, mocksandbox_url):
            result = run(mocksandbox_url)
            assert result["status"] == "Finished" and result["stdout"].endswith("99999\\n")
            (entry,) = mocksandbox.divergences()
            assert entry.divergences[0].startswith("output: stdout of 588890 bytes")
            assert mocksandbox.stats()["divergences"] == {"total": 1, "by_kind": {"output": 1}}

        @pytest.mark.mocksandbox_fail_on_divergence
        def test_marked(mocksandbox_url, mocksandbox):
            assert run(mocksandbox_url)["status"] == "Finished"

        @pytest.mark.mocksandbox_output_mode("sandboxfusion")
        def test_as_production(mocksandbox, mocksandbox_url):
            result = run(mocksandbox_url, run_timeout=2)  # the stalled program waits it out
            assert result["status"] == "TimeLimitExceeded"
            # Cut past 128 KiB, where SandboxFusion's reader pauses: its last read takes what has
            # piled up, up to one more chunk (as SandboxFusion's own answers show; the recorded
            # cases are held in tests/engine/test_output_mode.py).
            assert PAUSE < len(result["stdout"]) <= PAUSE + CHUNK
            assert "".join(f"{i}\\n" for i in range(100000)).startswith(result["stdout"])
            assert mocksandbox.divergences() == []
        """
    )
    reported = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    reported.assert_outcomes(passed=2, failed=1)  # test_marked
    reported.stdout.fnmatch_lines(
        [
            "*mocksandbox: where SandboxFusion would have answered differently*",
            "*test_floods_stdout",
            "*POST /run_code python -> 200 *divergences=1*",
            "*output: stdout of 588890 bytes: SandboxFusion stops reading*",
        ]
    )
    assert "test_as_production" not in reported.stdout.str().split("answered differently")[1]
    failing = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "-n",
        "2",
        "--mocksandbox-fail-on-divergence",
        "-k",
        "floods or as_production",
    )
    failing.assert_outcomes(passed=1, failed=1)
    failing.stdout.fnmatch_lines(["*where SandboxFusion would have answered*", "*FAILED*test_floods_stdout*"])


def test_what_held_for_runs_is_said_and_a_fall_back_can_be_made_an_error(pytester: pytest.Pytester) -> None:
    """The summary says what held for the session server's runs; with mocksandbox_require_isolation a
    protection ``auto`` could not give (here, a host where worlds cannot be had) is an error."""
    pytester.makeconftest(
        """
        import mocksandbox.execution.engine as engine

        if __import__("os").environ.get("NO_WORLDS_HERE"):
            engine.lite_unavailable_reason = lambda: "lite needs overlayfs (modprobe overlay)"
        """
    )
    pytester.makepyfile(
        """
        import requests

        def test_runs(mocksandbox, mocksandbox_url):
            r = requests.post(mocksandbox_url + "/run_code", json={"code": "print(1)", "language": "python"})
            assert r.json()["run_result"]["stdout"] == "1\\n"
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*mocksandbox: what held for the runs*", "*files, processes, network*hold*"])
    pytester.makeini("[pytest]\nmocksandbox_require_isolation = true\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)  # everything held here: nothing to refuse
    import os

    os.environ["NO_WORLDS_HERE"] = "1"
    try:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    finally:
        del os.environ["NO_WORLDS_HERE"]
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*mocksandbox_require_isolation: not in force for the server's runs: a world of its own*overlayfs*"]
    )
