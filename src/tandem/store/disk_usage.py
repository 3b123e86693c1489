"""What the page and large-message directories hold on disk, for `broker.journal` (`GET /api/journal`).

Only the filesystem knows the files' sizes, so these functions list and stat a directory: run
them in a worker thread, never on the event loop. The totals count every file; the listing of
files is capped (`limit` per page store, `limit` large messages), the lowest page numbers (the
oldest messages) and the oldest large messages first, with `truncated` saying that more exist.
A file removed while the directory is read is left out; a missing directory holds nothing.
"""

from __future__ import annotations

import heapq
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .pages import parse_page_name

_TX_ADDRESS = re.compile(r"^a(\d{1,19})-t\d{1,19}-\d{6}\.page$")  # an open transaction's file (store/pages.py)


@dataclass
class PageStoreFiles:
    """The files of one address's page store."""

    pages: list[tuple[int, str, int]] = field(default_factory=list)  # (page number, name, size)
    page_bytes: int = 0
    transaction_files: int = 0  # an open transaction's sends, not pages until its commit
    transaction_bytes: int = 0

    def describe(self, limit: int) -> dict[str, Any]:
        numbers = [p for p, _n, _s in self.pages]
        listed = heapq.nsmallest(limit, self.pages)
        return {
            "file_count": len(self.pages),
            "bytes": self.page_bytes,
            "first_page": min(numbers, default=None),
            "last_page": max(numbers, default=None),
            "transaction_files": self.transaction_files,
            "transaction_bytes": self.transaction_bytes,
            "files": [{"name": name, "page": page, "size": size} for page, name, size in listed],
            "truncated": len(self.pages) > len(listed),
        }


def _entries(directory: Path) -> list[tuple[str, int]]:
    """(name, size) of each regular file of `directory`."""
    out: list[tuple[str, int]] = []
    try:
        with os.scandir(directory) as it:
            for e in it:
                try:
                    if e.is_file(follow_symlinks=False):
                        out.append((e.name, e.stat(follow_symlinks=False).st_size))
                except FileNotFoundError:  # removed meanwhile (acknowledged)
                    continue
    except FileNotFoundError:
        pass
    return out


def scan_pages(directory: Path) -> dict[int, PageStoreFiles]:
    """The page files of `paging/`, per address id."""
    out: dict[int, PageStoreFiles] = {}
    for name, size in _entries(directory):
        parsed = parse_page_name(name)
        if parsed is not None:
            store = out.setdefault(parsed[0], PageStoreFiles())
            store.pages.append((parsed[1], name, size))
            store.page_bytes += size
            continue
        m = _TX_ADDRESS.match(name)
        if m is not None:
            store = out.setdefault(int(m.group(1)), PageStoreFiles())
            store.transaction_files += 1
            store.transaction_bytes += size
    return out


def _message_id(name: str) -> int:
    stem = name.split(".", 1)[0]
    return int(stem) if stem.isdigit() else -1


def scan_large(directory: Path, limit: int) -> dict[str, Any]:
    """The files of `large-messages/`: complete bodies (`.msg`) and uploads under way (`.part`)."""
    bodies: list[tuple[int, str, int]] = []
    uploads = upload_bytes = 0
    for name, size in _entries(directory):
        if name.endswith(".msg"):
            bodies.append((_message_id(name), name, size))
        elif name.endswith(".part"):
            uploads += 1
            upload_bytes += size
    listed = heapq.nsmallest(limit, bodies)
    return {
        "file_count": len(bodies),
        "bytes": sum(s for _i, _n, s in bodies),
        "uploading": uploads,
        "uploading_bytes": upload_bytes,
        "files": [{"name": name, "size": size} for _i, name, size in listed],
        "truncated": len(bodies) > len(listed),
    }
