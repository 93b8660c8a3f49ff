"""Headless Chromium for tests of attnviz's HTML pages (Playwright driving the system's chromium).

Without a browser the tests skip, except under ``CI=true``, where a missing browser fails the run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")


def chromium_path() -> str | None:
    for candidate in (os.environ.get("ATTNVIZ_CHROMIUM"), *CHROMIUM_CANDIDATES, shutil.which("chromium")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def missing_browser(reason: str):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: browser tests must run)")
    pytest.skip(reason)


class PageRun:
    """One page opened in the browser, with every request and console error it caused."""

    def __init__(self, browser, path: Path, viewport=(1400, 900)):
        self.path = path.resolve()
        self.page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.on("console", lambda message: self.errors.append(message.text) if message.type == "error" else None)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.goto(self.path.as_uri())
        self.page.wait_for_load_state("load")

    def assert_clean(self) -> None:
        """No script error, and no request for anything but the page file itself."""
        assert self.errors == []
        assert self.requests == [self.path.as_uri()], self.requests

    def close(self) -> None:
        self.page.close()


@pytest.fixture(scope="session")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing_browser("playwright is not installed (pip install -e '.[test]')")
    executable = chromium_path()
    if executable is None:
        missing_browser("chromium is not installed (apt-get install chromium)")
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield instance
        instance.close()


@pytest.fixture
def open_page(browser):
    runs: list[PageRun] = []

    def opener(path: Path, viewport=(1400, 900)) -> PageRun:
        run = PageRun(browser, path, viewport)
        runs.append(run)
        return run

    yield opener
    for run in runs:
        run.close()
