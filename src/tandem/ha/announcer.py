"""A waiting server announces its connector to the active server of its store.

The active server adds it to the topology it sends its clients, so they know
where to fail over to. The announcing connection stays open; when it drops
(the active server died or stepped down) the entry goes, and we try again.
"""

from __future__ import annotations

import asyncio
import logging

from ..errors import TandemError
from .host import ActivationHost

log = logging.getLogger("tandem.ha")

RETRY = 0.5


async def announce(host: ActivationHost, node_id: str) -> None:
    from ..client.connection import AsyncConnection

    cfg = host.config
    urls = [cfg.connector_url(n) for n in cfg.static_connectors]
    while True:
        me = host.own_connector()
        for url in urls:
            if url == me:
                continue
            try:
                conn = await AsyncConnection.connect(
                    url if "://" in url else f"tcp://{url}",
                    connect_timeout=1000,
                    username=cfg.cluster_user,
                    password=cfg.cluster_password,
                    # Never fail over: the topology names us as the backup, and a
                    # link that followed it would end up talking to itself.
                    ha=False,
                    reconnect_attempts=0,
                    **cfg.link_options(url),  # TLS when the connector says tcps://
                )
            except (TandemError, OSError):
                continue
            try:
                await conn.manage(
                    "cluster.announce",
                    user=cfg.cluster_user,
                    password=cfg.cluster_password,
                    node_id=node_id,
                    connector=me,
                )
                log.info("announced to the active server", extra={"peer": url, "connector": me})
                await conn.wait_closed()
            except TandemError as exc:
                log.debug("announce to %s failed: %s", url, exc)
            finally:
                await conn.close()
        await asyncio.sleep(RETRY)
