"""check-for-live-server: before a replication primary serves, is its node served elsewhere?

After a failover the backup serves the node with data newer than the primary's; a primary that
restarts and served its own copy would hand out again what the backup's clients consumed (and
miss what they sent). So it first asks each of its static connectors, as the cluster user,
whether it is active for its node id: one that is is the server to sync from (decision 0035).
"""

from __future__ import annotations

import logging

from ..config import BrokerConfig
from ..errors import TandemError

log = logging.getLogger("tandem.ha")


async def find_active(cfg: BrokerConfig, own: str, node_id: str) -> str | None:
    """host:port of a server active for `node_id` among the static connectors, or None."""
    from ..client.connection import AsyncConnection

    for name in cfg.static_connectors:
        url = cfg.connector_url(name)
        if url == own:
            continue
        try:
            conn = await AsyncConnection.connect(
                f"tcp://{url}",
                connect_timeout=cfg.initial_replication_sync_timeout,
                username=cfg.cluster_user,
                password=cfg.cluster_password,
                ha=False,  # this server, not whoever it would fail over to
                reconnect_attempts=0,
                **cfg.link_options(url),  # TLS when the connector says tcps://
            )  # a waiting backup is refused here (it is not active)
        except (TandemError, OSError) as exc:
            log.info("check-for-live-server: %s is not active for any node (%s)", url, exc)
            continue
        try:
            if conn.node_id == node_id:
                return url
            log.info("check-for-live-server: %s serves another node (%s)", url, conn.node_id)
        finally:
            await conn.close()
    return None
