"""The audit log: one line per security-relevant event on the `tandem.audit` logger.

Off by default; on with `audit-log = true` (`configure`). Each line says who (the user, or
`-` with security off), from where (the peer address), what (the event), on what (an address
or queue, or `-`), and whether it was allowed, then any details as key=value. Values are
quoted when they hold spaces, quotes or control characters (a client chooses queue names and
user names: it must not be able to forge a line). Cheap when off: one bool check.

Events: `login` (success and failure), `queue.create`, `queue.delete`, `queue.purge`,
`address.create`, `address.delete` and every management operation by its name; the permission
checks (decision 0060) add their denials.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("tandem.audit")

_enabled = False


def configure(enabled: bool) -> None:
    """On or off for this process (the broker calls it at start from `audit-log`)."""
    global _enabled
    _enabled = enabled
    if enabled and (log.level == logging.NOTSET or log.level > logging.INFO):
        log.setLevel(logging.INFO)  # its lines are at info, whatever the broker's log-level


def enabled() -> bool:
    return _enabled


def audit(event: str, subject: Any, peer: str, target: str | None, allowed: bool, **details: Any) -> None:
    """Log one event; `subject` is a server.security.Subject (or None: nobody logged in yet)."""
    if not _enabled:
        return
    user = getattr(subject, "user", None)
    parts = [
        f"user={'-' if user is None else _value(user)}",  # a user named "-" is written quoted
        f"peer={_value(peer)}",
        f"event={_value(event)}",
        f"target={'-' if target is None else _value(target)}",
        f"allowed={'yes' if allowed else 'no'}",
    ]
    parts += [f"{k}={_value(v)}" for k, v in details.items() if v is not None]
    log.info(" ".join(parts))


def _value(v: Any) -> str:
    text = str(v)
    if len(text) > 200:
        text = text[:200] + "..."
    if text and text != "-" and all(c.isprintable() and c not in ' "=\\' for c in text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in escaped)
    return f'"{escaped}"'


def created_by_send(made: list[tuple[str, str]] | None, subject: Any, peer: str, protocol: str) -> None:
    """Audit what a send just auto-created (PostOffice.auto_created, kept only with the audit log on)."""
    if made:
        for event, name in made:
            audit(event, subject, peer, name, True, by="send", protocol=protocol)
        made.clear()
