"""A real Chromium for the console's browser tests: Debian's ``chromium`` driven through its
``chromedriver`` by Selenium (nothing is downloaded at run time).

``make test`` installs both when they are missing; without them the browser tests are skipped with
the command that installs them, except where every part is required (``CI``, or
``MOCKSANDBOX_REQUIRE_ALL=1`` as ``.ci/run`` sets: ``require_or_skip`` in ``tests/conftest.py``):
there they fail.

Screenshots the tests take go to the test's temporary directory, or to ``MOCKSANDBOX_SCREENSHOTS``
when it names a directory (``MOCKSANDBOX_SCREENSHOTS=docs`` refreshes the README's pictures).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

INSTALL_HINT = "apt-get install -y chromium chromium-driver (make test does it when it may)"
#: Seconds a browser test waits for a condition before it fails (never a fixed sleep).
WAIT_S = 20.0


def browser_paths() -> tuple[str, str] | None:
    """Debian's chromium and its chromedriver, if both are installed."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or (
        "/usr/bin/chromedriver" if os.access("/usr/bin/chromedriver", os.X_OK) else None
    )
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="session")
def chromium(
    tmp_path_factory: pytest.TempPathFactory, require_or_skip: Callable[[str | None], None]
) -> Iterator[Any]:
    """One headless Chromium for the session (a Selenium ``WebDriver``)."""
    paths = browser_paths()
    require_or_skip(None if paths else f"no chromium + chromedriver on this machine: {INSTALL_HINT}")
    assert paths is not None  # (require_or_skip skipped or failed otherwise)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:  # pragma: no cover - the dev extra has it
        require_or_skip("selenium is not installed: pip install -e '.[dev]'")
        raise
    browser, driver_path = paths
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (
        "--headless",
        "--no-sandbox",  # as root
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--no-proxy-server",  # loopback only, whatever the environment says
        "--window-size=1360,900",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(flag)
    # The page's console messages, so that a test can fail on a script error or a CSP refusal.
    # ... and its network events ("performance"), so that a test can list every request a page made.
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    # Both paths given: Selenium Manager (which could download a driver) is never consulted.
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page_errors(chromium: Any) -> Iterator[None]:
    """Fail the test if the page threw or the browser refused something under the CSP."""
    chromium.get_log("browser")  # what earlier tests left
    yield
    errors = [
        entry["message"]
        for entry in chromium.get_log("browser")
        # "security": a Content-Security-Policy violation; "javascript": an uncaught exception.
        if entry["level"] == "SEVERE" and entry.get("source") in ("security", "javascript")
    ]
    assert errors == [], errors


@pytest.fixture
def wait_for(chromium: Any) -> Callable[..., Any]:
    """``wait_for(condition, message)``: poll ``condition(driver)`` until it is truthy (its value
    is returned) or fail after :data:`WAIT_S` seconds with ``message``."""
    from selenium.webdriver.support.ui import WebDriverWait

    def wait(condition: Callable[[Any], Any], message: str, timeout: float = WAIT_S) -> Any:
        return WebDriverWait(chromium, timeout, poll_frequency=0.05).until(
            lambda driver: _quietly(condition, driver), message
        )

    return wait


def _quietly(condition: Callable[[Any], Any], driver: Any) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        return condition(driver)
    except StaleElementReferenceException:  # the page re-rendered the element meanwhile
        return False


@pytest.fixture
def screenshot(chromium: Any, tmp_path: Path) -> Callable[[str], Path]:
    """``screenshot(name)``: the page as a PNG, kept where ``MOCKSANDBOX_SCREENSHOTS`` says."""

    def take(name: str) -> Path:
        directory = Path(os.environ.get("MOCKSANDBOX_SCREENSHOTS") or tmp_path)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.png"
        assert chromium.save_screenshot(str(path)), f"no screenshot taken for {name}"
        return path

    return take
