"""Store pressure for a chaos run (`--store`): the faults strike while the broker pages, or while
a share of the messages are large messages, instead of while a short queue of tiny bodies lives
in memory.

- ``plain``: today's run; the queue stays short and in memory.
- ``paging``: the chaos address gets a `max-size-bytes` of a few KiB with `address-full-policy =
  "PAGE"` and small page files, so almost every message is written to a page file and read back,
  across many files; the consumers take a small window and all pause now and then, so a backlog
  forms in the pages and is depaged while faults strike.
- ``large``: every third value (chosen by its name, so a reader knows which) is sent as a large
  message: the value, a ``|``, then padding up to LARGE_BODY bytes, over the clients'
  `min_large_message_size` (LARGE_THRESHOLD), so it travels in chunks and lives in a file.
- ``paging-large``: both at once. Large messages are not paged (their bodies are files already):
  they are queued in memory while the smaller ones wait in the pages.

A body always identifies its value: `value_of` reads it back, and a large body whose padding is
not exactly what was sent (a chunk lost, doubled or out of place) reads as a value never sent, so
the checker reports it as unexpected.
"""

from __future__ import annotations

import zlib
from typing import Any

STORES = ("plain", "paging", "large", "paging-large")


def pages(store: str) -> bool:
    return store in ("paging", "paging-large")


def streams(store: str) -> bool:
    return store in ("large", "paging-large")


# paging
MAX_SIZE_BYTES = 4096  # the chaos address's memory: a few dozen tiny messages
PAGE_SIZE_BYTES = 16 * 1024  # page files of ~100 records: a backlog spans many of them
CONSUMER_WINDOW = 4096  # bytes of credit per consumer: the backlog waits in the broker's pages
PAUSE_EVERY = 10.0  # seconds: every consumer pauses together for PAUSE_FOR once per period
PAUSE_FOR = 5.0

# large
LARGE_THRESHOLD = 2048  # the clients' min_large_message_size
LARGE_BODY = 5000  # bytes of a large body: three chunks
LARGE_SHARE = 3  # one value in LARGE_SHARE is large
_PAD = "".join(f"{i:05d}," for i in range(LARGE_BODY // 6 + 1))  # where a byte sits says which it is


def server_toml(store: str, address: str) -> str:
    """What the servers' configuration adds for `store` (appended after their other tables)."""
    if not pages(store):
        return ""
    return (
        f'[address-settings."{address}"]\n'
        f"max-size-bytes = {MAX_SIZE_BYTES}\n"
        'address-full-policy = "PAGE"\n'
        f"page-size-bytes = {PAGE_SIZE_BYTES}\n"
    )


def client_options(store: str) -> dict[str, Any]:
    """What the chaos clients' options add for `store`."""
    options: dict[str, Any] = {}
    if streams(store):
        options["min_large_message_size"] = LARGE_THRESHOLD
    if pages(store):
        options["consumer_window_size"] = CONSUMER_WINDOW
    return options


def is_large(value: str) -> bool:
    return zlib.crc32(value.encode()) % LARGE_SHARE == 0


def body_of(store: str, value: str) -> str:
    """The body that carries `value`."""
    if not streams(store) or not is_large(value):
        return value
    return f"{value}|{_PAD[: LARGE_BODY - len(value) - 1]}"


def value_of(body: bytes) -> str:
    """The value a body carries; a large body that is not whole and in order reads as
    ``<value>|damaged`` (never sent: the checker reports it as unexpected)."""
    text = body.decode(errors="replace")
    value, bar, _ = text.partition("|")
    if not bar and len(text) < LARGE_THRESHOLD:
        return text
    return value if text == body_of("large", value) and is_large(value) else f"{value[:40]}|damaged"


def pause_left(store: str, since_start: float) -> float:
    """How long the consumers still pause now (paging only: the last PAUSE_FOR seconds of each
    period), 0 when they do not."""
    if not pages(store):
        return 0.0
    into = since_start % PAUSE_EVERY
    return PAUSE_EVERY - into if into >= PAUSE_EVERY - PAUSE_FOR else 0.0
