"""A commit the broker did but whose answer the client never got: outcome unknown, then a safe retry.

A proxy between client and broker loses the answer to the commit. The client must not call that
a rollback (an application would do the work again under a new transaction id and apply it
twice): it raises TransactionOutcomeUnknown, and the retry recipe (the same work, committed with
`retry_commit()` under the same transaction id) lets the broker answer "already committed".
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

import tandem
import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import drain_texts, queue_stat, send_confirmed
from reply_proxy import CommitReplyDropper
from tandem.testing import free_port

N = 5
ORDERS = [f"order-{i}" for i in range(N)]


def _assert_outcome_unknown(exc: BaseException) -> None:
    assert isinstance(exc, tandem.TandemError), repr(exc)
    assert exc.code.name == "TRANSACTION_OUTCOME_UNKNOWN", f"got {exc!r}: a retry would get a new transaction id"
    assert not isinstance(exc, tandem.TransactionRolledBack)


def _assert_once(got: list[str]) -> None:
    twice = [k for k, n in Counter(got).items() if n > 1]
    assert not twice, f"applied twice: {twice}"
    assert sorted(got) == ORDERS


def test_lost_commit_answer_asyncio(broker: BrokerProcess) -> None:
    async def main() -> None:
        with CommitReplyDropper(broker.port) as proxy:
            conn = await aio.connect(proxy.url, call_timeout=1500)
            tx = await conn.create_session(transacted=True)
            producer = tx.create_producer("orders")

            async def work() -> None:
                for body in ORDERS:
                    await producer.send(body)

            await work()
            exc: Any = None
            try:
                await tx.commit()
            except Exception as e:
                exc = e
            assert proxy.dropped.is_set()
            _assert_outcome_unknown(exc)
            assert exc.dedup_id  # the id a retry reuses
            assert (await queue_stat(broker.url, "orders"))["message_count"] == N  # the broker did commit
            await work()  # the recipe: the same work again ...
            applied = await tx.retry_commit()  # ... under the same transaction id
            assert applied is False, "the first attempt was committed: the retry must change nothing"
            await conn.close()

    asyncio.run(main())
    _assert_once(asyncio.run(drain_texts(broker.url, "orders")))


def test_lost_commit_answer_blocking(broker: BrokerProcess) -> None:
    with CommitReplyDropper(broker.port) as proxy, tandem.connect(proxy.url, call_timeout=1500) as conn:
        tx = conn.session(transacted=True)
        producer = tx.create_producer("orders")

        def work() -> None:
            for body in ORDERS:
                producer.send(body)

        work()
        exc: Any = None
        try:
            tx.commit()
        except Exception as e:
            exc = e
        assert proxy.dropped.is_set()
        _assert_outcome_unknown(exc)
        work()
        assert tx.retry_commit() is False
        # the session goes on normally afterwards
        producer.send("after")
        tx.commit()
    got = asyncio.run(drain_texts(broker.url, "orders"))
    assert got.count("after") == 1
    _assert_once([g for g in got if g != "after"])


def test_lost_commit_answer_of_a_consuming_transaction(broker: BrokerProcess) -> None:
    """A consumer cannot do the same work again (the next receive brings other messages):
    `retry_commit()` with nothing redone tells it the first attempt went through."""

    async def main() -> None:
        assert await send_confirmed(broker.url, "inbox", "order-", N) == ORDERS
        with CommitReplyDropper(broker.port) as proxy:
            conn = await aio.connect(proxy.url, call_timeout=1500)
            tx = await conn.create_session(transacted=True)
            consumer = await tx.create_consumer("inbox")
            got = [m.text for m in [await consumer.receive(5) for _ in range(2)] if m is not None]
            assert got == ORDERS[:2]
            try:
                await tx.commit()
            except Exception as e:
                _assert_outcome_unknown(e)
            else:
                raise AssertionError("commit returned though its answer was lost")
            assert tx.unresolved_commit is not None
            assert await tx.retry_commit() is False  # the first attempt was committed
            assert tx.unresolved_commit is None
            rest = [m.text for m in [await consumer.receive(5) for _ in range(N - 2)] if m is not None]
            await tx.commit()
            assert rest == ORDERS[2:]
            assert await consumer.receive(0.3) is None
            await conn.close()

    asyncio.run(main())
    assert asyncio.run(drain_texts(broker.url, "inbox")) == []


@pytest.mark.parametrize(
    ("reset_after", "applied"),
    [("commit", True), ("retry", False)],
    ids=["an-empty-retry-took-the-id", "the-retry-carried-the-held-work"],
)
def test_a_retry_after_a_retry_whose_answer_was_lost_too(broker_factory: Any, reset_after: str, applied: bool) -> None:
    """A consumer's COMMIT never reaches the broker, and the answer to its first `retry_commit()`
    (nothing done, to ask) is lost too; the connection fails after one of the two. The next
    retry, on a new session, must say what happened to the first attempt (decision 0084):

    - failed after the COMMIT: the broker rolled back what the session held, so the first retry
      committed an empty transaction under the id. The first attempt never applied: True, and
      the messages come again. (Chaos seed 1128002: the broker said "already committed", the
      consumer counted its messages consumed, and they came again after a failover.)
    - failed after the first retry: that retry committed the acknowledgements the broker still
      held from the first attempt. False: they were applied, and the messages never come again.

    The broker tells clients the proxy as its address, so that the client reconnects through it."""
    front = free_port()
    broker: BrokerProcess = broker_factory(
        connector_ref="front", extra_toml=f'[[connectors]]\nname = "front"\nurl = "127.0.0.1:{front}"\n'
    ).start()

    async def main() -> None:
        assert await send_confirmed(broker.url, "inbox", "order-", N) == ORDERS
        with CommitReplyDropper(broker.port, lose=["request", "answer"], port=front) as proxy:
            conn = await aio.connect(proxy.url, call_timeout=1000, retry_interval=50, reconnect_attempts=-1)
            tx = await conn.create_session(transacted=True)
            consumer = await tx.create_consumer("inbox")
            got = [m.text for m in [await consumer.receive(5) for _ in range(2)] if m is not None]
            assert got == ORDERS[:2]
            for name, attempt in (("commit", tx.commit), ("retry", tx.retry_commit)):
                try:
                    await attempt()
                except Exception as e:
                    _assert_outcome_unknown(e)
                else:
                    raise AssertionError("a commit returned though its answer was lost")
                if name == reset_after:
                    proxy.proxy.reset()  # the connection fails: the broker rolls back what it holds
                    await asyncio.to_thread(proxy.proxy.wait_stats, lambda st: st.connections >= 2, 10)
                    await conn.wait_ready()
            assert proxy.commits_seen == 2
            assert await tx.retry_commit() is applied
            expected = ORDERS if applied else ORDERS[2:]
            again = sorted(m.text for m in [await consumer.receive(5) for _ in expected] if m is not None)
            await tx.commit()
            assert again == expected
            assert await consumer.receive(0.3) is None
            await conn.close()

    asyncio.run(main())
    assert asyncio.run(drain_texts(broker.url, "inbox")) == []
