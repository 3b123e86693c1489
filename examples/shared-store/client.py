"""Send and receive through a shared-store pair while you kill servers; prints what happens.

    .venv/bin/python examples/shared-store/client.py [--count 20000]

Kill the active server (kill -9) while it runs: the client fails over to the other one, resends
what was not confirmed, and at the end every message sent was received exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import tandem
import tandem.aio as aio

URL = "tcp://127.0.0.1:61616,tcp://127.0.0.1:61617"


async def main(count: int) -> None:
    conn = await aio.connect(URL, retry_interval=100)
    conn.add_failure_listener(lambda kind, cause: print(f"  [{kind.value}] now on {conn.server} ({cause})"))
    producer = (await conn.create_session()).create_producer("walkthrough")
    session = await conn.create_session(transacted=True)
    consumer = await session.create_consumer("walkthrough")
    received: set[int] = set()
    duplicates = 0

    async def consume() -> None:
        nonlocal duplicates
        batch: list[int] = []
        while len(received) < count:
            try:
                msg = await consumer.receive(1.0)
                if msg is not None:
                    batch.append(int(msg.text))
                if batch and (len(batch) >= 50 or msg is None):
                    await session.commit()
                    duplicates += sum(1 for n in batch if n in received)
                    received.update(batch)
                    batch = []
            except tandem.Unblocked:
                pass  # a receive that crossed the failover
            except tandem.TransactionRolledBack:
                batch = []  # not committed: these messages come again

    task = asyncio.create_task(consume())
    t0 = time.monotonic()
    for i in range(count):
        await producer.send(str(i))
        if i % 2000 == 0:
            print(f"sent {i:>6} via {conn.server}  received {len(received):>6}  ({time.monotonic() - t0:5.1f}s)")
        await asyncio.sleep(0.0005)
    await asyncio.wait_for(task, 60)
    print(f"sent {count}, received {len(received)} distinct, {duplicates} duplicates")
    await conn.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=20_000)
    asyncio.run(main(ap.parse_args().count))
