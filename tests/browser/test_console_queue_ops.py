"""The queue page's operations in the console (docs/console.md "A queue") against real brokers:
browse with a selector, move by selector, retry dead letters, pause and resume, each through its
confirmation dialog, each checked against what the broker then holds.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from console_pages import SETTINGS, USERS, Factory, admin_api, console_url, log_in, screenshot, send
from playwright.sync_api import Page, expect

from broker_process import BrokerProcess
from mgmt_http import management_toml
from secured import secured, url_for
from tandem.client.blocking import connect

pytestmark = pytest.mark.timeout(120)


def stat(b: BrokerProcess, queue: str) -> dict[str, object]:
    return admin_api(b).ok("GET", f"/api/queues/{queue}")  # type: ignore[no-any-return]


def test_browse_by_selector_then_move_the_matches(page: Page, broker_factory: Factory, tmp_path: Path) -> None:
    b = broker_factory(**secured(tmp_path, USERS, SETTINGS + management_toml())).start()
    with connect(url_for(b.url, "admin")) as conn:
        conn.manage("queue.create", name="refunds")
    with connect(url_for(b.url, "app")) as conn:
        p = conn.session().create_producer("orders")
        for i in range(6):
            p.send(f"order {i}".encode(), properties={"n": i, "kind": "refund" if i % 2 else "sale"})
        p.send(b'<img src=x onerror="window.pwned=1">', properties={"kind": "<script>window.pwned=1</script>"})
    log_in(page, b)
    page.goto(console_url(b, "#/queue/orders"))
    rows = page.get_by_test_id("messages-table").locator("tr[data-seq]")
    expect(rows).to_have_count(7)
    expect(rows.first).to_contain_text("order 0")
    expect(rows.first).to_contain_text("sale")
    # Bodies and headers are whoever sent them: shown as text, never run.
    expect(rows.last).to_contain_text('<img src=x onerror="window.pwned=1">')
    assert page.evaluate("window.pwned") is None
    assert page.locator("main img").count() == 0
    screenshot(page, "queue")
    page.get_by_label("Browse selector").fill("kind = 'refund'")
    page.get_by_role("button", name="Browse").click()
    expect(rows).to_have_count(3)
    for i, n in enumerate((1, 3, 5)):
        expect(rows.nth(i)).to_contain_text(f"order {n}")
    # Move the refunds to their own queue.
    page.get_by_role("button", name="Move…").click()
    dialog = page.locator("#dialog")
    dialog.get_by_label("To address").fill("refunds")
    dialog.get_by_label("Selector (optional)").fill("kind = 'refund'")
    dialog.get_by_role("button", name="Move").click()
    expect(dialog).to_be_hidden()
    expect(page.get_by_test_id("queue-notice")).to_have_text("Moved 3 message(s).")
    expect(page.get_by_test_id("queue-messages")).to_have_text("4")
    assert stat(b, "orders")["message_count"] == 4
    assert stat(b, "refunds")["message_count"] == 3
    # A bad selector: the broker's error in the dialog, nothing moved.
    page.get_by_role("button", name="Move…").click()
    dialog.get_by_label("To address").fill("refunds")
    dialog.get_by_label("Selector (optional)").fill("kind = = 'x'")
    dialog.get_by_role("button", name="Move").click()
    expect(page.locator("#dialog-error")).to_contain_text("selector")
    dialog.get_by_role("button", name="Cancel").click()
    assert stat(b, "orders")["message_count"] == 4


def test_retry_dead_letters_then_pause_and_resume(page: Page, broker_factory: Factory, tmp_path: Path) -> None:
    b = broker_factory(
        address_settings={"orders": {"max-delivery-attempts": 1, "dead-letter-address": "DLQ"}},
        **secured(tmp_path, USERS, SETTINGS + management_toml()),
    ).start()
    send(b, "orders", 3)
    with connect(url_for(b.url, "app")) as conn:  # one failed delivery each: dead letters
        consumer = conn.session(ack_mode="client").create_consumer("orders")
        assert all(consumer.receive(timeout=10) is not None for _ in range(3))
        consumer.close()
    log_in(page, b)
    page.goto(console_url(b, "#/queue/DLQ"))
    expect(page.get_by_test_id("queue-messages")).to_have_text("3")
    rows = page.get_by_test_id("messages-table").locator("tr[data-seq]")
    expect(rows).to_have_count(3)
    expect(rows.first).to_contain_text("_AMQ_ORIG_ADDRESS")
    page.get_by_role("button", name="Retry dead letters…").click()
    page.locator("#dialog").get_by_role("button", name="Retry").click()
    expect(page.get_by_test_id("queue-notice")).to_have_text("Sent 3 message(s) back to their original address.")
    expect(page.get_by_test_id("queue-messages")).to_have_text("0")
    assert stat(b, "DLQ")["message_count"] == 0
    assert stat(b, "orders")["message_count"] == 3

    # Pause: the queue says so on its page and in the table, and the broker has it paused.
    page.goto(console_url(b, "#/queue/orders"))
    page.get_by_role("button", name="Pause", exact=True).click()
    page.locator("#dialog").get_by_role("button", name="Pause").click()
    expect(page.get_by_test_id("paused")).to_be_visible()
    expect(page.get_by_role("button", name="Resume", exact=True)).to_be_visible()
    assert stat(b, "orders")["paused"] is True
    page.get_by_role("link", name="Queues", exact=True).click()
    expect(page.locator('tr[data-queue="orders"] td[data-field="state"]')).to_have_text("paused")
    page.locator('tr[data-queue="orders"]').get_by_role("link", name="orders").click()
    page.get_by_role("button", name="Resume", exact=True).click()
    page.locator("#dialog").get_by_role("button", name="Resume").click()
    expect(page.get_by_test_id("paused")).to_have_count(0)
    expect(page.get_by_role("button", name=re.compile("^Pause$"))).to_be_visible()
    assert stat(b, "orders")["paused"] is False
