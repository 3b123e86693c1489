"""A replicated pair as real processes, each server on its own data directory, for HA tests."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from broker_process import BrokerProcess
from ha_pair import Cluster, free_port, tls_lines
from tandem.testing import FaultProxy


class ReplicatedPair(Cluster):
    """Server 0 is the replication primary, server 1 its backup: uncoordinated (allow-uncoordinated),
    or coordinated by the ZooKeeper at `zookeeper` (host:port) with a short session."""

    def __init__(
        self,
        root: Path,
        zookeeper: str | None = None,
        session_timeout: int = 2000,
        coordinator_toml: str = "",  # more lines of [ha.coordinator]
        server_toml: tuple[str, str] = ("", ""),  # top-level lines for the primary, the backup
        link_port: int | None = None,  # the backup reaches its primary here (a FaultProxy in front of it)
        return_link_port: int | None = None,  # the primary reaches its backup here (when it follows it)
        stomp: bool = False,  # a STOMP acceptor on each server too (stomp_ports)
        primary_zookeeper: str | None = None,  # the primary's ZooKeeper address, if not `zookeeper` (a proxy)
        backup_zookeeper: str | None = None,  # the backup's, likewise
        tls: Any = None,  # a tandem.certs.DevCerts: acceptors, the replication link and clients use TLS
        **settings: Any,
    ) -> None:
        acceptor_tls, connector_tls, self.query = tls_lines(tls)
        self.scheme = "tcps" if tls is not None else "tcp"
        self.ports = [free_port(), free_port()]
        self.stomp_ports = [free_port(), free_port()] if stomp else []
        names = ["primary", "backup"]
        self.dirs = [root / n for n in names]
        self.data = self.dirs[0]

        def connectors(ports: list[int]) -> str:
            return "".join(
                f'[[connectors]]\nname = "{n}"\nurl = "{self.scheme}://127.0.0.1:{p}"\n{connector_tls}'
                for n, p in zip(names, ports, strict=True)
            )

        self.servers: list[BrokerProcess] = []
        settings.setdefault("retry_replication_wait", 200)
        for i, (name, port) in enumerate(zip(names, self.ports, strict=True)):
            other = names[1 - i]
            extra = (
                f'ha-policy = "{"replication-primary" if i == 0 else "replication-backup"}"\n'
                + ("" if zookeeper else "allow-uncoordinated = true\n")
                + server_toml[i]
                + f'connector-ref = "{name}"\n'
                f'static-connectors = ["{other}"]\n'
                f'[[acceptors]]\nname = "native"\nbind = "127.0.0.1:{port}"\n{acceptor_tls}'
                + (
                    f'[[acceptors]]\nname = "stomp"\nprotocol = "stomp"\nbind = "127.0.0.1:{self.stomp_ports[i]}"\n'
                    if stomp
                    else ""
                )
                + connectors(self._links(i, link_port, return_link_port))
            )
            if zookeeper:
                zk = (primary_zookeeper, backup_zookeeper)[i] or zookeeper
                extra += f'[ha.coordinator]\nzookeeper = "{zk}"\nsession-timeout = {session_timeout}\n'
                extra += coordinator_toml

            self.servers.append(BrokerProcess(root / name, name=name, extra_toml=extra, **settings))

    def _links(self, i: int, link_port: int | None, return_link_port: int | None) -> list[int]:
        """The ports server i's connectors name: the other server's through its proxy, if any."""
        ports = list(self.ports)
        other = link_port if i == 1 else return_link_port
        if other is not None:
            ports[1 - i] = other
        return ports

    def start_all(self) -> ReplicatedPair:
        self.primary.start()
        self.wait_state(0, "active")
        self.backup.start()
        self.wait_in_sync()
        return self

    def wait_replication(self, i: int, state: str, timeout: float = 30.0) -> dict[str, Any]:
        """Server i's status once its `replication` reads `state`."""
        t0 = time.monotonic()
        last: Any = None
        while time.monotonic() - t0 < timeout:
            try:
                last = self.status(i)
                if last.get("replication") == state:
                    return last  # type: ignore[no-any-return]
            except Exception as exc:  # not up yet
                last = exc
            time.sleep(0.05)
        raise AssertionError(f"server {i} not {state!r} within {timeout}s: {last}\n{self.servers[i].log_text()}")

    def wait_in_sync(self, timeout: float = 30.0) -> None:
        self.wait_replication(1, "in-sync", timeout)
        self.wait_replication(0, "in-sync", timeout)
        self.wait_state(1, "passive", timeout)

    def never_active(self, i: int, seconds: float) -> None:
        """Server i stays inactive for `seconds` (polled)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            st = self.status(i)
            assert st["state"] != "active", f"server {i} activated: {st}\n{self.servers[i].log_text()[-3000:]}"
            time.sleep(0.1)


def admin_status(url: str) -> str:
    """`tandem admin status` of the server at `url`, as a user reads it."""
    out = subprocess.run(
        [sys.executable, "-m", "tandem", "admin", "status", "--url", url], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def admin_status_json(url: str) -> dict[str, Any]:
    """`tandem admin status --json` of the server at `url`."""
    out = subprocess.run(
        [sys.executable, "-m", "tandem", "admin", "status", "--json", "--url", url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def status_row(text: str, key: str) -> str:
    """The value of one row of `tandem admin status`."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return value.strip()
    raise AssertionError(f"no {key!r} in:\n{text}")


@contextlib.contextmanager
def linked_pairs(root: Path, **fixed: Any) -> Iterator[Callable[..., tuple[ReplicatedPair, FaultProxy]]]:
    """make(**settings) -> (pair, proxy): pairs whose backup reaches its primary through a
    FaultProxy only, with `fixed` settings and then `settings`; all killed and closed at the end."""
    made: list[tuple[ReplicatedPair, FaultProxy]] = []

    def make(**settings: Any) -> tuple[ReplicatedPair, FaultProxy]:
        link = free_port()
        p = ReplicatedPair(root / f"pair{len(made)}", link_port=link, **fixed, **settings)
        proxy = FaultProxy(p.ports[0], port=link).start()
        made.append((p, proxy))
        return p, proxy

    try:
        yield make
    finally:
        for p, proxy in made:
            p.kill_all()
            proxy.close()
