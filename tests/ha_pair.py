"""Shared-store servers as real processes on one data directory, for HA tests."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import tandem.aio as aio
from broker_process import BrokerProcess
from tandem.testing import free_port


def tls_lines(tls: Any) -> tuple[str, str, str]:
    """With `tls` (tandem.certs.DevCerts): lines for a native acceptor (TLS, client certificates
    required), lines for a connector (the server links' CA and certificate) and the client URL query."""
    if tls is None:
        return "", "", ""
    acceptor = (
        f'ssl-enabled = true\ncert-path = "{tls.server}"\nkey-path = "{tls.server_key}"\n'
        f'trust-store-path = "{tls.ca}"\nneed-client-auth = true\n'
    )
    connector = f'trust-store-path = "{tls.ca}"\ncert-path = "{tls.server}"\nkey-path = "{tls.server_key}"\n'
    return acceptor, connector, f"?ca={tls.ca}&cert={tls.client}&key={tls.client_key}"


class Cluster:
    """N servers on one store: server 0 is the primary, the rest are backups. `tls`: a
    tandem.certs.DevCerts: the native acceptors, the server links and the clients use TLS."""

    scheme = "tcp"
    query = ""

    def __init__(self, root: Path, backups: int = 1, stomp: bool = False, tls: Any = None, **settings: Any) -> None:
        acceptor_tls, connector_tls, self.query = tls_lines(tls)
        self.scheme = "tcps" if tls is not None else "tcp"
        self.data = root / "store"
        self.ports = [free_port() for _ in range(backups + 1)]
        self.stomp_ports = [free_port() for _ in range(backups + 1)] if stomp else []
        names = ["primary"] + [f"backup{i}" if backups > 1 else "backup" for i in range(1, backups + 1)]
        self.servers: list[BrokerProcess] = []
        connectors = "".join(
            f'[[connectors]]\nname = "{n}"\nurl = "{self.scheme}://127.0.0.1:{p}"\n{connector_tls}'
            for n, p in zip(names, self.ports, strict=True)
        )
        for i, (name, port) in enumerate(zip(names, self.ports, strict=True)):
            others = [n for n in names if n != name]
            stomp_acceptor = (
                f'[[acceptors]]\nname = "stomp"\nprotocol = "stomp"\nbind = "127.0.0.1:{self.stomp_ports[i]}"\n'
                if stomp
                else ""
            )
            extra = (
                f'ha-policy = "{"shared-store-primary" if i == 0 else "shared-store-backup"}"\n'
                f'connector-ref = "{name}"\n'
                f"static-connectors = [{', '.join(repr(o).replace(chr(39), chr(34)) for o in others)}]\n"
                f'[[acceptors]]\nname = "native"\nbind = "127.0.0.1:{port}"\n{acceptor_tls}{stomp_acceptor}{connectors}'
            )
            b = BrokerProcess(root / name, name=name, extra_toml=extra, data_directory=str(self.data), **settings)
            self.servers.append(b)

    @property
    def primary(self) -> BrokerProcess:
        return self.servers[0]

    @property
    def backup(self) -> BrokerProcess:
        return self.servers[1]

    @property
    def url(self) -> str:
        return ",".join(f"{self.scheme}://127.0.0.1:{p}" for p in self.ports) + self.query

    def url_of(self, i: int) -> str:
        return f"{self.scheme}://127.0.0.1:{self.ports[i]}{self.query}"

    def start_all(self) -> Cluster:
        self.primary.start()
        self.wait_state(0, "active")
        for i in range(1, len(self.servers)):
            self.servers[i].start()
        self.wait_state(1, "passive")
        self.wait_announced()
        return self

    def wait_announced(self, timeout: float = 30.0) -> None:
        """Until the primary knows a backup (its `peer`): a client that connects from then on learns
        the pair's topology and fails over; one that connected before could not know a backup."""
        deadline = time.monotonic() + timeout
        while (peer := self.status(0).get("peer")) is None:
            assert time.monotonic() < deadline, f"no backup announced to the primary within {timeout}s"
            time.sleep(0.05)
        assert peer

    def status(self, i: int) -> dict[str, Any]:
        async def go() -> dict[str, Any]:
            conn = await aio.connect(self.url_of(i), allow_passive=True, connect_timeout=2000)
            try:
                return await conn.manage("broker.status")  # type: ignore[no-any-return]
            finally:
                await conn.close()

        return asyncio.run(go())

    def wait_state(self, i: int, state: str, timeout: float = 30.0) -> float:
        """Seconds until server i reports `state`."""
        t0 = time.monotonic()
        last: Any = None
        while time.monotonic() - t0 < timeout:
            try:
                last = self.status(i)
                if last["state"] == state:
                    return time.monotonic() - t0
            except Exception as exc:  # not up yet
                last = exc
            time.sleep(0.05)
        raise AssertionError(f"server {i} not {state!r} within {timeout}s: {last}\n{self.servers[i].log_text()}")

    def kill_all(self) -> None:
        for b in self.servers:
            b.kill()
