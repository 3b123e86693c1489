"""What `queue.browse` shows of a message: its header fields, properties and a body preview.

JSON-ready (the HTTP API and the CLI print it as it is): a preview is text when it is UTF-8,
else base64 (`body_encoding`); a bytes property is `{"base64": ...}`. A large message's body
is never read whole: its size is the file's, its preview a bounded read of the file's start
(inflated, when the producer compressed it), made off the event loop.
"""

from __future__ import annotations

import base64
import os
import zlib
from pathlib import Path
from typing import Any

import msgspec

from ..core.message import MessageHeader, MessageRef

MAX_PREVIEW = 64 * 1024  # bytes of body one message's preview may hold


class _WithBody(MessageHeader):
    """A message's header and its body as a view of the encoded bytes (no copy)."""

    body: memoryview = msgspec.field(default_factory=lambda: memoryview(b""))


_decoder = msgspec.msgpack.Decoder(_WithBody)


def _json_value(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, list):
        return [_json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    return v


def preview_fields(data: bytes, full: bool) -> dict[str, Any]:
    """`body_preview` and `body_encoding` for the first bytes of a body (`full`: the whole body,
    so a UTF-8 character is never cut at its end; otherwise a cut one is left out)."""
    for cut in (0,) if full else (0, 1, 2, 3):
        try:
            text = data[: len(data) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return {"body_preview": text, "body_encoding": "utf-8"}
    return {"body_preview": base64.b64encode(data).decode(), "body_encoding": "base64"}


def describe(ref: MessageRef, paged: bool, preview: int) -> dict[str, Any]:
    """A browsed message as the API shows it; a large one's preview is filled in by `large_preview`."""
    m = ref.message
    h = _decoder.decode(m.raw)
    out: dict[str, Any] = {
        "id": m.id,
        "seq": ref.seq,
        "address": m.address,
        "priority": m.priority,
        "durable": m.durable,
        "expiration": m.expiration,
        "timestamp": h.timestamp,
        "dedup_id": h.dedup_id,
        "delivery_count": ref.delivery_count,
        "headers": _json_value(h.properties or {}),
        "large": m.large is not None,
        "paged": paged,
    }
    if m.large is not None:
        out["body_size"] = m.large.size
        out["compressed"] = m.large.compressed
        out.update(preview_fields(b"", True))
    else:
        body = h.body
        out["body_size"] = len(body)
        out.update(preview_fields(bytes(body[:preview]), len(body) <= preview))
    return out


def large_preview(path: Path, size: int, compressed: bool, preview: int) -> dict[str, Any]:
    """(A worker thread) the preview of a large body from the start of its file: at most
    `preview` bytes read (of a compressed one, at most MAX_PREVIEW read and `preview` inflated)."""
    if preview <= 0:
        return preview_fields(b"", True)
    with open(path, "rb") as f:
        if not compressed:
            data = os.pread(f.fileno(), preview, 0)
            return preview_fields(data, len(data) >= size)
        raw = os.pread(f.fileno(), MAX_PREVIEW, 0)
    inflate = zlib.decompressobj()
    try:
        data = inflate.decompress(raw, preview)
    except zlib.error:
        data = b""
    return preview_fields(data, False)
