"""Answers drawn from duplicate detection wait until the original is on disk.

A duplicate's "ok", a transaction's "already committed", a DuplicateId refusal and
`tx.status` all say that the original is stored. When the original is still on its way to
the disk (another connection sent it a moment ago), such an answer must wait for it: a crash
between the answer and the sync would lose both the original and the duplicate the client
then dropped. The message journal's writes are slowed to one second each through the fault
seam, and the broker is killed (SIGKILL) the moment the answer arrives.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import tandem.aio as aio
from client_io import drain_texts
from tandem.errors import DuplicateId
from tandem.journal.faults import ENV

SLOW = {ENV: "tandem-data:write=delay1.0"}
Q = "dd"


def _race(b: Any, original: Callable[[Any], Awaitable[None]], answer: Callable[[Any], Awaitable[object]]) -> object:
    """Start `original` on one connection, then get `answer` on another and kill the broker at once."""

    async def main() -> object:
        a = await aio.connect(b.url, ha=False, reconnect_attempts=0)
        c = await aio.connect(b.url, ha=False, reconnect_attempts=0)
        first = asyncio.create_task(original(a))
        await asyncio.sleep(0.3)  # the original is routed; its write is on its way
        try:
            result = await answer(c)
        except DuplicateId as exc:
            result = exc
        b.kill()
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        for conn in (a, c):
            await asyncio.gather(asyncio.wait_for(conn.close(), 5), return_exceptions=True)
        return result

    return asyncio.run(main())


def _restart_and_drain(b: Any) -> list[str]:
    b.env.clear()
    b.start()
    return asyncio.run(drain_texts(b.url, Q, 1.0))


async def _send_x(conn: Any) -> None:
    prod = (await conn.create_session()).create_producer(Q)
    await prod.send("x", dedup_id="X")


@pytest.mark.timeout(60)
def test_a_duplicate_send_is_confirmed_only_once_the_original_is_durable(broker_factory: Any) -> None:
    b = broker_factory(env=SLOW).start()
    _race(b, _send_x, _send_x)
    assert _restart_and_drain(b) == ["x"], "the duplicate was confirmed, the original lost"


async def _commit_t(conn: Any) -> None:
    s = await conn.create_session(transacted=True)
    await s.create_producer(Q).send_async("t")
    await s.commit(dedup_id="T")


@pytest.mark.timeout(60)
def test_a_repeated_transaction_is_answered_committed_only_once_it_is_durable(broker_factory: Any) -> None:
    b = broker_factory(env=SLOW).start()
    _race(b, _commit_t, _commit_t)
    assert _restart_and_drain(b) == ["t"], "'already committed' answered, the transaction lost"


@pytest.mark.timeout(60)
def test_a_duplicate_in_a_transaction_is_refused_only_once_the_original_is_durable(broker_factory: Any) -> None:
    async def commit_dup(conn: Any) -> None:
        s = await conn.create_session(transacted=True)
        await s.create_producer(Q).send_async("x", dedup_id="X")
        await s.commit()

    b = broker_factory(env=SLOW).start()
    result = _race(b, _send_x, commit_dup)
    assert isinstance(result, DuplicateId), result
    assert _restart_and_drain(b) == ["x"], "DuplicateId answered, the original lost"


@pytest.mark.timeout(60)
def test_tx_status_says_committed_only_once_the_transaction_is_durable(broker_factory: Any) -> None:
    async def status(conn: Any) -> object:
        return await conn.manage("tx.status", dedup_id="T")

    b = broker_factory(env=SLOW).start()
    assert _race(b, _commit_t, status) is True
    assert _restart_and_drain(b) == ["t"], "tx.status said committed, the transaction lost"


def _stomp(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\0")
    _frame(s)
    return s


def _frame(s: socket.socket) -> bytes:
    data = b""
    while b"\0" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.timeout(60)
def test_a_duplicate_stomp_send_gets_its_receipt_only_once_the_original_is_durable(broker_factory: Any) -> None:
    acceptors = '[[acceptors]]\nname = "native"\nbind = "127.0.0.1:0"\n'
    acceptors += '[[acceptors]]\nname = "stomp"\nprotocol = "stomp"\nbind = "127.0.0.1:0"\n'
    b = broker_factory(env=SLOW, extra_toml=acceptors).start()
    port = b.ports["stomp"]
    a, c = _stomp(port), _stomp(port)
    send = b"SEND\ndestination:dd\ndedup-id:X\npersistent:true\nreceipt:%s\n\nx\0"
    a.sendall(send % b"r1")
    asyncio.run(asyncio.sleep(0.3))
    c.sendall(send % b"r2")
    reply = _frame(c)
    b.kill()
    a.close()
    c.close()
    assert reply.startswith(b"RECEIPT"), reply
    assert _restart_and_drain(b) == ["x"], "the duplicate's receipt came, the original lost"
