"""Sends that are paged without waiting for the page write (an open transaction's, a
non-durable message's, a STOMP SEND or COMMIT without a receipt) stop being read while the page files'
writer is behind: a client faster than the disk does not pile its messages up in the broker's
memory (decision 0085). The disk is made slow through the fault seam (every page sync waits),
the broker is a real process, and everything sent arrives afterwards, in order."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from test_paging_tx_open import BODY, SETTINGS, expected, fill, open_tx, run, status

import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import drain_committed as drain
from tandem.journal.faults import ENV
from tandem.testing.procs import memory

MIB = 1024 * 1024
N = 30_000  # ~30 MiB of bodies
SLOW_DISK = {ENV: "tandem-paging:sync=delay0.25"}
STOMP_ACCEPTORS = (
    '[[acceptors]]\nname = "native"\nbind = "127.0.0.1:0"\n'
    '[[acceptors]]\nname = "stomp"\nprotocol = "stomp"\nbind = "127.0.0.1:0"\n'
)


async def send_non_durable(url: str) -> None:
    conn = await aio.connect(url)
    try:
        prod = (await conn.create_session()).create_producer("paged.o")
        for i in range(400, 400 + N):
            await prod.send_async(f"m{i:06d}" + BODY, durable=False)
        await prod.flush()
    finally:
        await conn.close()


def send_stomp(port: int, per_transaction: int = 0) -> None:
    """SENDs without receipts as fast as the socket takes them, then a receipt for the last;
    `per_transaction`: in transactions of that many sends (small enough to be held until the
    commit, which pages them), each COMMIT without a receipt but the last."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        frames = []
        last = 400 + N - 1
        for i in range(400, 400 + N):
            body = (f"m{i:06d}" + BODY).encode()
            t = (i - 400) // per_transaction if per_transaction else None
            if t is not None and (i - 400) % per_transaction == 0:
                frames.append(f"BEGIN\ntransaction:t{t}\n\n\x00".encode())
            tx = f"transaction:t{t}\n" if t is not None else ""
            receipt = "receipt:last\n" if i == last and t is None else ""
            frames.append(
                f"SEND\ndestination:/queue/paged.o\n{tx}content-length:{len(body)}\n{receipt}\n".encode()
                + body
                + b"\x00"
            )
            if t is not None and ((i - 400) % per_transaction == per_transaction - 1 or i == last):
                receipt = "receipt:last\n" if i == last else ""
                frames.append(f"COMMIT\ntransaction:t{t}\n{receipt}\n\x00".encode())
            if len(frames) >= 500:
                s.sendall(b"".join(frames))
                frames.clear()
        s.sendall(b"".join(frames))
        got = b""
        while b"RECEIPT" not in got:
            chunk = s.recv(65536)
            assert chunk, f"connection closed before the receipt: {got!r}"
            got += chunk


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["open-transaction", "non-durable", "stomp", "stomp-transactions"])
def test_paged_sends_wait_for_a_slow_page_writer_instead_of_filling_memory(broker_factory: Any, how: str) -> None:
    b: BrokerProcess = broker_factory(
        address_settings=SETTINGS, env=SLOW_DISK, extra_toml=STOMP_ACCEPTORS if how.startswith("stomp") else ""
    ).start()
    assert b.proc is not None
    pid = b.proc.pid
    run(fill(b.url, "paged.o", 0, 400))  # the address pages
    rss0 = memory(pid)

    if how == "open-transaction":

        async def scenario() -> int:
            conn, session = await open_tx(b.url, "paged.o", 400, N)
            try:
                grown = memory(pid) - rss0
                await session.commit()
                return grown
            finally:
                await conn.close()

        grown = run(scenario())
    elif how == "non-durable":
        run(send_non_durable(b.url))
        grown = memory(pid) - rss0
    else:  # transactions of 200 (~200 KiB) are held and paged at their commits
        send_stomp(b.ports["stomp"], per_transaction=200 if how == "stomp-transactions" else 0)
        grown = memory(pid) - rss0
    peak = memory(pid, "VmHWM") - rss0
    # Unpaced, the writer's queue held most of the 30 MiB: RSS grew by 31 MiB.
    assert grown < 12 * MIB, f"RSS grew {grown >> 20} MiB while {N} KiB waited for a slow disk"
    assert peak < 15 * MIB, f"RSS peaked {peak >> 20} MiB above the start"
    assert run(status(b.url))["pacing_pauses"] > 0  # the mechanism, not luck, kept it small
    assert run(drain(b.url, "paged.o", wait=5.0)) == expected(0, 400 + N)
