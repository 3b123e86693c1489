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
    streamed: bool = False  # a SEND whose body follows as BODY_PART frames and a BODY_END (see StompParser)

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


# What the buffer holds between reads (`_state`): nothing, the start of a frame whose header
# block has not ended, a frame whose body ends at a known length, one whose body ends at a NUL,
# or bytes held back after CONNECT (parsed once the connection has its version).
_EMPTY, _HEAD, _LENGTH, _NUL, _HELD, _STREAM = range(6)

# Pseudo-commands (no STOMP command starts with NUL): pieces of a streamed SEND's body, in order,
# then its end (the NUL was there). Only a parser with `stream_over` set makes them.
BODY_PART = "\0body"
BODY_END = "\0end"


class StompParser:
    """Feed bytes, get frames. `version` (set once CONNECT is negotiated) decides header escaping.

    A frame that spans reads costs work in proportion to its size, however it is chunked: the
    buffer remembers how far the header end was searched, waits for a declared content-length
    without looking at the body, and searches only new bytes for the NUL.

    `first_frame_limit` holds frames to less than `max_frame_size` until a CONNECT (or STOMP)
    frame has been parsed: a server's limit for clients that have not logged in."""

    def __init__(
        self,
        max_frame_size: int,
        version: str = "1.0",
        commands: frozenset[str] = CLIENT_COMMANDS,
        first_frame_limit: int | None = None,
    ):
        self.max_frame_size = max_frame_size
        self.limit = min(first_frame_limit or max_frame_size, max_frame_size)  # in force now
        self.version = version
        self.commands = commands
        self._buf = bytearray()
        self._state = _EMPTY
        self._scan = 0  # _HEAD: bytes of the buffer already searched for the header end
        self._need = 0  # _LENGTH: bytes of the whole frame, its NUL included
        self._body_start = 0  # _LENGTH, _NUL: where the body starts in the buffer
        self._command = ""
        self._frame_headers: dict[str, str] = {}
        self._left = 0  # _STREAM: body bytes still to come
        # A SEND with a content-length over this (>= 0) is not buffered: its body comes out in
        # pieces as it arrives (BODY_PART frames, then BODY_END), and max-frame-size does not limit
        # it (a server's large messages). -1: every frame whole.
        self.stream_over = -1
        self.heartbeats = 0
        self.failed: ProtocolError | None = None  # bad input after good frames of the same read
        # Work done on frames that span reads: bytes searched in the parser's own buffer and
        # bytes copied into or out of it (searches on the bytes fed are the caller's to count).
        # What a test counts to show that a frame costs work in proportion to its size.
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
        pos = 0
        # The first LF LF at or after `pos`, and a CR no later than the first LF CR LF (n: none in
        # this read), kept from frame to frame: each search starts where the last one stopped, so
        # a read of many frames is searched about once, even when none ends its headers with LF LF.
        lf = cr = -1
        if self._buf or self._state == _STREAM:
            resumed = self._resume(data, out)
            if resumed is None:
                return out
            data, pos, lf, cr = resumed
        n = len(data)
        limit = self.limit
        commands = self.commands
        plain = self.version == "1.0"  # no escaping at all
        ack_from = 0 if "ACK" in commands else 1 << 62  # where the ACK fast path may be tried
        # One loop, no call per frame: this runs for every frame a client sends.
        while True:
            if pos < n and (data[pos] == 10 or data[pos] == 13):  # heart-beats, EOLs after a NUL
                start = pos
                while pos < n and data[pos] in (10, 13):
                    pos += 1
                self.heartbeats += data.count(b"\n", start, pos)
            if pos >= n:
                return out
            if pos >= ack_from and data.startswith(b"ACK\nid:", pos):
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
                # Not this frame's end: no fast path until past it (else each ACK-like frame
                # before it would search and copy up to it again).
                ack_from = end + 1 if end >= 0 else n
            # The header block ends at the first EOL EOL (either may be CRLF): C-level finds.
            if lf < pos:
                lf = data.find(b"\n\n", pos)
                if lf < 0:
                    lf = n
            if cr < pos:
                cr = data.find(b"\r", pos)  # a CR (one memchr); LF CR LF is looked for only after one
                if cr < 0:
                    cr = n
            crlf = data.find(b"\n\r\n", cr - 1, lf + 2) if cr < lf else -1
            if crlf >= 0:
                eol, body_start = crlf, crlf + 3
            elif lf < n:
                eol, body_start = lf, lf + 2
            else:
                if n - pos > limit:
                    raise FrameTooLarge(f"frame headers exceed {self._named(limit)}")
                self._check_command_prefix(data, pos)
                self._hold(data, pos, _HEAD)
                self._scan = n - pos
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
                length = ascii_int(length_text)
                if length is None:
                    raise StompError(f"content-length must be ASCII digits, got {length_text[:20]!r}")
                if command == "SEND" and 0 <= self.stream_over < length:
                    out.append(Frame(command, headers, b"", True))
                    after = self._stream(data, body_start, length, out)
                    if after is None:
                        return out
                    pos = after
                    continue
                end = body_start + length
                if end - pos >= limit:
                    raise FrameTooLarge(f"frame of {end - pos + 1} bytes exceeds {self._named(limit)}")
                if n <= end:  # the body is not all here yet: wait for it, without looking at it
                    self._hold(data, pos, _LENGTH, command, headers, body_start)
                    self._need = end - pos + 1
                    return out
                if data[end] != 0:
                    raise StompError("frame body is not followed by NUL (content-length too short?)")
            else:
                end = data.find(b"\0", body_start)
                if end < 0:
                    if n - pos > limit:
                        raise FrameTooLarge(f"frame exceeds {self._named(limit)} (no NUL)")
                    self._hold(data, pos, _NUL, command, headers, body_start)
                    return out
                if end - pos >= limit:
                    raise FrameTooLarge(f"frame of {end - pos + 1} bytes exceeds {self._named(limit)}")
            out.append(Frame(command, headers, data[body_start:end]))
            pos = end + 1
            if command == "CONNECT" or command == "STOMP":
                self.limit = limit = self.max_frame_size
                if pos < n:
                    # What follows is parsed with the negotiated version: the caller
                    # sets `version` and feeds b"" to get the rest.
                    self._hold(data, pos, _HELD)
                    return out

    def _hold(
        self, data: bytes, pos: int, state: int, command: str = "", headers: dict[str, str] | None = None, body: int = 0
    ) -> None:
        """Keep data[pos:] (the start of a frame, or what follows CONNECT) for the next read."""
        self._buf += memoryview(data)[pos:]
        self.copied += len(data) - pos
        self._state = state
        if headers is not None:
            self._command, self._frame_headers, self._body_start = command, headers, body - pos

    def _stream(self, data: bytes, start: int, left: int, out: list[Frame]) -> int | None:
        """Pass on up to `left` body bytes from data[start:], then expect the NUL: where parsing
        goes on after it, or None (state _STREAM) when the body or its NUL is still to come."""
        n = len(data)
        take = min(left, n - start)
        if take > 0:
            out.append(Frame(BODY_PART, {}, data[start : start + take]))
        left -= take
        pos = start + take
        if left or pos >= n:
            self._state = _STREAM
            self._left = left
            return None
        if data[pos] != 0:
            raise StompError("frame body is not followed by NUL (content-length too short?)")
        self._state = _EMPTY
        out.append(Frame(BODY_END, {}))
        return pos + 1

    def _resume(self, data: bytes, out: list[Frame]) -> tuple[bytes, int, int, int] | None:
        """Go on with the buffered frame: None while it is still incomplete, else the bytes to
        parse next, where to start, and where the header end lies in them if already known."""
        if self._state == _STREAM:
            pos = self._stream(data, 0, self._left, out)
            return None if pos is None else (data, pos, -1, -1)
        buf = self._buf
        state = self._state
        if state == _LENGTH or state == _NUL:
            have = len(buf)
            if state == _LENGTH:
                if have + len(data) < self._need:
                    buf += data
                    self.copied += len(data)
                    return None
                end = self._need - have - 1  # the NUL, in `data`
                if data[end] != 0:
                    raise StompError("frame body is not followed by NUL (content-length too short?)")
            else:
                limit = self.limit
                end = data.find(b"\0")  # only the new bytes: the buffered ones have no NUL
                if end < 0:
                    if have + len(data) > limit:
                        raise FrameTooLarge(f"frame exceeds {self._named(limit)} (no NUL)")
                    buf += data
                    self.copied += len(data)
                    return None
                if have + end >= limit:
                    raise FrameTooLarge(f"frame of {have + end + 1} bytes exceeds {self._named(limit)}")
            buf += memoryview(data)[:end]
            with memoryview(buf) as view:
                body = bytes(view[self._body_start :])
            self.copied += end + len(body)
            command = self._command
            out.append(Frame(command, self._frame_headers, body))
            self._clear()
            if command == "CONNECT" or command == "STOMP":
                self.limit = self.max_frame_size
                if end + 1 < len(data):
                    self._hold(data, end + 1, _HELD)
                    return None
            return data, end + 1, -1, -1
        if state == _HELD:
            whole = bytes(buf) + data
            self._clear()
            self.copied += len(whole)
            self.scanned += 3 * len(whole)  # (the loop may search each byte for LF LF, LF CR LF and NUL)
            return whole, 0, -1, -1
        # _HEAD: search the new bytes (and the two before them: an EOL EOL may straddle reads)
        from_ = max(self._scan - 2, 0)
        buf += data
        self.copied += len(data)
        n = len(buf)
        lf = buf.find(b"\n\n", from_)
        lf = n if lf < 0 else lf
        cr = buf.find(b"\r", from_)  # as in the loop: LF CR LF is looked for only after a CR
        crlf = buf.find(b"\n\r\n", max(cr - 1, from_), lf + 2) if 0 <= cr < lf else -1
        head = crlf + 3 if crlf >= 0 else min(lf + 2, n)  # where the header block ends (n: not yet)
        self.scanned += min(lf + 2, n) - from_ + (cr + 1 if cr >= 0 else n) - from_
        if 0 <= cr < lf:
            self.scanned += head - max(cr - 1, from_)
        if crlf < 0 and lf == n:
            if n > self.limit:
                raise FrameTooLarge(f"frame headers exceed {self._named(self.limit)}")
            self._check_command_prefix(buf, 0)
            self._scan = n
            return None
        whole = bytes(buf)
        self._clear()
        self.copied += n
        self.scanned += n - head  # the loop then searches the body for its NUL, at most
        # The loop's `cr` only has to lie no later than the first LF CR LF: the one found, or
        # (none before the LF LF) past the LF LF, where the next frame searches again.
        return whole, 0, lf, (crlf + 1 if crlf >= 0 else lf + 1)

    @property
    def buffered(self) -> int:
        """Bytes of a frame not complete yet."""
        return len(self._buf)

    def _named(self, limit: int) -> str:
        if limit == self.max_frame_size:
            return f"max-frame-size {limit}"
        return f"{limit} bytes, the limit before CONNECT"

    def _clear(self) -> None:
        self._buf.clear()
        self._state = _EMPTY
        self._scan = 0
        self._frame_headers = {}

    def _check_command_prefix(self, data: bytes | bytearray, pos: int) -> None:
        """Reject at once input whose first line can never become a known command.

        Without this, a TLS hello or a stray text line would wait for a header end
        that never comes, until the connection's TTL. (Only the first 64 bytes matter:
        no command is that long.)
        """
        eol = data.find(b"\n", pos, pos + 64)
        first = bytes(data[pos : eol if eol >= 0 else pos + 64])
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


def ascii_int(text: str) -> int | None:
    """A header's number: ASCII digits only (`int` would also take '+5', ' 5' or '٣'); None if not one."""
    if not (text.isascii() and text.isdigit()):
        return None
    try:
        return int(text)
    except ValueError:  # more digits than int() converts
        return None


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
