"""Large messages on a replicated pair: their files travel over the replication stream (and its
initial sync) like journal files, so a backup that takes over after kill -9 of its primary
delivers every confirmed large message whole."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import tandem

CHUNK = 64 * 1024


def body(n: int, seed: int) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest() * (CHUNK // 32)
    return (block * (n // len(block) + 1))[:n]


def test_a_backup_taking_over_delivers_large_messages_synced_and_streamed(pair: Any) -> None:
    """One large message before the backup joins (the initial sync copies its file), one while it
    replicates (the stream carries its chunks): after kill -9 of the primary, the backup delivers
    both whole, and removes each file once it is acknowledged."""
    p = pair()
    p.primary.start()
    p.wait_state(0, "active")
    before, during = body(3 * CHUNK + 11, 1), body(20 * CHUNK + 5, 2)
    opts = f"?min_large_message_size={CHUNK}"
    with tandem.connect(p.url_of(0) + opts) as c, c.session() as s:
        s.create_queue("big")
        s.create_producer("big").send(before)
    p.backup.start()
    p.wait_in_sync()
    with tandem.connect(p.url_of(0) + opts + "&ha=false&reconnect_attempts=0") as c, c.session() as s:
        s.create_producer("big").send(during)  # confirmed: the backup has the file and the record
    p.primary.kill()
    p.wait_state(1, "active", timeout=30)
    large = p.dirs[1] / "large-messages"
    assert len([f for f in large.iterdir() if f.suffix == ".msg"]) == 2
    with tandem.connect(p.url_of(1) + opts + "&ha=false") as c, c.session() as s:
        cons = s.create_consumer("big")
        got = [cons.receive(10), cons.receive(10)]
        assert [m.body if m is not None else None for m in got] == [before, during]
        assert all(m is not None and m.large for m in got)
        assert cons.receive(0.3) is None
    deadline = time.monotonic() + 10
    while list(large.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(large.iterdir()) == []
