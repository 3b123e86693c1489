"""STOMP 1.0, 1.1 and 1.2 frames (sans-IO): bytes in → frames out, frames → bytes.

    COMMAND EOL (name:value EOL)* EOL body NUL (EOL)*

Header values are escaped in 1.1 (\\\\ \\n \\c) and 1.2 (also \\r), never in CONNECT and
CONNECTED frames, never in 1.0. A body ends at the NUL, or after `content-length` bytes (which
may contain NULs) followed by a NUL. Lines may end in CRLF. A repeated header keeps its first
value. Bare EOLs between frames are heart-beats.
"""

from __future__ import annotations

import re

import msgspec

from ..errors import FrameTooLarge, ProtocolError

CLIENT_COMMANDS = frozenset(
    {"CONNECT", "STOMP", "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT", "ABORT", "DISCONNECT"}
)
SERVER_COMMANDS = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})
VERSIONS = ("1.0", "1.1", "1.2")
_RAW_COMMANDS = frozenset({"CONNECT", "STOMP", "CONNECTED"})  # headers never escaped
_ACK_ID_BYTES = b"0123456789."
_UNESCAPE_12 = {"\\\\": "\\", "\\n": "\n", "\\c": ":", "\\r": "\r"}
_UNESCAPE_11 = {"\\\\": "\\", "\\n": "\n", "\\c": ":"}
_ESCAPE_RE = re.compile(r"\\.?")


class StompError(ProtocolError):
    """Bad STOMP input: the connection gets an ERROR frame with this message, then closes."""


class Frame(msgspec.Struct, gc=False):
    """A parsed frame (a struct, not a dataclass: built once per frame on the hot path)."""

    command: str
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    body: bytes = b""

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name, default)


def _unescape(text: str, version: str) -> str:
    if "\\" not in text:
        return text
    table = _UNESCAPE_12 if version == "1.2" else _UNESCAPE_11

    def sub(m: re.Match[str]) -> str:
        seq = m.group(0)
        if seq not in table:
            raise StompError(f"undefined escape sequence {seq!r} in a header")
        return table[seq]

    return _ESCAPE_RE.sub(sub, text)


_SPECIAL = re.compile(r"[\\\n:\r]")


def escape(text: str, version: str) -> str:
    # isalnum first: receipt ids and most values are plain, and it is cheaper than the search.
    if version == "1.0" or text.isalnum() or not _SPECIAL.search(text):
        return text
    text = text.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
    if version == "1.2":
        text = text.replace("\r", "\\r")
    return text


class StompParser:
    """Feed bytes, get frames. `version` (set once CONNECT is negotiated) decides header escaping."""

    def __init__(self, max_frame_size: int, version: str = "1.0", commands: frozenset[str] = CLIENT_COMMANDS):
        self.max_frame_size = max_frame_size
        self.version = version
        self.commands = commands
        self._buf = bytearray()
        self.heartbeats = 0
        self.failed: ProtocolError | None = None  # bad input after good frames of the same read
        # Work done on frames that span reads (bytes searched, bytes copied): what a test counts
        # to show that a frame costs work in proportion to its size, however it is chunked.
        self.scanned = 0
        self.copied = 0

    def feed(self, data: bytes) -> list[Frame]:
        """Frames completed by `data`. Bad input raises a ProtocolError; when good frames came before
        it in the same read, those are returned first and the error is kept in `failed` (and
        raised by the next call), so a client's last good frames are still acted on."""
        if self.failed is not None:
            raise self.failed
        out: list[Frame] = []
        try:
            return self._feed(data, out)
        except ProtocolError as exc:
            if not out:
                raise
            self.failed = exc
            return out

    def _feed(self, data: bytes, out: list[Frame]) -> list[Frame]:
        if self._buf:
            self.copied += 2 * len(data) + len(self._buf)
            self._buf += data
            data = bytes(self._buf)  # frames are sliced out of immutable bytes, consumed once
            self._buf.clear()
        pos = 0
        n = len(data)
        limit = self.max_frame_size
        commands = self.commands
        plain = self.version == "1.0"  # no escaping at all
        ack_fast = "ACK" in commands
        # One loop, no call per frame: this runs for every frame a client sends.
        while True:
            if pos < n and (data[pos] == 10 or data[pos] == 13):  # heart-beats, EOLs after a NUL
                start = pos
                while pos < n and data[pos] in (10, 13):
                    pos += 1
                self.heartbeats += data.count(b"\n", start, pos)
            if pos >= n:
                return out
            if ack_fast and data.startswith(b"ACK\nid:", pos):
                # One ACK per MESSAGE is most of what a consumer sends: a frame that is exactly
                # ACK with one plain `id` header and no body is taken without the general path.
                end = data.find(b"\n\n\0", pos + 7)
                if end >= 0:
                    raw_id = data[pos + 7 : end]
                    # Only digits and dots, as in the ids this broker hands out ("CID.MID"):
                    # nothing to unescape, no other header, and ASCII (one C call, not three scans).
                    if not raw_id.translate(None, _ACK_ID_BYTES):
                        out.append(Frame("ACK", {"id": raw_id.decode("ascii")}))
                        pos = end + 3
                        continue
            # The header block ends at the first EOL EOL (either may be CRLF): C-level finds.
            lf = data.find(b"\n\n", pos)
            crlf = data.find(b"\n\r\n", pos, lf + 2 if lf >= 0 else n)
            if crlf >= 0:
                eol, body_start = crlf, crlf + 3
            elif lf >= 0:
                eol, body_start = lf, lf + 2
            else:
                if n - pos > limit:
                    raise FrameTooLarge(f"frame headers exceed max-frame-size {limit}")
                self._check_command_prefix(data, pos)
                self.scanned += 2 * (n - pos)
                self.copied += n - pos
                self._buf += data[pos:]
                return out
            head_end = eol - 1 if eol > pos and data[eol - 1] == 13 else eol
            try:
                head = data[pos:head_end].decode("utf-8")
            except UnicodeDecodeError:
                raise StompError("frame headers are not UTF-8") from None
            lines = head.split("\n")
            if "\r" in head:  # CRLF line endings
                lines = [line[:-1] if line.endswith("\r") else line for line in lines]
            command = lines[0]
            if command not in commands:
                raise StompError(f"unknown command {command[:40]!r}")
            headers: dict[str, str] | None = None
            escaped = not plain and "\\" in head and command not in _RAW_COMMANDS
            if not escaped:
                # Last line first, so the first of repeated headers wins; a line without
                # ':' (or an empty one) goes to the slow path, which reports it.
                headers = {}
                for line in lines[:0:-1]:
                    name, sep, value = line.partition(":")
                    if not sep:
                        headers = None
                        break
                    headers[name] = value
            if headers is None:
                headers = self._headers(command, lines, escaped)
            length_text = headers.get("content-length")
            if length_text is not None:
                try:
                    length = int(length_text)
                except ValueError:
                    raise StompError(f"content-length is not a number: {length_text[:20]!r}") from None
                if length < 0:
                    raise StompError("content-length is negative")
                end = body_start + length
                if end - pos >= limit:
                    raise FrameTooLarge(f"frame of {end - pos + 1} bytes exceeds max-frame-size {limit}")
                if n <= end:  # the body is not all here yet
                    self.scanned += body_start - pos
                    self.copied += n - pos
                    self._buf += data[pos:]
                    return out
                if data[end] != 0:
                    raise StompError("frame body is not followed by NUL (content-length too short?)")
            else:
                end = data.find(b"\0", body_start)
                if end < 0:
                    if n - pos > limit:
                        raise FrameTooLarge(f"frame exceeds max-frame-size {limit} (no NUL)")
                    self.scanned += n - pos
                    self.copied += n - pos
                    self._buf += data[pos:]
                    return out
                if end - pos >= limit:
                    raise FrameTooLarge(f"frame of {end - pos + 1} bytes exceeds max-frame-size {limit}")
            out.append(Frame(command, headers, data[body_start:end]))
            pos = end + 1
            if (command == "CONNECT" or command == "STOMP") and pos < n:
                # What follows is parsed with the negotiated version: the caller
                # sets `version` and feeds b"" to get the rest.
                self._buf += data[pos:]
                return out

    def _check_command_prefix(self, data: bytes, pos: int) -> None:
        """Reject at once input whose first line can never become a known command.

        Without this, a TLS hello or a stray text line would wait for a header end
        that never comes, until the connection's TTL.
        """
        eol = data.find(b"\n", pos)
        first = data[pos : eol if eol >= 0 else len(data)]
        if first.endswith(b"\r"):
            first = first[:-1]
        try:
            text = first.decode("utf-8")
        except UnicodeDecodeError:
            text = "\ufffd"
        if eol >= 0:
            if text not in self.commands:
                raise StompError(f"unknown command {text[:40]!r}")
        elif not any(c.startswith(text) for c in self.commands):
            raise StompError(f"unknown command {text[:40]!r}")

    def _headers(self, command: str, lines: list[str], escaped: bool) -> dict[str, str]:
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                if not line:
                    continue
                raise StompError(f"header line without ':' in {command} frame: {line[:60]!r}")
            if escaped and ("\\" in line):
                name, value = _unescape(name, self.version), _unescape(value, self.version)
            if name not in headers:  # the first of repeated headers wins
                headers[name] = value
        return headers


def encode(command: str, headers: list[tuple[str, str]], body: bytes = b"", version: str = "1.2") -> bytes:
    """A frame; `content-length` is added when there is a body (so it may contain NULs)."""
    raw = command in ("CONNECT", "STOMP", "CONNECTED")
    parts = [command]
    for name, value in headers:
        if not raw:
            name, value = escape(name, version), escape(value, version)
        parts.append(f"{name}:{value}")
    if body:
        parts.append(f"content-length:{len(body)}")
    return ("\n".join(parts) + "\n\n").encode() + body + b"\0"


def receipt(receipt_id: str, version: str) -> bytes:
    """A RECEIPT frame (one per acknowledged client frame: built without the general encoder)."""
    return b"RECEIPT\nreceipt-id:" + escape(receipt_id, version).encode() + b"\n\n\0"


def negotiate(accept_version: str | None) -> str | None:
    """The highest version both speak; `accept-version` absent means 1.0."""
    if accept_version is None:
        return "1.0"
    offered = {v.strip() for v in accept_version.split(",")}
    for v in reversed(VERSIONS):
        if v in offered:
            return v
    return None
