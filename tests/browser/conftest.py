"""The web console in a real browser: Playwright for Python driving Debian's `chromium`
(scripts/ensure-chromium.sh installs it) through `executable_path`, against real brokers.

Every test here runs on one pytest-xdist worker (GROUPS in tests/conftest.py): one Chromium for
them all, as tests/spark shares one JVM. TANDEM_SCREENSHOTS=1 also writes the screenshots of
docs/console.md into docs/images/ (console_pages.screenshot; off by default, so a test run does
not rewrite the docs).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

HERE = Path(__file__).parent
WAIT_MS = 20_000  # the longest any one expectation waits (the console polls every 2 s)

expect.set_options(timeout=WAIT_MS)


def chromium_path() -> str:
    found = os.environ.get("TANDEM_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    assert Path(found).exists(), f"no Chromium at {found}: run scripts/ensure-chromium.sh (or set TANDEM_CHROMIUM)"
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Per module, not per session: Playwright's sync API keeps an event loop running in this
    thread while it is open, and the other tests an xdist worker runs next call asyncio.run()."""
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@contextlib.contextmanager
def _fresh_page(browser: Browser) -> Iterator[Page]:
    """A page in its own browser context (its own cookies); a JavaScript error in it fails the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield page
    finally:
        context.close()
    assert not errors, f"JavaScript errors in the console: {errors}"


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    with _fresh_page(browser) as p:
        yield p


@pytest.fixture
def other_page(browser: Browser) -> Iterator[Page]:
    """A second user at another browser: its own cookies."""
    with _fresh_page(browser) as p:
        yield p
