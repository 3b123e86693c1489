"""What the management operations show of connections, consumers, settings and the journal.

Read at the moment of the request from what the broker keeps anyway: nothing here is updated
per message. Connections get a small number as their id the first time they are listed (kept
while they live), so `connection.close` can name one.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import time
import weakref
from pathlib import Path
from typing import Any

from ..core.settings import AddressSettings
from ..store.disk_usage import PageStoreFiles


class ConnectionIds:
    """A number per connection, stable while it lives, never reused."""

    def __init__(self) -> None:
        self._ids: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._next = itertools.count(1)

    def of(self, conn: Any) -> int:
        n = self._ids.get(conn)
        if n is None:
            n = self._ids[conn] = next(self._next)
        return n


def _wall(conn: Any, monotonic: float | None) -> float | None:
    """A loop-clock time of `conn` as a Unix time."""
    if monotonic is None:
        return None
    return round(time.time() - (conn.loop.time() - monotonic), 3)  # type: ignore[no-any-return]


def _sessions(conn: Any) -> list[Any]:
    """The core sessions (core/session.py ServerSession) of a native or STOMP connection."""
    if isinstance(getattr(conn, "sessions", None), dict):
        return [s.core for s in conn.sessions.values()]
    session = getattr(conn, "session", None)
    return [session] if session is not None else []


def protocol_of(conn: Any) -> str:
    return "stomp" if hasattr(conn, "subscriptions") else "native"


def describe_connection(conn: Any, cid: int) -> dict[str, Any]:
    sessions = _sessions(conn)
    subject = getattr(conn, "subject", None)
    transport = getattr(conn, "transport", None)
    tls = transport is not None and transport.get_extra_info("ssl_object") is not None
    out: dict[str, Any] = {
        "id": cid,
        "peer": conn.peer,
        "acceptor": getattr(conn, "acceptor", None),
        "protocol": protocol_of(conn),
        "user": getattr(subject, "user", None),
        "client_id": getattr(conn, "client_id", None),
        "tls": tls,
        "since": _wall(conn, getattr(conn, "opened_at", None)),
        "sessions": len(sessions),
        "consumers": sum(len(s.consumers) for s in sessions),
        "detached": bool(getattr(conn, "detached", False)),  # socket gone, sessions kept for a reattach
        "replica": getattr(conn, "replica", None) is not None,  # a backup's replication link
    }
    if protocol_of(conn) == "stomp":
        out["version"] = getattr(conn, "version", None)
    return out


def describe_consumer(c: Any, ids: ConnectionIds) -> dict[str, Any]:
    session = c.owner
    conn = getattr(session, "owner", None)
    return {
        "connection": ids.of(conn) if conn is not None else None,
        "session": getattr(session, "name", None),
        "id": c.id,
        "queue": c.queue.name,
        "selector": getattr(c.filter, "text", None),
        "browse_only": c.browse_only,
        "delivering": len(c.delivering),
        "since": round(c.since, 3),
    }


def settings_in_force(settings: AddressSettings) -> dict[str, Any]:
    """The address settings a queue works with (patterns resolved), by their config names."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        out[f.name.replace("_", "-")] = value.name.lower() if isinstance(value, enum.Enum) else value
    return out


def journal_info(journal: Any) -> dict[str, Any]:
    """One journal (core/journal.py Journal): its files, what is live in them, its compactions."""
    stats = journal.stats()
    files = [
        {
            "name": f.path.name,
            "size": f.size,
            "used": f.used,
            "records": f.records,
            "live_records": f.live,
            "live_bytes": f.live_bytes,
        }
        for f in journal.file_summaries()
    ]
    last = getattr(journal, "last_compaction", None)
    return {
        "directory": str(journal.directory),
        "files": files,
        "file_count": stats.files,
        "free_files": stats.free_files,
        "bytes": sum(f["size"] for f in files),
        "records": stats.records,
        "live_records": stats.live_records,
        "live_bytes": stats.live_bytes,
        "used_bytes": stats.used_bytes,
        "compactions": stats.compactions,
        "last_compaction": None if last is None else {"at": round(last[0], 3), "seconds": round(last[1], 3)},
        "corrupt": stats.corrupt,
    }


def page_store_memory(addresses: Any) -> dict[int, dict[str, Any]]:
    """Per address id, what the pager of each address that paged since start keeps in memory
    (core/paging.py AddressPager): read on the loop, before the files are listed."""
    out: dict[int, dict[str, Any]] = {}
    for addr in addresses:
        pager = addr.pager
        if pager is None:
            continue
        out[addr.id] = {
            "address": addr.name,
            "address_id": addr.id,
            "paging": pager.active,
            "messages": sum(pager.counts.values()),  # records in its page files
            "paged_messages": sum(pager.paged.values()),  # per queue, not read back yet
        }
    return out


def paging_info(
    directory: Path, memory: dict[int, dict[str, Any]], disk: dict[int, PageStoreFiles], limit: int
) -> dict[str, Any]:
    """`paging/`: per address (those with a pager, and any other id with files), its pager's
    counts and its files; totals over every file."""
    stores: list[dict[str, Any]] = []
    for aid in set(memory) | set(disk):
        row = dict(memory.get(aid) or {"address": None, "address_id": aid, "paging": False})
        row.update((disk.get(aid) or PageStoreFiles()).describe(limit))
        stores.append(row)
    stores.sort(key=lambda r: (r["address"] is None, r["address"] or "", r["address_id"]))
    return {
        "directory": str(directory),
        "file_count": sum(len(s.pages) + s.transaction_files for s in disk.values()),
        "bytes": sum(s.page_bytes + s.transaction_bytes for s in disk.values()),
        "addresses": stores,
    }
