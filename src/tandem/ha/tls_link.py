"""A server link over TLS for code that reads and writes a blocking socket from threads.

A replicating backup reads its link on one thread and writes it from others (ha/replica.py); an
SSL socket must not be used by two threads at once. So the link gets one end of a socket pair
and the event loop relays the other end's bytes to and from the peer over TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl

from ..connecting import within

RELAY_CHUNK = 256 * 1024


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, ConnectionError):
        while data := await reader.read(RELAY_CHUNK):
            writer.write(data)
            await writer.drain()


async def _relay(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter], b: tuple[asyncio.StreamReader, asyncio.StreamWriter]
) -> None:
    tasks = [asyncio.create_task(_pump(a[0], b[1])), asyncio.create_task(_pump(b[0], a[1]))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)  # one side ended: end both
    finally:
        for t in tasks:
            t.cancel()
        for w in (a[1], b[1]):
            w.close()
        await asyncio.gather(*tasks, return_exceptions=True)


async def open_tls_link(
    host: str, port: int, ctx: ssl.SSLContext, timeout: float
) -> tuple[socket.socket, asyncio.Task[None]]:
    """A plain blocking socket whose bytes reach host:port over TLS, and the task relaying them
    (it ends when either side closes); raises OSError (ssl.SSLError, TimeoutError) if the
    TLS connection cannot be made."""
    remote = await within(
        timeout,
        lambda: asyncio.open_connection(host, port, ssl=ctx, server_hostname=host, ssl_handshake_timeout=timeout),
        lambda made: made[1].transport.abort(),
    )
    mine, theirs = socket.socketpair()
    try:
        local = await asyncio.open_connection(sock=theirs)
    except BaseException:
        mine.close()
        theirs.close()
        remote[1].close()
        raise
    mine.setblocking(True)
    return mine, asyncio.create_task(_relay(remote, local), name="tls-link-relay")
