"""What the console's browser tests share: secured brokers with the management listener, their
users, sending, logging in through the login page, screenshots for docs/console.md."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from playwright.sync_api import Page, expect

from broker_process import BrokerProcess
from mgmt_http import Api, management_toml
from secured import password_of, secured, url_for
from tandem.client.blocking import connect

IMAGES = Path(__file__).parents[2] / "docs" / "images"
SCREENSHOTS = os.environ.get("TANDEM_SCREENSHOTS") == "1"

Factory = Callable[..., BrokerProcess]
USERS = {"admin": ["admin"], "viewer": ["viewer"], "app": ["app"]}
SETTINGS = (
    '[security-settings."#"]\n'
    'manage = ["admin"]\nview = ["viewer"]\n'
    'send = ["app", "admin"]\nconsume = ["app", "admin"]\ncreate-address = ["app", "admin"]\n'
    'create-durable-queue = ["app", "admin"]\n'
)


def secured_broker(broker_factory: Factory, tmp_path: Path) -> BrokerProcess:
    return broker_factory(**secured(tmp_path, USERS, SETTINGS + management_toml())).start()  # type: ignore[no-any-return]


def console_url(b: BrokerProcess, route: str = "") -> str:
    return f"http://127.0.0.1:{b.ports['management']}/{route}"


def send(b: BrokerProcess, queue: str, n: int, start: int = 0, **properties: object) -> None:
    """`n` durable messages `order START`... to `queue`, each confirmed before this returns."""
    with connect(url_for(b.url, "app")) as conn:
        p = conn.session().create_producer(queue)
        for i in range(start, start + n):
            p.send(f"order {i}".encode(), properties={"n": i, **properties})


def log_in(page: Page, b: BrokerProcess, user: str = "admin") -> None:
    page.goto(console_url(b))
    expect(page.get_by_role("heading", name="Log in to Tandem")).to_be_visible()
    page.get_by_label("User").fill(user)
    page.get_by_label("Password").fill(password_of(user))
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    expect(page.locator("#who")).to_contain_text(user)


def off_the_loop(fn: Callable[[], object], timeout: float = 90.0) -> object:
    """Run `fn` in another thread: Playwright's sync API keeps an asyncio loop running in this
    one, and the pair's helpers start their own (asyncio.run)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result(timeout)


def admin_api(b: BrokerProcess) -> Api:
    return Api.of(b, basic=("admin", password_of("admin")))


def screenshot(page: Page, name: str) -> None:
    """docs/images/console-NAME.png, when TANDEM_SCREENSHOTS=1 (a run in CI leaves the docs alone)."""
    if SCREENSHOTS:
        IMAGES.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(IMAGES / f"console-{name}.png"))
