"""Text that is not UTF-8, in msgpack: for the tests that feed it to the codecs and the broker.

msgpack keeps text (str) apart from bytes (bin); a str must be UTF-8, and msgspec raises
UnicodeDecodeError (a ValueError, not one of its own errors) when it is not. `pack` writes
msgpack as msgspec does, except that a BadStr goes out as a str.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import strategies as st

BAD_UTF8 = [
    b"\xff",  # never valid
    b"\x80",  # a continuation byte alone
    b"\xc0\x80",  # overlong NUL
    b"\xed\xa0\x80",  # a UTF-16 surrogate
    b"\xe2\x82",  # truncated
    b"\xf4\x90\x80\x80",  # above U+10FFFF
]


def invalid_utf8() -> st.SearchStrategy[bytes]:
    """Text with at least one byte sequence that is not UTF-8 somewhere in it."""
    return st.builds(
        lambda pre, bad, post: pre.encode() + bad + post.encode(),
        st.text(max_size=6),
        st.sampled_from(BAD_UTF8) | st.binary(min_size=1, max_size=6).filter(_not_utf8),
        st.text(max_size=6),
    )


def _not_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


class BadStr(bytes):
    """Bytes packed as a msgpack str (text) although they are not UTF-8."""


def pack(obj: Any) -> bytes:
    """msgpack, as msgspec writes it, except that a BadStr goes out as a str."""
    if isinstance(obj, BadStr):
        n = len(obj)
        if n < 32:
            head = bytes([0xA0 | n])
        elif n < 256:
            head = b"\xd9" + bytes([n])
        else:
            head = b"\xda" + n.to_bytes(2, "big")
        return head + obj
    if isinstance(obj, (list, tuple)):
        n = len(obj)
        head = bytes([0x90 | n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big")
        return head + b"".join(pack(x) for x in obj)
    if isinstance(obj, dict):
        n = len(obj)
        head = bytes([0x80 | n]) if n < 16 else b"\xde" + n.to_bytes(2, "big")
        return head + b"".join(pack(k) + pack(v) for k, v in obj.items())
    return msgspec.msgpack.encode(obj)


Path = tuple[tuple[str, Any], ...]


def string_paths(obj: Any, path: Path = ()) -> list[Path]:
    """Where the strings of a decoded msgpack value are: list items, map keys and map values."""
    if isinstance(obj, str):
        return [path]
    out: list[Path] = []
    if isinstance(obj, list):
        for i, x in enumerate(obj):
            out += string_paths(x, (*path, ("item", i)))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(k, str):
                out.append((*path, ("key", k)))
            out += string_paths(v, (*path, ("value", k)))
    return out


def replaced(obj: Any, path: Path, bad: bytes) -> Any:
    """`obj` with the string at `path` replaced by BadStr(bad)."""
    if not path:
        return BadStr(bad)
    (kind, where), rest = path[0], path[1:]
    if kind == "item":
        return [replaced(x, rest, bad) if i == where else x for i, x in enumerate(obj)]
    if kind == "key":
        return {(BadStr(bad) if k == where else k): v for k, v in obj.items()}
    return {k: (replaced(v, rest, bad) if k == where else v) for k, v in obj.items()}
