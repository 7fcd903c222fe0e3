"""``mocksandbox serve --workers 2``: two processes answer from one address over one control state.

Each guarantee of the control API is checked against a real two-worker server with concurrent
clients (new connections each, so that the kernel spreads them over both workers): the journal in
arrival order, the cap exact, fault schedules counted across workers, reset for all, swedev sessions
from any worker; and a killed worker is replaced while the other keeps answering.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psutil
import pytest
import requests
from serve_process import NO_PROXY, start_serve, stop_serve

from mocksandbox.extras import jupyter_missing
from mocksandbox.sessions import InstanceRegistry
from mocksandbox.sessions.scripted import diff_block
from mocksandbox.settings import load_settings

pytestmark = pytest.mark.slow


@dataclass
class Served:
    url: str
    process: subprocess.Popen[str]
    banner: str

    def post(self, path: str, body: object, timeout: float = 120) -> requests.Response:
        # A new connection per request: the workers share the listening socket, not connections.
        return requests.post(self.url + path, json=body, timeout=timeout, proxies=NO_PROXY)

    def get(self, path: str) -> requests.Response:
        return requests.get(self.url + path, timeout=30, proxies=NO_PROXY)

    def run(self, code: str, **fields: object) -> requests.Response:
        return self.post("/run_code", {"code": code, "language": "python", **fields})

    def workers(self) -> list[psutil.Process]:
        found = []
        for child in psutil.Process(self.process.pid).children():
            try:
                if "mocksandbox.serving.workers" in " ".join(child.cmdline()):
                    found.append(child)
            except psutil.Error:  # a killed worker not reaped yet: not one of the workers
                continue
        return found


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    started = start_serve("--workers", "2")
    assert " with 2 workers" in started.banner[0], started.banner[0]
    try:
        yield Served(started.url, started.process, "".join(started.banner))
    finally:
        stop_serve(started.process)


@pytest.fixture(autouse=True)
def _reset(served: Served) -> None:
    served.post("/_mock/reset", {}).raise_for_status()


@pytest.fixture
def with_jupyter(require_or_skip: Callable[[str | None], None]) -> None:
    """The tests that send ``/run_jupyter`` need the jupyter extra in the server's interpreter."""
    require_or_skip(jupyter_missing(load_settings(overrides={"port": 0}).python))


def test_banner_and_both_workers_alive(served: Served) -> None:
    assert "workers: 2, one control state" in served.banner
    assert "process budget:" in served.banner and "confinement:" in served.banner
    assert len(served.workers()) == 2


def test_one_journal_in_arrival_order(served: Served) -> None:
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda i: served.run(f"print({i})").json(), range(120)))
    assert [a["run_result"]["stdout"] for a in answers] == [f"{i}\n" for i in range(120)]
    entries = served.get("/_mock/journal").json()["entries"]
    assert [e["id"] for e in entries] == list(range(1, 121))
    assert all(e["worker"] in ("worker-1", "worker-2") for e in entries)
    starts = [e["started"] for e in entries]
    assert starts == sorted(starts)
    stats = served.get("/_mock/stats").json()
    assert stats["requests_total"] == 120 and stats["by_status"] == {"200": 120} and stats["in_flight"] == 0


def test_workers_take_connections_in_turn(served: Served) -> None:
    """Each worker waits in a blocking accept; the kernel wakes one per connection, the one that
    waited longest: one client's requests, one after the other, go to the workers in turn. (With
    both polling the socket, both woke for each connection and whichever ran first took it: as
    many switches as coin flips, about half.)"""
    for i in range(20):
        assert served.run(f"print({i})").status_code == 200
    served_by = [e["worker"] for e in served.get("/_mock/journal").json()["entries"]]
    switches = sum(a != b for a, b in itertools.pairwise(served_by))
    assert switches >= 14, served_by


def test_the_cap_holds_across_workers(served: Served) -> None:
    served.post("/_mock/reset", {})
    assert requests.put(served.url + "/_mock/capacity", json={"max_in_flight": 3}, proxies=NO_PROXY).ok
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(lambda _: served.run("import time; time.sleep(1)"), range(12)))
    statuses = [r.status_code for r in replies]
    stats = served.get("/_mock/stats").json()
    assert stats["max_in_flight"] <= 3
    assert statuses.count(429) == stats["rejected_by_cap"] == stats["by_status"].get("429", 0)
    assert statuses.count(200) + statuses.count(429) == 12 and statuses.count(200) >= 3
    points = served.get("/_mock/timeline").json()["points"]
    assert max(count for _, count in points) <= 3


def test_fault_schedules_count_across_workers(served: Served) -> None:
    rules = [
        {"name": "first-two", "match": {"path": "/run_code"}, "action": {"type": "status", "status": 503},
         "schedule": {"first": 2}},
        {"name": "every-fifth", "match": {"path": "/run_code"}, "action": {"type": "status", "status": 502},
         "schedule": {"every": 5}},
    ]  # fmt: skip
    assert served.post("/_mock/faults", rules).status_code == 201
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda i: served.run(f"print({i})").status_code, range(42)))
    assert statuses.count(503) == 2
    assert statuses.count(502) == 40 // 5  # every-fifth sees the 40 that first-two let through
    fired = {rule["id"]: rule["fired"] for rule in served.get("/_mock/faults").json()["faults"]}
    assert fired == {"first-two": 2, "every-fifth": 8}


def test_reset_is_for_all_workers(served: Served) -> None:
    served.post("/_mock/faults", {"action": {"type": "status", "status": 500}})
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: served.run("print(1)"), range(16)))
    served.post("/_mock/reset", {})
    assert served.get("/_mock/faults").json()["faults"] == []
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _: served.run("print(1)").status_code, range(16)))
    assert statuses == [200] * 16
    assert served.get("/_mock/stats").json()["requests_total"] == 16


def test_over_cap_requests_queue_across_workers(served: Served) -> None:
    """``overload: queue`` closes the workers' fast path: every admission waits in the master for
    a slot that a request on either worker leaves."""
    body = {"max_in_flight": 2, "overload": "queue", "queue_timeout_s": 60}
    assert requests.put(served.url + "/_mock/capacity", json=body, proxies=NO_PROXY).ok
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _: served.run("import time; time.sleep(0.3)").status_code, range(8)))
    assert statuses == [200] * 8
    stats = served.get("/_mock/stats").json()
    assert stats["max_in_flight"] == 2 and stats["in_flight"] == 0 and stats["rejected_by_cap"] == 0


@pytest.mark.usefixtures("with_jupyter")
def test_workers_keep_to_their_cores_and_user_code_gets_them_all(served: Served) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one usable core: nothing to share")
    shares = [sorted(worker.cpu_affinity()) for worker in served.workers()]
    assert sorted(cpu for share in shares for cpu in share) == cpus, shares  # disjoint, all covered
    assert all(len(share) < len(cpus) for share in shares)
    assert "cores: worker-1 on " in served.banner
    probe = "import os; print(sorted(os.sched_getaffinity(0)))"
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # (the kernel picks the workers)
        answers = list(pool.map(lambda _: served.run(probe).json(), range(8)))
    assert {a["run_result"]["stdout"] for a in answers} == {f"{cpus}\n"}
    cell = served.post("/run_jupyter", {"cells": [probe]}).json()
    assert cell["cells"][0]["stdout"] == f"{cpus}\n", cell


def _kernel_processes(worker: psutil.Process) -> list[psutil.Process]:
    """The kernel fork server below ``worker`` and the kernels it forked (same command line);
    processes that exit while they are looked at (a run's program, a kernel shut down) are not."""
    found = []
    for process in worker.children(recursive=True):
        try:
            if "_zygote.py" in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            continue
    return found


@pytest.mark.usefixtures("with_jupyter")
def test_a_killed_worker_takes_its_jupyter_kernels_with_it(served: Served) -> None:
    """A worker that dies without closing anything (SIGKILL) leaves no kernel behind: its kernel
    fork server sees its input close and kills every kernel's process group. Nor, once it is
    replaced, its kernels' runtime dir (the worker that replaces it reclaims it)."""
    assert served.post("/run_jupyter", {"cells": ["6 * 7"]}).ok
    holder, helpers = None, []
    for worker in served.workers():
        helpers = _kernel_processes(worker)
        if helpers:
            holder = worker
            break
    assert holder is not None, "no worker holds a kernel fork server"
    deadline = time.monotonic() + 30
    while len(helpers) < 2 and time.monotonic() < deadline:  # the fork server and a warm kernel
        time.sleep(0.1)
        helpers = _kernel_processes(holder)
    assert len(helpers) >= 2, helpers
    # The fork server's command line names the runtime dir (its marker).
    runtime_dirs = {
        arg for arg in helpers[0].cmdline() if os.path.basename(arg).startswith("mocksandbox-jupyter-")
    }
    assert len(runtime_dirs) == 1 and all(os.path.isdir(d) for d in runtime_dirs), helpers[0].cmdline()
    holder.kill()
    _, alive = psutil.wait_procs(helpers, timeout=30)
    assert alive == [], [p.pid for p in alive]
    # The pool replaces the worker; waited for here, so that its journal event lands in this test.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        events = [e for e in served.get("/_mock/journal").json()["entries"] if e["method"] == "EVENT"]
        if any(f"(pid {holder.pid}) died" in e["body"] for e in events) and len(served.workers()) == 2:
            break
        time.sleep(0.2)
    assert len(served.workers()) == 2
    assert not any(os.path.exists(d) for d in runtime_dirs), runtime_dirs


def test_swedev_sessions_from_any_worker(served: Served) -> None:
    """Several sessions at once, each action on a new connection (so either worker may serve it)."""
    instance = next(i for i in InstanceRegistry.from_paths([]).all() if i.instance_id == "acme__pagekit-17")
    gold = instance.patch

    def episode(_: int) -> dict[str, object]:
        sid = served.post("/start_instance", {"instance_id": instance.instance_id}).json()["sid"]
        for command in ("pwd", "git status --short", "ls"):
            call = f"<function=execute_bash>\n<parameter=command>{command}</parameter>\n</function>"
            assert served.post("/process_action", {"sid": sid, "content": call}).ok
        assert served.post("/process_action", {"sid": sid, "content": diff_block(gold)}).ok
        reward: dict[str, object] = served.post("/compute_reward", {"sid": sid}).json()
        return reward

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        rewards = list(pool.map(episode, range(4)))
    assert [r["reward"] for r in rewards] == [1.0] * 4
    workers = {e["worker"] for e in served.get("/_mock/journal").json()["entries"]}
    assert workers <= {"worker-1", "worker-2"}


def test_a_killed_worker_is_replaced_and_the_other_keeps_answering(served: Served) -> None:
    victim = served.workers()[0]
    victim.kill()
    victim.wait(10)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: served.run(f"print({i})"), range(24)))
    assert [a.status_code for a in answers] == [200] * 24
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        events = [e for e in served.get("/_mock/journal").json()["entries"] if e["method"] == "EVENT"]
        if events and len(served.workers()) == 2:
            break
        time.sleep(0.2)
    assert f"(pid {victim.pid}) died (killed by signal 9); replaced by pid" in events[0]["body"]
    assert len(served.workers()) == 2
    assert served.run("print(6*7)").json()["run_result"]["stdout"] == "42\n"
