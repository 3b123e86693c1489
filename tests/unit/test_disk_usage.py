"""What `broker.journal` reports of paging/ and large-messages/ (store/disk_usage.py,
server/inventory.py paging_info), over real files in a temporary directory."""

from __future__ import annotations

from pathlib import Path

from tandem.server.inventory import paging_info
from tandem.store.disk_usage import scan_large, scan_pages
from tandem.store.pages import page_name, tx_page_name


def write(directory: Path, name: str, size: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(b"x" * size)


def test_pages_per_address_with_transaction_files_and_unknown_addresses(tmp_path: Path) -> None:
    d = tmp_path / "paging"
    for page in (3, 4, 5, 7):
        write(d, page_name(2, page), 100 * page)
    write(d, tx_page_name(2, 99, 1), 50)
    write(d, page_name(9, 1), 10)
    write(d, "a2-0000000008.page.tmp", 1000)  # not a page: not counted
    memory = {
        2: {"address": "orders", "address_id": 2, "paging": True, "messages": 12, "paged_messages": 5},
        4: {"address": "idle", "address_id": 4, "paging": False, "messages": 0, "paged_messages": 0},
    }
    info = paging_info(d, memory, scan_pages(d), 2)
    assert (info["file_count"], info["bytes"]) == (6, 1900 + 50 + 10)
    idle, orders, unknown = info["addresses"]
    assert orders["address"] == "orders" and orders["messages"] == 12 and orders["paged_messages"] == 5
    assert (orders["file_count"], orders["bytes"], orders["first_page"], orders["last_page"]) == (4, 1900, 3, 7)
    assert (orders["transaction_files"], orders["transaction_bytes"]) == (1, 50)
    assert orders["files"] == [
        {"name": page_name(2, 3), "page": 3, "size": 300},
        {"name": page_name(2, 4), "page": 4, "size": 400},
    ]
    assert orders["truncated"] is True
    assert (idle["file_count"], idle["bytes"], idle["first_page"], idle["files"], idle["truncated"]) == (
        0,
        0,
        None,
        [],
        False,
    )
    assert unknown["address"] is None and unknown["address_id"] == 9 and unknown["file_count"] == 1
    assert paging_info(tmp_path / "none", {}, scan_pages(tmp_path / "none"), 5)["addresses"] == []


def test_large_message_files_and_uploads(tmp_path: Path) -> None:
    d = tmp_path / "large-messages"
    for mid, size in ((1200, 5), (17, 7), (300, 11)):
        write(d, f"{mid}.msg", size)
    write(d, "1300.part", 3)
    info = scan_large(d, 2)
    assert (info["file_count"], info["bytes"], info["uploading"], info["uploading_bytes"]) == (3, 23, 1, 3)
    assert info["files"] == [{"name": "17.msg", "size": 7}, {"name": "300.msg", "size": 11}]
    assert info["truncated"] is True
    assert scan_large(d, 0)["files"] == [] and scan_large(tmp_path / "none", 5)["file_count"] == 0
