"""decode_page's fast path (valid page records checked and decoded in place) must give exactly
what the journal's scan gives: the same messages, the same end, the same reason, on torn,
corrupted, foreign and zero-padded page bytes alike; for pages of runs (PAGED_MESSAGES, decision
0086), of one message per record (PAGED_MESSAGE, as written before) and of both."""

from __future__ import annotations

import random
import sys

import msgspec
import pytest

from tandem.core.message import Message, MessageData
from tandem.core.paging import PagedRecord
from tandem.journal import files as jf
from tandem.journal import records as rec
from tandem.store.pages import decode_page, encode_item, encode_run, encoder
from tandem.store.records import MessageRecord, RecordType

_dec = msgspec.msgpack.Decoder(MessageRecord)
_dec_run = msgspec.msgpack.Decoder(list[PagedRecord])


def _by_scan(data: bytes, page: int) -> tuple[list[tuple[object, ...]], int, str]:
    parsed: list[rec.Parsed] = []
    end = rec.scan(data, jf.FILE_HEADER_SIZE, page, parsed)
    out = []
    for _off, _len, kind, utype, rid, body in parsed:
        if kind == rec.ADD and utype == RecordType.PAGED_MESSAGE:
            r = _dec.decode(body)
            out.append((rid, r.refs, bytes(r.message), r.expiration, r.tx))
        elif kind == rec.ADD and utype == RecordType.PAGED_MESSAGES:
            out.extend((p.mid, p.refs, bytes(p.raw), p.expiration, p.tx) for p in _dec_run.decode(body))
    return out, end.offset, end.reason


def _raw(i: int) -> msgspec.Raw:
    return msgspec.Raw(msgspec.msgpack.encode(MessageData("a", body=b"x" * (i * 7 % 300))))


def _page(page: int, singles: bool = True, runs: bool = True) -> bytes:
    """200 messages: one per record (the old form) and runs of 1 to 40 (the new), as asked."""
    records = []
    rnd = random.Random(page)
    i = 0
    while i < 200:
        if singles and (not runs or rnd.random() < 0.5):
            body = encoder.encode(MessageRecord([(3, i + 1)], _raw(i), i % 2, tx=i % 3))
            records.append(rec.encode(page, rec.ADD, RecordType.PAGED_MESSAGE, 1000 + i, body))
            i += 1
            continue
        n = min(rnd.randint(1, 40), 200 - i)
        items = []
        for j in range(i, i + n):
            m = Message.decode(1000 + j, _raw(j))
            m.expiration = j % 2  # (as the broker's expiry-delay sets it)
            items.append(encode_item(m, [(3, j + 1), (5, j + 9)][: 1 + j % 2], j % 3))
        records.append(rec.encode(page, rec.ADD, RecordType.PAGED_MESSAGES, 0, encode_run(items)))
        i += n
    records.insert(len(records) // 3, rec.encode(page, rec.ADD, 99, 7, b"other"))  # another type: skipped
    return bytes(jf.FILE_HEADER_SIZE) + b"".join(records)


@pytest.mark.parametrize("form", ["singles", "runs", "both"])
def test_decode_page_agrees_with_the_journal_scan_on_damaged_pages(form: str) -> None:
    good = _page(7, singles=form != "runs", runs=form != "singles")
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
    records = decode_page(good, 7)[0]
    assert [r.mid for r in records] == list(range(1000, 1200))  # every message, in order
    assert [bytes(r.raw) for r in records] == [bytes(_raw(i)) for i in range(200)]
    assert decode_page(good, 8)[0] == []  # another page's key: stale, nothing read


def test_a_run_s_messages_do_not_keep_the_read_buffer_alive() -> None:
    """Each message read back from a run owns its bytes: a message that stays in memory long
    (unacknowledged, filtered, of a slow subscription) must not hold the whole read chunk
    (decoded in place, a run's messages are views of it)."""
    data = _page(3, singles=False)
    before = sys.getrefcount(data)
    records = decode_page(data, 3)[0]
    assert len(records) == 200
    assert sys.getrefcount(data) == before
