"""The documentation site in a real Chromium: built as `make docs` builds it, served on loopback,
its home page and a search result open, and no request leaves the site (no web font, no CDN)."""

from __future__ import annotations

import functools
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

pytestmark = [pytest.mark.browser]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The site, built strict into a temporary dir and served on a free loopback port; its URL."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"},
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    handler = functools.partial(_QuietHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def _requested(chromium: Any) -> list[str]:
    """Every URL the browser asked for since the last call (from its performance log)."""
    urls = []
    for entry in chromium.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def _outside(urls: list[str], site: str) -> list[str]:
    origin = urlparse(site).netloc
    return [u for u in urls if urlparse(u).scheme not in ("data", "blob") and urlparse(u).netloc != origin]


def test_the_home_page_and_a_search_result_load_nothing_from_outside(
    chromium: Any,
    site: str,
    wait_for: Callable[..., Any],
    page_errors: None,
    screenshot: Callable[[str], Path],
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    _requested(chromium)  # what earlier tests left
    chromium.get(site + "/index.html")
    wait_for(lambda d: d.find_element(By.CSS_SELECTOR, "article h1").text, "the home page's heading")
    assert "mocksandbox" in chromium.title
    nav = chromium.find_element(By.CSS_SELECTOR, "nav.md-nav").get_attribute("textContent")
    for section in ("Get started", "Use it in tests", "Serve it", "For verl users", "Reference"):
        assert section in nav, section
    screenshot("docs-home")

    # Search runs in the page (a web worker over the site's own index): no server behind it.
    box = wait_for(lambda d: d.find_element(By.CSS_SELECTOR, "input.md-search__input"), "the search box")
    box.click()  # (at this width the box is in the header)
    box.send_keys("max_in_flight")
    wait_for(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".md-search-result__item a"),
        "search results for max_in_flight",
    )
    screenshot("docs-search")

    def open_the_first_result(driver: Any) -> str:
        # Found again each try: the list is rendered anew while the search settles, which leaves
        # an element found before it stale (wait_for tries again then).
        link = driver.find_element(By.CSS_SELECTOR, ".md-search-result__item a")
        href = link.get_attribute("href")
        link.send_keys(Keys.ENTER)
        return str(href)

    target = wait_for(open_the_first_result, "the first search result, opened")
    assert target.startswith(site), target
    wait_for(lambda d: d.current_url.split("#")[0] == target.split("#")[0], f"the result's page {target}")
    wait_for(
        lambda d: "max_in_flight" in d.find_element(By.CSS_SELECTOR, "article").text, "the term on the page"
    )

    # The generated settings reference is there and names every setting's variable.
    chromium.get(site + "/reference/settings.html")
    text = wait_for(lambda d: d.find_element(By.CSS_SELECTOR, "article").text, "the settings page")
    assert "MOCKSANDBOX_ISOLATION" in text and "--isolation" in text

    urls = _requested(chromium)
    assert urls, "the performance log recorded no request at all"
    assert _outside(urls, site) == [], _outside(urls, site)
