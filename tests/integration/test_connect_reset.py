"""A server that resets each connection as soon as it accepts it: with uvloop the transport is
closed before the client writes its HELLO, and a write then raises RuntimeError. The client
must report a failed attempt (a TandemError), never that RuntimeError: a broker looking for its
pair's active member at start-up died of it (the chaos run's replicated primary)."""

from __future__ import annotations

import socket
import struct
import threading

import pytest
import uvloop

import tandem.aio as aio
from tandem.errors import TandemError


def _resetting_server(stop: threading.Event) -> tuple[socket.socket, threading.Thread]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    srv.settimeout(0.2)

    def serve() -> None:
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.close()  # RST at once

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv, t


@pytest.mark.timeout(60)
def test_a_connection_reset_at_once_is_a_failed_attempt_not_a_runtime_error() -> None:
    stop = threading.Event()
    srv, thread = _resetting_server(stop)
    port = srv.getsockname()[1]

    async def main() -> list[BaseException]:
        errors: list[BaseException] = []
        for _ in range(40):
            try:
                conn = await aio.connect(f"tcp://127.0.0.1:{port}", ha=False, initial_connect_attempts=1)
            except TandemError as exc:
                errors.append(exc)
            else:  # pragma: no cover - the server never says HELLO
                await conn.close()
                raise AssertionError("connected to a server that resets every connection")
        return errors

    try:
        errors = uvloop.run(main())  # RuntimeError (not a TandemError) escaped before the fix
    finally:
        stop.set()
        thread.join(5)
        srv.close()
    assert len(errors) == 40
