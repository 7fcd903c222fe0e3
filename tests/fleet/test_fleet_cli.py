"""``mocksandbox serve --ray``: the options, the one-line error without the extra, and (slow) the
whole path from the command line to a fleet on a local Ray instance and back to nothing."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from typing import Any

import pytest
import requests

from mocksandbox import cli, extras


def test_without_the_extra_serve_ray_says_which_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == "a2wsgi" else real_find_spec(name, package)

    monkeypatch.setattr(extras.importlib.util, "find_spec", find_spec)
    assert cli.main(["serve", "--ray", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "mocksandbox: the Ray fleet (serve --ray) needs a2wsgi: pip install 'mocksandbox[fleet]'\n"


def test_replicas_without_ray_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--replicas", "3", "--port", "0"]) == 2
    assert "--replicas and --proxy-location go with --ray" in capsys.readouterr().err


def test_the_fleet_module_imports_no_ray() -> None:
    code = "import sys, mocksandbox.serving.fleet, mocksandbox.cli; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def _local_ray_env() -> dict[str, str]:
    """The environment for `serve --ray` with no address: a new local Ray, never one RAY_ADDRESS names."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    return env


_ORPHANS_AND_A_CHILD_THAT_STAYS = """
import subprocess
from mocksandbox.execution.launcher import become_subreaper
from mocksandbox.serving.fleet import end_descendants
assert become_subreaper()
# Two orphans, as a raylet's workers are when the raylet exits first, and a child that does not
# exit on its own.
subprocess.run(["sh", "-c", "sleep 300 & sleep 300 & exit 0"], check=True)
stays = subprocess.Popen(["sleep", "300"])
print(len(end_descendants(grace_s=0.5)), flush=True)
"""


def test_a_stopped_local_fleet_ends_and_reaps_what_its_processes_left() -> None:
    """What `serve --ray` does after ``ray.shutdown``, without Ray: orphans handed to the
    subreaper and a child that outlives the grace are ended and reaped; nothing of the session
    is left, not even a zombie."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _ORPHANS_AND_A_CHILD_THAT_STAYS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert out.split() == ["3"]  # the two orphans and the child that stayed
        leftover = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True).stdout
        assert leftover.split() == []
    finally:
        subprocess.run(["pkill", "-KILL", "-s", str(proc.pid)], capture_output=True)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_serve_ray_starts_a_local_fleet_and_ctrl_c_takes_it_all_down() -> None:
    pytest.importorskip("ray.serve")
    env = _local_ray_env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mocksandbox.cli", "serve", "--ray", "--replicas", "2", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its Ray processes are found by their session, and none outlives it
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while line and "serving on" not in line:
            line = proc.stdout.readline()
        match = re.search(r"serving on (http://\S+) with 2 replicas", line)
        assert match, line + (proc.stderr.read() if proc.stderr else "")
        url = match.group(1)
        with requests.Session() as session:
            session.trust_env = False
            reply = session.post(f"{url}/run_code", json={"code": "print(6 * 7)", "language": "python"})
            assert reply.status_code == 200 and reply.json()["run_result"]["stdout"] == "42\n"
            assert session.get(f"{url}/_mock/stats").json()["requests_total"] == 1
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        assert "stopping the fleet" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # Nothing of that Ray instance is left running.
    leftover = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert leftover == [], leftover


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_the_fixture_gives_a_test_a_fleet_on_a_local_ray(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray.serve")
    pytester.makepyfile(
        """
        import pytest, requests

        @pytest.mark.mocksandbox_fleet(replicas=2)
        def test_one(mocksandbox_fleet):
            mocksandbox_fleet.fail(503, first=1)
            url = mocksandbox_fleet.run_code_url
            codes = [requests.post(url, json={"code": "print(1)", "language": "python"}).status_code for _ in range(3)]
            assert codes == [503, 200, 200]
            assert len(mocksandbox_fleet.sandbox.replicas()) == 2

        @pytest.mark.mocksandbox_fleet(replicas=2)
        def test_two_starts_clean(mocksandbox_fleet):
            assert mocksandbox_fleet.stats()["requests_total"] == 0
            assert mocksandbox_fleet.sandbox.fault_rules() == []
        """
    )
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a new local instance, whatever runs here
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2)


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_serve_ray_on_a_port_in_use_says_so_in_one_line() -> None:
    # The node servers share their port (SO_REUSEPORT): without the check, another server that set
    # it too would silently take half the connections, and a plain one would fail each replica.
    pytest.importorskip("ray.serve")
    import socket

    env = _local_ray_env()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "mocksandbox.cli", "serve", "--ray", "--port", str(port)],
            capture_output=True,
            text=True,
            env=env,
            timeout=240,
            start_new_session=True,
        )
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"mocksandbox: cannot serve on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "Traceback" not in result.stderr
