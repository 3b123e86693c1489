"""kill -9 of the primary after it committed and before its answer reached the client.

The client sits behind a proxy that holds back the commit's answer and kills the primary at
that moment: the commit is on disk, the client cannot know. It must raise
TransactionOutcomeUnknown (not TransactionRolledBack), fail over to the backup, and the retry
recipe (same work, `retry_commit()` under the same transaction id) must find it committed:
every message delivered exactly once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import tandem
import tandem.aio as aio
from client_io import drain_texts
from ha_pair import Cluster
from reply_proxy import CommitReplyDropper
from tandem.errors import TransactionOutcomeUnknown

N = 5
ORDERS = [f"order-{i}" for i in range(N)]


@pytest.fixture
def pair(tmp_path: Path) -> Any:
    c = Cluster(tmp_path).start_all()
    yield c
    c.kill_all()


def _outcome_unknown(exc: BaseException | None) -> bool:
    return isinstance(exc, tandem.TandemError) and exc.code.name == "TRANSACTION_OUTCOME_UNKNOWN"


def _check(exc: BaseException | None, drained: list[str]) -> None:
    twice = [k for k, n in Counter(drained).items() if n > 1]
    assert not twice, f"applied twice (the commit raised {exc!r}): {twice}"
    assert _outcome_unknown(exc), f"the commit's outcome was unknown, got {exc!r}"
    assert sorted(drained) == ORDERS


@pytest.mark.timeout(60)
@pytest.mark.parametrize("slow_backup", [False, True], ids=["backup-at-once", "backup-late"])
def test_kill9_between_commit_and_answer_asyncio(pair: Cluster, slow_backup: bool) -> None:
    """`backup-late`: the backup is stopped (SIGSTOP) until the commit has raised, so the client
    cannot ask it anything within `call_timeout`; it must still not call the commit rolled back."""
    c = pair

    def kill() -> None:
        if slow_backup:
            c.backup.pause()
        c.primary.kill()

    async def main() -> BaseException | None:
        with CommitReplyDropper(c.ports[0], on_drop=kill) as proxy:
            conn = await aio.connect(proxy.url, retry_interval=50, call_timeout=3000)
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
            c.backup.resume()
            if _outcome_unknown(exc):
                await work()
                assert await tx.retry_commit() is False  # the primary had committed it
                assert conn.server == f"127.0.0.1:{c.ports[1]}"  # on the backup
            elif isinstance(exc, tandem.TransactionRolledBack):
                await work()  # what an application does after a rollback: the work again, committed anew
                await tx.commit()
            await conn.close()
            return exc

    exc = asyncio.run(main())
    _check(exc, asyncio.run(drain_texts(c.url_of(1), "orders")))


@pytest.mark.timeout(60)
def test_kill9_between_commit_and_answer_blocking(pair: Cluster) -> None:
    c = pair
    exc: BaseException | None = None
    with (
        CommitReplyDropper(c.ports[0], on_drop=c.primary.kill) as proxy,
        tandem.connect(proxy.url, retry_interval=50) as conn,
    ):
        tx = conn.session(transacted=True)
        producer = tx.create_producer("orders")

        def work() -> None:
            for body in ORDERS:
                producer.send(body)

        work()
        try:
            tx.commit()
        except Exception as e:
            exc = e
        assert proxy.dropped.is_set() and not c.primary.running
        if _outcome_unknown(exc):
            work()
            assert tx.retry_commit() is False
            assert conn.server == f"127.0.0.1:{c.ports[1]}"
    _check(exc, asyncio.run(drain_texts(c.url_of(1), "orders")))


@pytest.mark.timeout(60)
def test_kill9_before_the_commit_reached_the_primary(pair: Cluster) -> None:
    """The COMMIT never reached the primary: the same error (the client cannot tell), and
    `retry_commit()` with nothing redone answers True (applied: the first attempt was not, and
    can no longer be, since its id is used); the work done again then commits once."""
    c = pair

    async def main() -> None:
        with CommitReplyDropper(c.ports[0], on_drop=c.primary.kill, lose="request") as proxy:
            conn = await aio.connect(proxy.url, retry_interval=50)
            tx = await conn.create_session(transacted=True)
            producer = tx.create_producer("orders")
            for body in ORDERS:
                await producer.send(body)
            exc: BaseException | None = None
            try:
                await tx.commit()
            except Exception as e:
                exc = e
            assert proxy.dropped.is_set() and not c.primary.running
            assert _outcome_unknown(exc), f"got {exc!r}"
            assert await tx.retry_commit() is True  # an empty commit under the id: the first did not go through
            for body in ORDERS:
                await producer.send(body)
            await tx.commit()
            await conn.close()

    asyncio.run(main())
    _check(TransactionOutcomeUnknown(), asyncio.run(drain_texts(c.url_of(1), "orders")))
