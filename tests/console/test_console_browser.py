"""The web console in a real Chromium against a live server: the playground runs code, the fault
form adds a rule that the next request meets (and the journal shows it), the in-flight chart rises
under a burst (one process and two workers), and a finished swedev session shows its diff.

Everything the page shows arrives through it (the live feed, the /_mock/ API): these tests fail
when its live updates or its forms break. They wait for conditions, never for fixed times.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from mocksandbox.sessions import InstanceRegistry
from mocksandbox.sessions.scripted import diff_block

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("page_errors")]

NO_PROXY = {"http": "", "https": ""}
Wait = Callable[..., Any]


def by_id(driver: Any, element_id: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def text_of(driver: Any, element_id: str) -> str:
    return str(by_id(driver, element_id).get_attribute("textContent"))


def open_console(chromium: Any, wait_for: Wait, url: str, tab: str) -> None:
    """Load the console on ``tab`` and wait until its live feed delivered a first update."""
    chromium.get(f"{url}/_mock/ui#{tab}")
    wait_for(lambda d: text_of(d, "connection") == "live", "the live feed did not connect")
    wait_for(
        lambda d: by_id(d, "inflight-chart").get_attribute("data-points") not in (None, "0"),
        "no update arrived on the live feed",
    )


def click_first(
    wait_for: Wait, selector: str, message: str, describe: Callable[[Any], Any] = lambda e: e.text
) -> Any:
    """Click the first element matching ``selector`` once there is one; ``describe(element)``, read
    just before the click. Found, read and clicked in one attempt, retried whole when the live feed
    re-renders the element meanwhile (a stale element): a test must not depend on that timing."""

    def attempt(driver: Any) -> Any:
        element = next(iter(css(driver, selector)), None)
        if element is None:
            return None
        described = describe(element)
        element.click()
        return (described,)

    return wait_for(attempt, message)[0]


def type_into(element: Any, text: str) -> None:
    element.clear()
    element.send_keys(text)


def test_playground_runs_code_with_stdin_and_files(
    chromium: Any, wait_for: Wait, mocksandbox: Any, screenshot: Callable[[str], Any]
) -> None:
    open_console(chromium, wait_for, mocksandbox.url, "playground")
    wait_for(
        lambda d: css(d, "#run-language option[value=python][data-available=true]"),
        "the languages did not load, or python is not marked as having its toolchain",
    )
    by_id(chromium, "run-code").clear()
    # send_keys types into an editor-less textarea: no auto-indent to fight.
    by_id(chromium, "run-code").send_keys("n = int(input())\nprint(n * 2, open('data.txt').read().strip())\n")
    type_into(by_id(chromium, "run-stdin"), "21")
    by_id(chromium, "run-add-file").click()
    type_into(css(chromium, "#run-files .file-name")[0], "data.txt")
    type_into(css(chromium, "#run-files .file-content")[0], "héllo")
    by_id(chromium, "run-button").click()

    wait_for(lambda d: text_of(d, "result-stdout") == "42 héllo\n", "the run's stdout was not shown")
    assert text_of(chromium, "result-status") == "Success"
    assert text_of(chromium, "result-http") == "200"
    assert text_of(chromium, "result-rc") == "0"
    assert '"status": "Success"' in text_of(chromium, "result-json")
    (entry,) = mocksandbox.requests(path="/run_code")
    assert entry.body["stdin"] == "21" and set(entry.body["files"]) == {"data.txt"}
    screenshot("console-playground")


def test_fault_form_adds_a_rule_the_next_request_meets(
    chromium: Any, wait_for: Wait, mocksandbox: Any, screenshot: Callable[[str], Any]
) -> None:
    from selenium.webdriver.support.ui import Select

    open_console(chromium, wait_for, mocksandbox.url, "faults")
    wait_for(lambda d: css(d, "#fault-action input[name='action.status']"), "the fault form was not built")

    # A wrong rule: the server's validation error is shown, and nothing is added.
    Select(by_id(chromium, "fault-action-type")).select_by_value("status")
    type_into(css(chromium, "input[name='match.path']")[0], "/run_code")
    type_into(css(chromium, "input[name='action.status']")[0], "42")
    by_id(chromium, "fault-add").click()
    wait_for(lambda d: by_id(d, "fault-error").is_displayed(), "no error shown for status 42")
    error = text_of(chromium, "fault-error")
    assert "status" in error and "100" in error, error
    assert mocksandbox.sandbox.fault_rules() == []

    # Corrected: added, listed, and the next /run_code meets it.
    type_into(css(chromium, "input[name='action.status']")[0], "503")
    type_into(css(chromium, "input[name='schedule.times']")[0], "1")
    type_into(by_id(chromium, "fault-name"), "console-503")
    by_id(chromium, "fault-add").click()
    wait_for(lambda d: css(d, "#faults-table tbody tr"), "the added rule is not listed")
    assert not by_id(chromium, "fault-error").is_displayed()
    (rule,) = mocksandbox.sandbox.fault_rules()
    assert rule.spec.name == "console-503" and rule.spec.schedule.times == 1

    reply = requests.post(
        f"{mocksandbox.url}/run_code",
        json={"code": "print(1)", "language": "python"},
        timeout=30,
        proxies=NO_PROXY,
    )
    assert reply.status_code == 503
    wait_for(
        lambda d: css(d, f"#faults-table tr[data-id='{rule.id}'] td.fired")[0].text == "1",
        "the rule's fired count did not reach 1",
    )
    screenshot("console-faults")

    # The cap from its form: set, shown, cleared; a wrong one shows the server's error.
    type_into(by_id(chromium, "cap-max"), "3")
    by_id(chromium, "cap-set").click()
    wait_for(lambda d: by_id(d, "cap-state").get_attribute("data-max") == "3", "the cap was not set")
    assert mocksandbox.sandbox.capacity.max_in_flight == 3
    type_into(by_id(chromium, "cap-max"), "0")
    by_id(chromium, "cap-set").click()
    wait_for(lambda d: by_id(d, "cap-error").is_displayed(), "no error shown for max_in_flight 0")
    assert "max_in_flight" in text_of(chromium, "cap-error")
    by_id(chromium, "cap-clear").click()
    wait_for(lambda d: by_id(d, "cap-state").get_attribute("data-max") == "null", "the cap was not cleared")
    assert mocksandbox.sandbox.capacity.max_in_flight is None
    assert not by_id(chromium, "cap-error").is_displayed()

    # The journal shows the faulted request (it arrived through the live feed) and its detail.
    chromium.get(f"{mocksandbox.url}/_mock/ui#journal")
    fault_cell, row_text = click_first(
        wait_for,
        "#journal-table tbody tr[data-status='503']",
        "the faulted request is not in the journal",
        lambda row: (row.find_elements("css selector", "td.fault")[0].text, row.text),
    )
    assert "status" in fault_cell
    assert rule.id in row_text
    wait_for(lambda d: '"language": "python"' in text_of(d, "entry-request"), "no request body shown")
    assert '"detail": "Service Unavailable"' in text_of(chromium, "entry-response")
    by_id(chromium, "copy-python").click()
    wait_for(lambda d: by_id(d, "snippet").is_displayed(), "no Python snippet shown")
    snippet = text_of(chromium, "snippet")
    by_id(chromium, "copy-curl").click()
    wait_for(lambda d: text_of(d, "snippet").startswith("curl"), "no curl snippet shown")
    curl = text_of(chromium, "snippet")
    assert curl.startswith("curl -X POST ") and "/run_code" in curl and "--data-raw" in curl
    screenshot("console-journal")

    # The copied request is the request: run as it is, it reaches the server again (the rule fired
    # its one time, so this one is answered).
    environment = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    ran = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, timeout=60, env=environment
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("200 ") and '"stdout":"1\\n"' in ran.stdout

    # Removed from its row's button.
    chromium.get(f"{mocksandbox.url}/_mock/ui#faults")
    click_first(wait_for, f"#faults-table tr[data-id='{rule.id}'] button.remove", "the rule is not listed")
    wait_for(lambda d: not css(d, "#faults-table tbody tr"), "the removed rule is still listed")
    assert mocksandbox.sandbox.fault_rules() == []


@pytest.mark.parametrize(
    "workers",
    [1, pytest.param(2, marks=pytest.mark.mocksandbox_workers(2))],
    ids=["one-process", "two-workers"],
)
def test_in_flight_chart_rises_under_a_burst(
    chromium: Any,
    wait_for: Wait,
    mocksandbox: Any,
    screenshot: Callable[[str], Any],
    visible_tmp_path: Path,
    workers: int,
) -> None:
    burst, cap = 6, 4
    mocksandbox.set_capacity(max_in_flight=cap)
    open_console(chromium, wait_for, mocksandbox.url, "live")
    wait_for(lambda d: text_of(d, "cap") == f"cap {cap}", "the cap is not shown")
    assert by_id(chromium, "inflight-chart").get_attribute("data-max") == "0"

    # Each program holds its slot until the test creates the release file: the chart must show
    # them held, however slow the machine, and the test ends them when it is done looking.
    release = visible_tmp_path / "release"
    # (Its dir is listed, not the file looked up: in a run's world the host is an overlayfs lower
    # layer, which keeps a lookup's negative answer; a dir only the host holds lists afresh.)
    program = (
        f"import os, time\nwhile {release.name!r} not in os.listdir({str(release.parent)!r}):\n"
        "    time.sleep(0.02)\nprint('released')"
    )
    statuses: list[int] = []

    def send() -> None:
        reply = requests.post(
            f"{mocksandbox.url}/run_code",
            json={"code": program, "language": "python", "run_timeout": 60},
            timeout=90,
            proxies=NO_PROXY,
        )
        statuses.append(reply.status_code)

    threads = [threading.Thread(target=send) for _ in range(burst)]
    for thread in threads:
        thread.start()
    try:
        wait_for(
            lambda d: by_id(d, "inflight-chart").get_attribute("data-max") == str(cap),
            f"the in-flight chart did not rise to the cap ({cap})",
        )
        wait_for(lambda d: text_of(d, "in-flight") == str(cap), "the in-flight tile does not show the cap")
        wait_for(lambda d: text_of(d, "rejected") == str(burst - cap), "the 429s are not counted")
        assert text_of(chromium, "rejected-cap") == str(burst - cap)
        if workers == 1:
            screenshot("console-live")
    finally:
        release.touch()
        for thread in threads:
            thread.join(timeout=90)
    assert sorted(statuses) == [200] * cap + [429] * (burst - cap)
    wait_for(lambda d: text_of(d, "in-flight") == "0", "the in-flight tile did not fall back to 0")
    wait_for(lambda d: text_of(d, "total") == str(burst), "the request count is not the burst's")


def test_finished_session_shows_its_diff_and_reward(
    chromium: Any, wait_for: Wait, mocksandbox: Any, screenshot: Callable[[str], Any]
) -> None:
    instance = next(
        i for i in InstanceRegistry.from_paths([]).all() if i.instance_id == "sciutils__unitconv-311"
    )
    http = requests.Session()
    http.trust_env = False
    base = mocksandbox.url
    sid = http.post(f"{base}/start_instance", json={"instance_id": instance.instance_id}, timeout=60).json()[
        "sid"
    ]
    observation = http.post(
        f"{base}/process_action", json={"sid": sid, "content": diff_block(instance.patch)}, timeout=60
    ).json()["content"]
    done = http.post(f"{base}/postprocess", json={"sid": sid}, timeout=300).json()
    assert done["state"] == "finished"

    open_console(chromium, wait_for, base, "sessions")
    row_text = click_first(wait_for, f"#sessions-table tr[data-sid='{sid}']", "no session row")
    assert "finished" in row_text and instance.instance_id in row_text
    first_added = next(
        line for line in instance.patch.splitlines() if line.startswith("+") and not line.startswith("+++")
    )
    wait_for(lambda d: first_added in text_of(d, "session-diff"), "the session's diff is not shown")
    assert css(chromium, "#session-diff span.add")
    assert done["reward"] == 1.0  # the gold patch
    f2p, p2p = len(instance.fail_to_pass), len(instance.pass_to_pass)
    wait_for(lambda d: text_of(d, "reward-f2p") == f"{f2p}/{f2p} pass", "the F2P count is not shown")
    assert text_of(chromium, "reward-p2p") == f"{p2p}/{p2p} pass"
    wait_for(
        lambda d: observation.splitlines()[0] in text_of(d, "session-observations"),
        "the session's observation is not shown",
    )
    screenshot("console-sessions")


def test_the_journal_shows_where_sandboxfusion_would_have_answered_differently(
    chromium: Any, wait_for: Wait, mocksandbox: Any, screenshot: Callable[[str], Any]
) -> None:
    open_console(chromium, wait_for, mocksandbox.url, "journal")
    flood = {"code": "for i in range(100000): print(i)", "language": "python"}
    quiet = {"code": "print(1)", "language": "python"}
    for body in (flood, quiet):
        answer = requests.post(f"{mocksandbox.url}/run_code", json=body, timeout=60, proxies=NO_PROXY)
        assert answer.json()["status"] == "Success"
    wait_for(lambda d: text_of(d, "divergences") == "1", "the tile does not count the divergence")
    cell = wait_for(
        lambda d: next(iter(css(d, "#journal-table td.diverged")), None), "no row says it differs"
    )
    assert cell.text == "differs: output"
    assert "SandboxFusion stops reading a stream past 128 KiB" in str(cell.get_attribute("title"))
    by_id(chromium, "filter-diverged").click()
    wait_for(lambda d: len(css(d, "#journal-table tbody tr")) == 1, "the filter keeps the quiet request")
    click_first(wait_for, "#journal-table tbody tr", "the row could not be opened")
    wait_for(lambda d: "stdout of 588890 bytes" in text_of(d, "entry-meta"), "the entry does not say why")
    screenshot("console-divergence")
    by_id(chromium, "filter-diverged").click()
