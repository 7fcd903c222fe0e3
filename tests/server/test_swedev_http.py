"""The swedev endpoints over real sockets, driven the way verl's swedev code drives them.

* verl's client calls (``swedev_utils``, copied from the design document): start -> actions ->
  postprocess -> reward with aiohttp, sids as strings and as ints, ``calc_reward`` on the answer;
* 20 concurrent episodes over the shipped instances, each sending its gold patch in a ```diff block,
  all earn 1.0, with no cross-talk; episodes with no action earn less;
* an episode of OpenHands calls (view, str_replace, execute_bash running the tests, finish);
* 404/409/422/503 answers, ``GET /_mock/sessions``, and the ``--swedev-backend`` adapter with the
  mock itself as the SandboxFusion backend.

Nothing here asserts on wall-clock durations; all traffic stays on loopback.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import requests

from mocksandbox.core import MockSandbox
from mocksandbox.serving.single import ServerThread, running_server
from mocksandbox.sessions import Instance, InstanceRegistry
from mocksandbox.sessions.scripted import diff_block, function_call, gold_editor_calls
from mocksandbox.settings import load_settings

try:
    import aiohttp
except ImportError:  # the dev extra's; only the tests that drive verl's client need it (with_aiohttp)
    aiohttp = None

SHIPPED = InstanceRegistry.from_paths([]).all()
UNITCONV = next(i for i in SHIPPED if i.instance_id == "sciutils__unitconv-311")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_server(load_settings(overrides={"port": 0})) as srv:
        yield srv


@pytest.fixture
def http() -> Iterator[requests.Session]:
    session = requests.Session()
    session.trust_env = False  # no proxies: loopback only
    yield session
    session.close()


@pytest.fixture
def with_aiohttp(require_or_skip: Callable[[str | None], None]) -> None:
    """verl's client speaks aiohttp: its tests skip (or fail, where everything is required) without."""
    missing = "aiohttp is not installed (verl's swedev client uses it): pip install -e '.[dev]'"
    require_or_skip(None if aiohttp else missing)


# -- verl's client, as the design document quotes it (swedev_utils.py, reward_manager/swedev.py) --


class VerlSwedevClient:
    """verl's four calls, verbatim but for the base URL (``get_api``) and torch's ``.item()``."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def get_api(self, type: str) -> str:
        assert type in ["reward", "action", "start", "postprocess"]
        path = {
            "reward": "compute_reward",
            "action": "process_action",
            "start": "start_instance",
            "postprocess": "postprocess",
        }
        return f"{self.base_url}/{path[type]}"

    async def initialize_runtime(self, instance_id: Any) -> Any:
        url = self.get_api(type="start")
        payload = {"instance_hash": instance_id}
        try:
            async with aiohttp.ClientSession() as session:  # noqa: SIM117 (verl's code as it is)
                async with session.post(url, json=payload, timeout=600) as response:
                    return await response.json()
        except Exception as e:
            print(f"Initializing - API call failed: {e}")
            return None

    async def call_observation_api(self, sid: Any, text: str) -> Any:
        url = self.get_api(type="action")
        payload = {"sid": sid, "content": text}
        try:
            async with aiohttp.ClientSession() as session:  # noqa: SIM117 (verl's code as it is)
                async with session.post(url, json=payload) as response:
                    return await response.json()
        except Exception as e:
            print(f"Observation - API call failed: {e}")
            return None

    async def call_postprocess_api(self, sid: Any) -> Any:
        url = self.get_api(type="postprocess")
        payload = {"sid": sid}
        try:
            async with aiohttp.ClientSession() as session:  # noqa: SIM117 (verl's code as it is)
                async with session.post(url, json=payload, timeout=600) as response:
                    return await response.json()
        except Exception as e:
            print(f"Postprocess - API call failed: {e}")
            return None

    async def fetch_reward(self, sid: int, session: aiohttp.ClientSession) -> float:
        try:
            payload = {"sid": sid}  # verl: sid.item() of an int64 tensor
            async with session.post(
                self.get_api(type="reward"), json=payload, timeout=aiohttp.ClientTimeout(total=300)
            ) as response:
                if response.status == 200:
                    result = await response.json()
                    return float(calc_reward(result))
                print(f"fetch_reward - API request failed with text {response.text} for sid: {sid}")
                return 0.0
        except Exception as e:
            print(f"fetch_reward - Error fetching reward for sid {sid}: {e}")
            return 0.0


def calc_reward(reward_json: dict[str, Any]) -> float:
    if "reward" in reward_json:
        return float(reward_json["reward"])
    try:
        return float(reward_json["f2p_count"] / reward_json["f2p_total"])
    except Exception:
        return 0.0


def is_stop(action: str) -> bool:
    return "<function=finish>" in action


async def rollout(client: VerlSwedevClient, instance: Instance, actions: list[str]) -> dict[str, Any]:
    """One episode as verl runs it: start, the actions until finish, postprocess; then the reward."""
    result = await client.initialize_runtime(instance.instance_hash)
    sid, sids = result["sid"], int(result["sid"])
    observations = []
    for index, action in enumerate(actions):
        if is_stop(action):
            break
        # The sid travels as the string from /start_instance, or as the int from the tensor.
        reply = await client.call_observation_api(sid if index % 2 == 0 else sids, action)
        try:
            observations.append(reply["content"])
        except Exception:
            observations.append("Error")
    await client.call_postprocess_api(sid)
    async with aiohttp.ClientSession() as session:
        reward = await client.fetch_reward(sids, session)
    return {"sid": sid, "observations": observations, "reward": reward}


# -- Done when ------------------------------------------------------------------------------------


@pytest.mark.usefixtures("with_aiohttp")
def test_twenty_concurrent_gold_episodes_earn_one_and_idle_ones_less(server: ServerThread) -> None:
    client = VerlSwedevClient(server.url)
    episodes = []
    for index in range(20):
        instance = SHIPPED[index % len(SHIPPED)]
        ws = instance.workspace_path
        marker = f"episode-{index}"
        episodes.append(
            (
                instance,
                [
                    function_call(
                        "execute_bash", command=f"echo {marker} > /tmp/who && echo {marker} >> {ws}/README.md"
                    ),
                    diff_block(instance.patch),
                    function_call("execute_bash", command=f"sleep 0.2; cat /tmp/who; tail -1 {ws}/README.md"),
                    function_call("finish"),
                ],
                marker,
            )
        )
    idle = [(instance, [], "") for instance in SHIPPED]

    async def run_all() -> list[dict[str, Any]]:
        return await asyncio.gather(*(rollout(client, inst, acts) for inst, acts, _ in episodes + idle))

    results = asyncio.run(run_all())
    for (_, _, marker), result in zip(episodes, results[:20], strict=True):
        assert result["reward"] == 1.0
        assert "Applied patch" in result["observations"][1]
        # each episode saw its own /tmp and its own repository, nobody else's
        assert result["observations"][2].split("\n")[1:3] == [marker, marker]
    for result in results[20:]:
        assert result["reward"] < 1.0
    listing = server.sandbox.sessions.list_sessions()
    finished = {s["sid"]: s for s in listing["finished"]}
    assert {r["sid"] for r in results} <= set(finished)


def test_an_openhands_episode_solves_an_instance(server: ServerThread, http: requests.Session) -> None:
    base, ws = server.url, UNITCONV.workspace_path
    sid = http.post(f"{base}/start_instance", json={"instance_hash": str(UNITCONV.instance_hash)}).json()[
        "sid"
    ]

    def act(text: str) -> str:
        reply = http.post(f"{base}/process_action", json={"sid": sid, "content": text})
        assert reply.status_code == 200
        content: str = reply.json()["content"]
        return content

    listing = act(function_call("str_replace_editor", "Let me look around.", command="view", path=ws))
    assert f"{ws}/unitconv/registry.py" in listing
    source = act(function_call("str_replace_editor", command="view", path=f"{ws}/unitconv/registry.py"))
    assert "Here's the result of running `cat -n`" in source and "key = symbol.strip().lower()" in source
    repro = act(
        function_call(
            "execute_bash",
            command=f"cd {ws} && python -c \"from unitconv import convert; print(convert(1, 'Mm', 'km'))\"",
        )
    )
    assert "1e-06" in repro
    for edit in gold_editor_calls(UNITCONV):
        assert "has been edited" in act(edit)
    tests = act(function_call("execute_bash", command="python -m pytest -q tests"))
    assert "passed" in tests and tests.endswith("[Command finished with exit code 0]")
    # verl stops before sending finish; the mock answers it anyway.
    assert act(function_call("finish")).startswith("EXECUTION RESULT of [finish]:")
    assert http.post(f"{base}/postprocess", json={"sid": sid}).status_code == 200
    reward = http.post(f"{base}/compute_reward", json={"sid": int(sid)}).json()
    assert reward["reward"] == 1.0 and reward["resolved"] is True
    assert list(reward) == [
        "reward",
        "f2p_count",
        "f2p_total",
        "p2p_count",
        "p2p_total",
        "resolved",
        "patch_is_None",
        "patch_exists",
        "patch_successfully_applied",
    ]


# -- errors and the control endpoint -------------------------------------------------------------


def test_unknown_ids_are_404_with_a_detail_that_says_which(
    server: ServerThread, http: requests.Session
) -> None:
    base = server.url
    reply = http.post(f"{base}/start_instance", json={"instance_hash": "3864552457764042195"})
    assert reply.status_code == 404
    assert reply.json()["detail"].startswith("unknown instance_hash '3864552457764042195'")
    for path, body in (
        ("/process_action", {"sid": "5671949450826943757", "content": "ls"}),
        ("/postprocess", {"sid": 5671949450826943757}),
        ("/compute_reward", {"sid": 5671949450826943757}),
    ):
        reply = http.post(base + path, json=body)
        assert reply.status_code == 404, path
        assert reply.json() == {"detail": "unknown sid '5671949450826943757': no session has this id"}


@pytest.mark.parametrize(
    ("path", "body", "loc"),
    [
        ("/start_instance", {}, ["body"]),  # exactly one of instance_hash and instance_id
        ("/process_action", {"sid": "1"}, ["body", "content"]),
        ("/process_action", {"sid": [1], "content": "x"}, ["body", "sid", "int"]),
        ("/compute_reward", None, ["body"]),
    ],
)
def test_malformed_bodies_are_422_like_the_rest_of_the_api(
    server: ServerThread, http: requests.Session, path: str, body: Any, loc: list[str]
) -> None:
    reply = http.post(server.url + path, json=body) if body is not None else http.post(server.url + path)
    assert reply.status_code == 422
    detail = reply.json()["detail"]
    assert detail[0]["loc"] == loc
    assert detail[0]["url"].startswith("https://errors.pydantic.dev/")


def test_ended_sessions_409_and_the_cap_503(server: ServerThread, http: requests.Session) -> None:
    base, instance = server.url, SHIPPED[0]
    sid = http.post(f"{base}/start_instance", json={"instance_hash": instance.instance_hash}).json()["sid"]
    assert http.post(f"{base}/postprocess", json={"sid": sid}).json()["state"] == "finished"
    assert (
        http.post(f"{base}/postprocess", json={"sid": int(sid)}).json()["state"] == "finished"
    )  # idempotent
    reply = http.post(f"{base}/process_action", json={"sid": sid, "content": "ls"})
    assert reply.status_code == 409 and "has ended" in reply.json()["detail"]

    sessions = server.sandbox.sessions
    saved = sessions.config
    live = len(sessions.list_sessions()["live"])
    sessions.config = replace(saved, max_sessions=live)
    try:
        reply = http.post(f"{base}/start_instance", json={"instance_hash": instance.instance_hash})
    finally:
        sessions.config = saved
    assert reply.status_code == 503
    assert "too many live sessions" in reply.json()["detail"] and reply.headers["Retry-After"] == "1"


def test_mock_sessions_lists_live_finished_and_leaked(server: ServerThread, http: requests.Session) -> None:
    base, instance = server.url, SHIPPED[1]
    assert http.post(f"{base}/_mock/reset").status_code == 200
    live = http.post(f"{base}/start_instance", json={"instance_hash": instance.instance_hash}).json()["sid"]
    done = http.post(f"{base}/start_instance", json={"instance_hash": instance.instance_hash}).json()["sid"]
    http.post(f"{base}/postprocess", json={"sid": done})
    listing = http.get(f"{base}/_mock/sessions").json()
    assert listing["counts"] == {"live": 1, "finished": 1, "leaked": 0}
    assert listing["live"][0]["sid"] == live and listing["finished"][0]["sid"] == done
    assert listing["finished"][0]["result"]["reward"] == 0.0
    one = http.get(f"{base}/_mock/sessions/{done}").json()
    assert one["workspace"] == instance.workspace_path and one["patch"] == ""
    assert http.get(f"{base}/_mock/sessions/12").status_code == 404
    hashes = {
        i["instance_id"]: i["instance_hash"] for i in http.get(f"{base}/_mock/instances").json()["instances"]
    }
    assert hashes[instance.instance_id] == str(instance.instance_hash)
    assert http.post(f"{base}/_mock/reset").status_code == 200  # reset ends every session
    assert http.get(f"{base}/_mock/sessions").json()["counts"] == {"live": 0, "finished": 0, "leaked": 0}


# -- the SandboxFusion adapter --------------------------------------------------------------------


@pytest.mark.usefixtures("with_aiohttp")
def test_swedev_backend_runs_commands_and_tests_on_a_sandboxfusion(server: ServerThread) -> None:
    """``--swedev-backend URL`` with the mock itself as the backend: the session state stays in the
    adapter, every command and test goes to the backend's /run_code with the repository as files."""
    # The interpreter of the backend's sandbox runtime: the one its runs run Python on, which they
    # see wherever it lives (this venv's, under /tmp in a clone there, only where it is that one).
    backend_python = server.sandbox.settings.python
    settings = load_settings(
        overrides={"port": 0, "swedev_backend": server.url, "swedev_backend_python": backend_python}
    )
    box = MockSandbox.create(settings)
    adapter = ServerThread(box, "127.0.0.1", 0).start()
    backend_runs_before = len(server.sandbox.requests(path="/run_code"))
    try:
        instance = next(i for i in SHIPPED if i.instance_id == "acme__pagekit-17")
        ws = instance.workspace_path
        actions = [
            function_call(
                "execute_bash",
                command=f"cd {ws}/pagekit && echo hi > /tmp/note && echo new > {ws}/NEW.txt && rm {ws}/README.md",
            ),
            function_call("execute_bash", command="pwd; cat /tmp/note; ls .."),
            *gold_editor_calls(instance),
            function_call("execute_bash", command=f"cd {ws} && python -m pytest -q tests"),
        ]
        result = asyncio.run(rollout(VerlSwedevClient(adapter.url), instance, actions))
    finally:
        adapter.stop()
        box.close()
    shell = result["observations"][1]
    assert shell.startswith(f"EXECUTION RESULT of [execute_bash]:\n{ws}/pagekit\nhi\n")  # cwd and /tmp kept
    assert "NEW.txt" in shell and "README.md" not in shell  # changes made there came back
    assert "passed" in result["observations"][-1]
    assert result["reward"] == 1.0
    # three commands and the scoring run went to the backend; the editor ran in the adapter
    assert len(server.sandbox.requests(path="/run_code")) - backend_runs_before == 4


# -- mocksandbox serve: user instances and a restart ---------------------------------------------


def _serve(*args: str) -> tuple[subprocess.Popen[str], str, str]:
    """A ``mocksandbox serve`` process, its URL and its start-up banner."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mocksandbox.cli", "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    banner = ""
    while "press Ctrl-C" not in banner:
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            raise AssertionError(f"the server did not start: {banner!r} {proc.communicate()[1]}")
        banner += line
    match = re.search(r"serving on (http://\S+)", banner)
    assert match, banner
    return proc, match.group(1), banner


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 0


def test_serve_user_instances_and_a_restart_that_loses_nothing(
    tmp_path: Path, http: requests.Session
) -> None:
    """``mocksandbox serve --instances rows.jsonl --state-dir DIR``, stopped and started again."""
    (tmp_path / "repos" / "me__calc-1").mkdir(parents=True)
    (tmp_path / "repos" / "me__calc-1" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    gold = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
    row = {
        "instance_id": "me__calc-1",
        "repo": "me/calc",
        "version": "0.1",
        "problem_statement": "add() subtracts",
        "patch": gold,
        "test_patch": "diff --git a/test_calc.py b/test_calc.py\nnew file mode 100644\n--- /dev/null\n"
        "+++ b/test_calc.py\n@@ -0,0 +1,5 @@\n+from calc import add\n+\n+\n+def test_add():\n"
        "+    assert add(2, 2) == 4\n",
        "FAIL_TO_PASS": '["test_calc.py::test_add"]',
        "PASS_TO_PASS": "[]",
    }
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    hashed = int(hashlib.md5(b"me__calc-1").hexdigest(), 16) % 2**63
    args = ("--instances", str(tmp_path / "rows.jsonl"), "--state-dir", str(tmp_path / "state"))

    proc, url, banner = _serve(*args)
    assert f"swedev: {len(SHIPPED) + 1} instance(s), state in {tmp_path / 'state'}" in banner
    try:
        sid = http.post(f"{url}/start_instance", json={"instance_hash": hashed}).json()["sid"]
        applied = http.post(f"{url}/process_action", json={"sid": sid, "content": diff_block(gold)}).json()
        assert "Applied patch calc.py cleanly" in applied["content"]
    finally:
        _stop(proc)

    proc, url, _ = _serve(*args)
    try:
        command = function_call("execute_bash", command="cat /workspace/me__calc__0.1/calc.py")
        seen = http.post(f"{url}/process_action", json={"sid": int(sid), "content": command}).json()[
            "content"
        ]
        assert "return a + b" in seen  # the live session went on where it was
        assert http.post(f"{url}/postprocess", json={"sid": sid}).json()["reward"] == 1.0
    finally:
        _stop(proc)
    proc, url, _ = _serve(*args)
    try:
        reward = http.post(f"{url}/compute_reward", json={"sid": int(sid)}).json()
        assert reward["resolved"] is True and reward["f2p_count"] == reward["f2p_total"] == 1
    finally:
        _stop(proc)
