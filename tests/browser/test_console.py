"""The web console (docs/console.md) in headless Chromium against real broker processes with
security on: log in, watch a queue's depth follow the sends, browse, purge, close a connection,
and watch the HA state of a shared-store pair flip when its primary is killed."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
from console_pages import (
    SCREENSHOTS,
    SETTINGS,
    USERS,
    Factory,
    admin_api,
    console_url,
    log_in,
    off_the_loop,
    screenshot,
    secured_broker,
    send,
)
from playwright.sync_api import Page, expect

from broker_process import BrokerProcess
from ha_pair import Cluster
from mgmt_http import management_toml
from replicated_pair import ReplicatedPair
from secured import password_of, secured, url_for
from tandem.client.blocking import connect
from tandem.errors import TandemError

pytestmark = pytest.mark.timeout(120)


def test_log_in_and_watch_a_queue_fill(page: Page, broker_factory: Factory, tmp_path: Path) -> None:
    b = secured_broker(broker_factory, tmp_path)
    send(b, "orders", 3)
    page.goto(console_url(b, "#/queues"))
    # Not logged in: the login page, not the browser's own password prompt.
    expect(page.get_by_role("heading", name="Log in to Tandem")).to_be_visible()
    screenshot(page, "login")
    page.get_by_label("User").fill("admin")
    page.get_by_label("Password").fill("wrong")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_test_id("login-error")).to_have_text("Wrong user name or password.")
    page.get_by_label("Password").fill(password_of("admin"))
    page.get_by_role("button", name="Log in").click()
    # Back where it was asked for, with the queue's depth as the broker has it.
    expect(page.get_by_role("heading", name="Queues")).to_be_visible()
    depth = page.locator('tr[data-queue="orders"] td[data-field="message_count"]')
    expect(depth).to_have_text("3")
    send(b, "orders", 4, start=3)
    expect(depth).to_have_text("7")  # the table follows without a reload
    send(b, "invoices", 2)
    expect(page.locator('tr[data-queue="invoices"] td[data-field="message_count"]')).to_have_text("2")
    screenshot(page, "queues")
    # Search by name part.
    page.get_by_label("Filter queues by name").fill("inv")
    expect(page.locator('tr[data-queue="orders"]')).to_have_count(0)
    expect(page.locator("tr[data-queue]")).to_have_count(1)
    page.get_by_label("Filter queues by name").fill("nothing-like-it")
    expect(page.get_by_test_id("queues-table")).to_contain_text("No queue name contains")
    # The overview's totals are the broker's.
    page.get_by_role("link", name="Overview").click()
    expect(page.get_by_test_id("total-messages")).to_have_text("9")
    assert admin_api(b).ok("GET", "/api/overview")["messages"] == 9
    # Logged out: every page asks for the login again.
    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("heading", name="Log in to Tandem")).to_be_visible()
    page.goto(console_url(b, "#/queues"))
    expect(page.get_by_role("heading", name="Log in to Tandem")).to_be_visible()


def test_the_queues_table_pages_and_sorts(page: Page, broker_factory: Factory, tmp_path: Path) -> None:
    b = secured_broker(broker_factory, tmp_path)
    with connect(url_for(b.url, "app")) as conn:
        session = conn.session()
        for i in range(30):
            p = session.create_producer(f"q{i:02d}")
            for _ in range({7: 5, 23: 3}.get(i, 1)):
                p.send(b"x")
    log_in(page, b)
    page.get_by_role("link", name="Queues", exact=True).click()
    rows = page.locator("tr[data-queue]")
    expect(page.get_by_test_id("queue-total")).to_have_text("30 queues")
    expect(rows).to_have_count(25)  # one page: 25 by default
    expect(rows.first).to_have_attribute("data-queue", "q00")
    page.get_by_role("button", name=re.compile("^Next")).click()
    expect(rows).to_have_count(5)
    expect(rows.first).to_have_attribute("data-queue", "q25")
    page.get_by_role("button", name=re.compile("Previous$")).click()
    expect(rows.first).to_have_attribute("data-queue", "q00")
    # By depth: the biggest first, then the other way round (ties by name).
    page.get_by_role("columnheader", name="Ready").click()
    expect(rows.nth(0)).to_have_attribute("data-queue", "q07")
    expect(rows.nth(1)).to_have_attribute("data-queue", "q23")
    page.get_by_role("columnheader", name=re.compile("^Ready")).click()
    expect(rows.nth(0)).to_have_attribute("data-queue", "q00")
    expect(rows.last).to_have_attribute("data-queue", "q26")  # 28 queues of 1: q07 and q23 left out
    page.get_by_label("Queues per page").select_option("50")
    expect(rows).to_have_count(30)
    expect(rows.last).to_have_attribute("data-queue", "q07")


def test_the_overview_charts_the_traffic(page: Page, broker_factory: Factory, tmp_path: Path) -> None:
    b = secured_broker(broker_factory, tmp_path)
    log_in(page, b)
    chart = page.get_by_test_id("throughput-chart")
    stop = threading.Event()
    sent = [0]

    def traffic() -> None:
        """Sends 20, receives (auto-acknowledged) 15, until told to stop (bounded: 2 minutes)."""
        with connect(url_for(b.url, "app")) as conn:
            session = conn.session()
            producer = session.create_producer("orders")
            consumer = session.create_consumer("orders")
            deadline = time.monotonic() + 120
            while not stop.is_set() and time.monotonic() < deadline:
                for _ in range(20):
                    producer.send(f"order {sent[0]}".encode())
                    sent[0] += 1
                for _ in range(15):
                    assert consumer.receive(timeout=10) is not None

    worker = threading.Thread(target=traffic, daemon=True)
    worker.start()
    try:
        # The rates the broker measured over its last 10 s, then the chart's samples of them.
        busy = re.compile(r"^(?!0$)[\d,.]+$")  # a number, not 0
        expect(page.get_by_test_id("rate-in")).to_have_text(busy)
        expect(page.get_by_test_id("rate-out")).to_have_text(busy)
        expect(chart).to_have_attribute("data-points", re.compile(r"^([3-9]|\d\d+)$"))
        if SCREENSHOTS:  # a longer line for the docs (about 30 s of polls)
            expect(chart).to_have_attribute("data-points", re.compile(r"^(1[5-9]|[2-9]\d|\d{3,})$"), timeout=60_000)
            screenshot(page, "overview")
    finally:
        stop.set()
        worker.join(30)
    assert not worker.is_alive()
    # A quarter of what was sent stays; the overview's total is the broker's.
    held = admin_api(b).ok("GET", "/api/overview")["messages"]
    assert held == sent[0] // 4 > 0
    expect(page.get_by_test_id("total-messages")).to_have_text(f"{held:,}")


def test_purge_a_queue_after_a_confirmation(page: Page, broker_factory: Factory, tmp_path: Path) -> None:
    b = secured_broker(broker_factory, tmp_path)
    send(b, "orders", 5, kind="refund")
    log_in(page, b)
    page.get_by_role("link", name="Queues", exact=True).click()
    page.locator('tr[data-queue="orders"]').get_by_role("link", name="orders").click()
    expect(page.get_by_role("heading", name=re.compile("^orders"))).to_be_visible()
    expect(page.get_by_test_id("queue-messages")).to_have_text("5")
    # Cancelled: nothing removed.
    page.get_by_role("button", name="Purge…").click()
    dialog = page.locator("#dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Remove the 5 messages waiting in orders")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    assert admin_api(b).ok("GET", "/api/overview")["messages"] == 5
    # Confirmed: the broker removed them all.
    page.get_by_role("button", name="Purge…").click()
    dialog.get_by_role("button", name="Purge").click()
    expect(dialog).to_be_hidden()
    expect(page.get_by_test_id("queue-notice")).to_have_text("Removed 5 messages.")
    expect(page.get_by_test_id("queue-messages")).to_have_text("0")
    assert admin_api(b).ok("GET", "/api/overview")["messages"] == 0


def test_a_viewer_sees_but_cannot_purge(page: Page, broker_factory: Factory, tmp_path: Path) -> None:
    b = secured_broker(broker_factory, tmp_path)
    send(b, "orders", 2)
    log_in(page, b, "viewer")
    page.goto(console_url(b, "#/queue/orders"))
    expect(page.get_by_test_id("queue-messages")).to_have_text("2")
    page.get_by_role("button", name="Purge…").click()
    dialog = page.locator("#dialog")
    dialog.get_by_role("button", name="Purge").click()
    # The broker's refusal, shown in the dialog, which stays open.
    expect(page.locator("#dialog-error")).to_contain_text(re.compile("not allowed|permission|unauthori", re.I))
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Cancel").click()
    assert admin_api(b).ok("GET", "/api/overview")["messages"] == 2


def test_consumers_addresses_and_closing_a_connection(page: Page, broker_factory: Factory, tmp_path: Path) -> None:
    b = secured_broker(broker_factory, tmp_path)
    log_in(page, b)
    with connect(url_for(b.url, "app"), reconnect_attempts=0) as conn:
        session = conn.session()
        session.create_consumer("orders", filter="kind = 'refund'")
        page.get_by_role("link", name="Consumers").click()
        consumer = page.get_by_test_id("consumers-table").locator("tbody tr").filter(has_text="orders")
        expect(consumer).to_have_count(1)
        expect(consumer).to_contain_text("kind = 'refund'")
        page.get_by_role("link", name="Addresses").click()
        expect(page.locator('tr[data-address="orders"]')).to_contain_text("anycast")
        page.get_by_role("link", name="Connections").click()
        row = page.locator("tr[data-connection]").filter(has_text="app")
        expect(row).to_have_count(1)
        screenshot(page, "connections")
        row.get_by_role("button", name="Close…").click()
        page.locator("#dialog").get_by_role("button", name="Close connection").click()
        expect(page.locator("tr[data-connection]").filter(has_text="app")).to_have_count(0)
        expect(page.get_by_role("status")).to_contain_text("Closed connection")
        # The broker dropped it, and the client (no reconnection) finds it gone.
        assert all(c.get("user") != "app" for c in admin_api(b).ok("GET", "/api/connections"))
        with pytest.raises(TandemError):
            session.create_producer("orders").send(b"after the close")


def test_names_are_shown_as_text_and_travel_in_urls(page: Page, broker_factory: Factory, tmp_path: Path) -> None:
    """A queue name is chosen by whoever sends: markup in it stays text, and `/`, `?` and quotes
    in it survive the page's address and the API's paths."""
    b = secured_broker(broker_factory, tmp_path)
    name = "evil/<img src=x onerror=\"window.pwned=1\">?x=1&y='2'"
    send(b, name, 2)
    log_in(page, b)
    page.get_by_role("link", name="Queues", exact=True).click()
    link = page.get_by_test_id("queues-table").get_by_role("link", name=name, exact=True)
    expect(link).to_have_count(1)
    link.click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(name)
    expect(page.get_by_test_id("queue-messages")).to_have_text("2")
    page.get_by_role("button", name="Purge…").click()
    page.locator("#dialog").get_by_role("button", name="Purge").click()
    expect(page.get_by_test_id("queue-notice")).to_have_text("Removed 2 messages.")
    assert page.evaluate("window.pwned") is None
    assert page.locator("main img").count() == 0


def test_security_off_needs_no_login(page: Page, broker_factory: Factory) -> None:
    b = broker_factory(extra_toml=management_toml()).start()
    send_open(b, "orders", 1)
    page.goto(console_url(b, "#/queues"))
    expect(page.locator('tr[data-queue="orders"] td[data-field="message_count"]')).to_have_text("1")
    expect(page.get_by_role("button", name="Log out")).to_be_hidden()
    page.goto(console_url(b, "#/login"))  # nothing to log in to: the overview
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()


def send_open(b: BrokerProcess, queue: str, n: int) -> None:
    with connect(b.url) as conn:
        p = conn.session().create_producer(queue)
        for i in range(n):
            p.send(f"order {i}".encode())


class AdminCluster(Cluster):
    """The pair's status asked as `admin` (security on)."""

    def url_of(self, i: int) -> str:
        return url_for(super().url_of(i), "admin")


def test_ha_state_flips_when_the_primary_is_killed(page: Page, other_page: Page, tmp_path: Path) -> None:
    """A shared-store pair: the backup's console shows it waiting, then active once the primary
    is killed (-9); the primary's console shows that its broker no longer answers."""
    users = secured(tmp_path, USERS, "")
    pair = AdminCluster(tmp_path, security_enabled=True, cluster_password=users["cluster_password"])
    for server in pair.servers:  # tables after the pair's own lines
        server.config_path.write_text(server.config_path.read_text() + SETTINGS + management_toml())
    try:
        off_the_loop(pair.start_all)
        primary, backup = pair.primary, pair.backup
        send(primary, "orders", 3)
        log_in(page, backup)
        expect(page.get_by_test_id("ha-state")).to_have_text("passive")
        expect(page.get_by_test_id("ha-role")).to_have_text("backup")
        expect(page.get_by_test_id("broker-badge")).to_have_attribute("data-state", "passive")
        # A waiting backup has no queues to show: the page says why.
        page.get_by_role("link", name="Queues", exact=True).click()
        expect(page.locator("main")).to_contain_text("This server is not active")
        page.get_by_role("link", name="Overview").click()
        expect(page.get_by_test_id("ha-state")).to_have_text("passive")
        log_in(other_page, primary)
        expect(other_page.get_by_test_id("ha-state")).to_have_text("active")
        screenshot(page, "ha-backup-waiting")

        primary.kill()

        expect(page.get_by_test_id("ha-state")).to_have_text("active")
        expect(page.get_by_test_id("broker-badge")).to_have_attribute("data-state", "active")
        expect(other_page.get_by_test_id("broker-badge")).to_have_attribute("data-state", "unreachable")
        expect(other_page.locator("#banner")).to_contain_text("does not answer")
        # The backup serves the primary's messages now.
        page.get_by_role("link", name="Queues", exact=True).click()
        expect(page.locator('tr[data-queue="orders"] td[data-field="message_count"]')).to_have_text("3")
        page.get_by_role("link", name="HA & journal").click()
        expect(page.get_by_test_id("ha-detail")).to_contain_text("shared-store-backup")
        expect(page.get_by_test_id("journal-detail")).to_contain_text("tandem-data")
        page.get_by_role("link", name="Overview").click()
        screenshot(page, "ha-backup-active")
    finally:
        pair.kill_all()


def test_a_replicated_pair_shows_its_replication(page: Page, other_page: Page, tmp_path: Path) -> None:
    """The primary's console shows its backup in sync and how far behind it is; the backup's
    shows it passive, then active (and alone) once the primary is killed."""
    pair = ReplicatedPair(tmp_path / "pair")
    for server in pair.servers:
        server.config_path.write_text(server.config_path.read_text() + management_toml())
    try:
        off_the_loop(pair.start_all)
        primary, backup = pair.primary, pair.backup
        page.goto(console_url(primary))
        expect(page.get_by_test_id("ha-role")).to_have_text("primary")
        expect(page.get_by_test_id("replication")).to_have_text("in-sync")
        send_open(primary, "orders", 20)
        expect(page.get_by_test_id("total-messages")).to_have_text("20")
        expect(page.get_by_test_id("replication-lag")).to_have_text("0 records behind")
        screenshot(page, "ha-replicated")
        other_page.goto(console_url(backup))
        expect(other_page.get_by_test_id("ha-state")).to_have_text("passive")
        expect(other_page.get_by_test_id("replication")).to_have_text("in-sync")

        primary.kill()

        expect(other_page.get_by_test_id("ha-state")).to_have_text("active")
        expect(other_page.get_by_test_id("total-messages")).to_have_text("20")
        expect(page.get_by_test_id("broker-badge")).to_have_attribute("data-state", "unreachable")
    finally:
        pair.kill_all()
