"""decode_page's fast path (valid page records checked and decoded in place) must give exactly
what the journal's scan gives: the same records, the same end, the same reason, on torn,
corrupted, foreign and zero-padded page bytes alike."""

from __future__ import annotations

import random

import msgspec

from tandem.core.message import MessageData
from tandem.journal import files as jf
from tandem.journal import records as rec
from tandem.store.pages import decode_page, encoder
from tandem.store.records import MessageRecord, RecordType

_dec = msgspec.msgpack.Decoder(MessageRecord)


def _by_scan(data: bytes, page: int) -> tuple[list[tuple[object, ...]], int, str]:
    parsed: list[rec.Parsed] = []
    end = rec.scan(data, jf.FILE_HEADER_SIZE, page, parsed)
    out = []
    for _off, _len, kind, utype, rid, body in parsed:
        if kind == rec.ADD and utype == RecordType.PAGED_MESSAGE:
            r = _dec.decode(body)
            out.append((rid, r.refs, bytes(r.message), r.expiration, r.tx))
    return out, end.offset, end.reason


def _page(page: int) -> bytes:
    records = []
    for i in range(200):
        raw = msgspec.Raw(msgspec.msgpack.encode(MessageData("a", body=b"x" * (i * 7 % 300))))
        body = encoder.encode(MessageRecord([(3, i + 1)], raw, i % 2, tx=i % 3))
        records.append(rec.encode(page, rec.ADD, RecordType.PAGED_MESSAGE, 1000 + i, body))
    records.insert(60, rec.encode(page, rec.ADD, 99, 7, b"other"))  # a record of another type: skipped
    return bytes(jf.FILE_HEADER_SIZE) + b"".join(records)


def test_decode_page_agrees_with_the_journal_scan_on_damaged_pages() -> None:
    good = _page(7)
    rnd = random.Random(16)
    cases = [good, good + bytes(64), good[:-5]]
    for _ in range(150):
        d = bytearray(good)
        d[rnd.randrange(jf.FILE_HEADER_SIZE, len(d))] ^= 1 << rnd.randrange(8)  # a flipped bit
        cases.append(bytes(d))
        cases.append(good[: rnd.randrange(jf.FILE_HEADER_SIZE, len(good))])  # a torn tail
    for data in cases:
        records, end, reason = decode_page(data, 7)
        mine = [(r.mid, r.refs, bytes(r.raw), r.expiration, r.tx) for r in records]
        assert (mine, end, reason) == _by_scan(data, 7)
    assert len(decode_page(good, 7)[0]) == 200
    assert decode_page(good, 8)[0] == []  # another page's key: stale, nothing read
