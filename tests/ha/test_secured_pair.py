"""Secured pairs: the cluster user (no roles) is all the server links need.

A replicated backup logs in with the cluster pair, replicates, and takes over when its primary
is killed; a shared-store backup announces itself with it. Application users keep their
permissions on the new server, and the cluster pair may do nothing an application user does.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import pytest

import tandem
import tandem.aio as aio
from ha_pair import Cluster
from replicated_pair import ReplicatedPair
from secured import CLUSTER_PASSWORD, url_for, write_users_file

USERS = {"app": ["app"], "ops": ["ops"]}
PERMS = (
    'security-settings = { "orders.#" = { send = ["app"], consume = ["app"], create-address = ["app"], '
    'create-durable-queue = ["app"] }, "tandem.management" = { view = ["ops"] } }\n'
)


class SecuredPair(ReplicatedPair):
    def url_of(self, i: int) -> str:  # status polls log in as `ops` (view on tandem.management)
        return url_for(super().url_of(i), "ops")


def test_a_secured_pair_replicates_and_fails_over_with_the_cluster_user_alone(tmp_path: Any) -> None:
    p = SecuredPair(
        tmp_path / "pair", server_toml=(PERMS, PERMS), security_enabled=True, cluster_password=CLUSTER_PASSWORD
    )
    for b in p.servers:  # each server reads its own users file (a copy of the same)
        write_users_file(b.config_path.parent, USERS)
    try:
        p.start_all()  # in sync: REPLICA_START as the cluster user was accepted
        pair_url = ",".join(url_for(f"tcp://127.0.0.1:{port}", "app") for port in p.ports)
        with tandem.connect(pair_url) as conn, conn.session() as s:
            prod = s.create_producer("orders.eu")
            for i in range(20):
                prod.send(f"m{i}", durable=True)

        cluster_url = f"{p.url_of(0).split('?')[0]}?username=tandem.cluster&password={quote(CLUSTER_PASSWORD)}"

        async def cluster_user_tries() -> None:
            conn = await aio.connect(cluster_url, ha=False, reconnect_attempts=0)
            try:
                with pytest.raises(tandem.Unauthorized):
                    await conn.manage("broker.stop")
                s = await conn.create_session()
                with pytest.raises(tandem.Unauthorized):
                    await s.create_consumer("orders.eu")
            finally:
                await conn.close()

        asyncio.run(cluster_user_tries())
        p.primary.kill()
        p.wait_state(1, "active")
        with tandem.connect(url_for(f"tcp://127.0.0.1:{p.ports[1]}", "app")) as conn, conn.session() as s:
            c = s.create_consumer("orders.eu")
            got = []
            for _ in range(20):
                m = c.receive(timeout=10)
                assert m is not None, f"got {len(got)} of 20"
                got.append(m.body)
                m.ack()
            assert got == [f"m{i}".encode() for i in range(20)]
        with tandem.connect(url_for(f"tcp://127.0.0.1:{p.ports[1]}", "ops")) as conn, conn.session() as s:
            with pytest.raises(tandem.Unauthorized, match="'consume'"):
                s.create_consumer("orders.eu")
    finally:
        p.kill_all()


class SecuredCluster(Cluster):
    def url_of(self, i: int) -> str:
        return url_for(super().url_of(i), "ops")


def test_a_secured_shared_store_backup_announces_itself_and_takes_over(tmp_path: Any) -> None:
    c = SecuredCluster(tmp_path, security_enabled=True, cluster_password=CLUSTER_PASSWORD)
    for b in c.servers:  # top-level keys: before the file's tables; each server reads its own users file
        b.config_path.write_text(PERMS + b.config_path.read_text())
        write_users_file(b.config_path.parent, USERS)
    try:
        c.start_all()  # waits until the primary knows its backup: cluster.announce was accepted
        with tandem.connect(url_for(c.url_of(0).split("?")[0], "app")) as conn, conn.session() as s:
            s.create_producer("orders.us").send(b"before", durable=True)
        c.primary.kill()
        c.wait_state(1, "active")
        with tandem.connect(url_for(f"tcp://127.0.0.1:{c.ports[1]}", "app")) as conn, conn.session() as s:
            m = s.create_consumer("orders.us").receive(timeout=10)
            assert m is not None and m.body == b"before"
            m.ack()
    finally:
        c.kill_all()
