"""Pairs whose acceptors need client certificates and whose server links (replication, shared-store
announcements) go over TLS because their connectors say tcps://: they sync, tell clients a tcps://
topology, and fail over losing nothing confirmed."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import tandem.aio as aio
from client_io import exactly_once_across_a_kill
from ha_pair import Cluster
from tandem.certs import DevCerts, write_dev_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    return write_dev_certs(tmp_path_factory.mktemp("certs"))


def topology(url: str) -> list[Any]:
    async def go() -> list[Any]:
        conn = await aio.connect(url)
        try:
            return conn.topology
        finally:
            await conn.close()

    return asyncio.run(go())


def check_exactly_once(consumed: list[Any], total: int) -> None:
    dupes = [k for k, n in Counter(consumed).items() if n > 1]
    assert not dupes, f"consumed twice: {dupes[:10]}"
    assert sorted(consumed) == list(range(total)), f"lost: {sorted(set(range(total)) - set(consumed))[:10]}"


def test_replicated_pair_over_tls_fails_over(pair: Any, certs: DevCerts) -> None:
    p = pair(tls=certs).start_all()  # in sync: the replication link made it through TLS with a certificate
    (node,) = topology(p.url_of(0))
    assert node["live"] == f"tcps://127.0.0.1:{p.ports[0]}"
    assert node["backup"] == f"tcps://127.0.0.1:{p.ports[1]}"
    total = 1500
    consumed, _ = exactly_once_across_a_kill(p.url, p.primary.kill, total)
    check_exactly_once(consumed, total)
    st = p.status(1)
    assert st["state"] == "active"
    assert "Traceback" not in p.backup.log_text()


def test_shared_store_pair_over_tls_fails_over(tmp_path: Path, certs: DevCerts) -> None:
    c = Cluster(tmp_path, tls=certs)
    try:
        c.start_all()  # the backup announced itself over TLS
        (node,) = topology(c.url_of(0))
        assert node["backup"] == f"tcps://127.0.0.1:{c.ports[1]}"
        total = 800
        # Only the primary's address in the URL: the client learns the backup from the topology.
        consumed, _ = exactly_once_across_a_kill(c.url_of(0), c.primary.kill, total)
        check_exactly_once(consumed, total)
        assert c.status(1)["state"] == "active"
    finally:
        c.kill_all()


def test_a_plain_client_follows_a_tcps_topology_with_tls(tmp_path: Path, certs: DevCerts) -> None:
    """A pair moving to TLS: the primary's acceptor is still plain, the backup's needs TLS with a
    client certificate. A client on the primary's tcp:// URL fails over to the backup with TLS,
    because the topology says tcps:// for it."""
    from ha_pair import tls_lines

    c = Cluster(tmp_path, tls=certs)
    acceptor_tls = tls_lines(certs)[0]
    p0, p1 = c.ports
    for i, b in enumerate(c.servers):
        text = b.config_path.read_text().replace(f'url = "tcps://127.0.0.1:{p0}"', f'url = "tcp://127.0.0.1:{p0}"')
        if i == 0:
            text = text.replace(f'bind = "127.0.0.1:{p0}"\n{acceptor_tls}', f'bind = "127.0.0.1:{p0}"\n')
        b.config_path.write_text(text)
    schemes = ["tcp", "tcps"]
    c.url_of = lambda i: f"{schemes[i]}://127.0.0.1:{c.ports[i]}{c.query}"  # type: ignore[method-assign]
    try:
        c.start_all()
        (node,) = topology(c.url_of(0))
        assert node["live"] == f"127.0.0.1:{p0}" and node["backup"] == f"tcps://127.0.0.1:{p1}"
        total = 600
        consumed, _ = exactly_once_across_a_kill(c.url_of(0), c.primary.kill, total)
        check_exactly_once(consumed, total)
        assert c.status(1)["state"] == "active"
    finally:
        c.kill_all()
