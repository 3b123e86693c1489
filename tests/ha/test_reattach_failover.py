"""Reattachment meets failover on a REPLICATED pair: the backup has none of the client's sessions,
so the client falls back to the reconnect path, and the commit whose answer was lost is recognised
when retried (Artemis's testCommitOccurredUnblockedAndResendNoDuplicates, with a confirmation window).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

import tandem
import tandem.aio as aio
from client_io import drain_texts, exactly_once_across_a_kill
from reply_proxy import CommitReplyDropper
from tandem.errors import TandemError

N = 5
ORDERS = [f"order-{i}" for i in range(N)]


@pytest.mark.timeout(90)
def test_commit_answer_lost_then_failover_is_recognised_on_retry(pair: Any) -> None:
    c = pair().start_all()
    events: list[tuple[aio.FailureEvent, TandemError | None]] = []

    async def main() -> BaseException | None:
        with CommitReplyDropper(c.ports[0], on_drop=c.primary.kill) as proxy:
            conn = await aio.connect(
                proxy.url, retry_interval=50, call_timeout=5000, confirmation_window_size=4096, connection_ttl=30_000
            )
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            tx = await conn.create_session(transacted=True)
            producer = tx.create_producer("orders")

            async def work() -> None:
                for body in ORDERS:
                    await producer.send(body)

            await work()
            exc: BaseException | None = None
            try:
                await tx.commit()
            except Exception as e:
                exc = e
            assert proxy.dropped.is_set() and not c.primary.running
            assert isinstance(exc, tandem.TransactionOutcomeUnknown), f"got {exc!r}"
            await work()
            assert await tx.retry_commit() is False, "the primary had committed it: the retry must say so"
            assert conn.server == f"127.0.0.1:{c.ports[1]}"
            await conn.close()
            return exc

    asyncio.run(main())
    # The backup cannot have the sessions: no REATTACHED, the failover path.
    assert [k for k, _ in events] == [aio.FailureEvent.FAILOVER], events
    drained = asyncio.run(drain_texts(c.url_of(1), "orders"))
    assert not [k for k, n in Counter(drained).items() if n > 1], f"applied twice: {drained}"
    assert sorted(drained) == ORDERS


@pytest.mark.timeout(180)
def test_exactly_once_across_a_kill_with_a_confirmation_window(pair: Any) -> None:
    """kill -9 of the primary under load, with every client reattachable: the backup refuses the
    reattach, the reconnect path takes over, and nothing is lost or consumed twice."""
    p = pair().start_all()
    total = 1500
    consumed, _times = exactly_once_across_a_kill(f"{p.url}?confirmation_window_size=4096", p.primary.kill, total)
    twice = [k for k, n in Counter(consumed).items() if n > 1]
    assert not twice, f"consumed twice: {twice[:10]}"
    assert sorted(consumed) == list(range(total))
