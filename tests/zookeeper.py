"""The tests' ZooKeeper: `tandem.testing.zookeeper`'s (the chaos suite starts its ZooKeeper the
same way), plus a read of the activation sequence through the broker's own client (the kit itself
imports nothing of the broker)."""

from tandem.ha.coordinator import Coordinator
from tandem.testing.zookeeper import ZooKeeperServer as _Server
from tandem.testing.zookeeper import classpath


class ZooKeeperServer(_Server):
    def activation_sequence(self, node_id: str) -> int:
        """ZooKeeper's activation sequence of `node_id`, read through a coordinator of our own."""
        c = Coordinator(self.hosts, node_id, session_timeout=2000, connect_timeout=5000)
        c.start()
        try:
            return c.activation_sequence()
        finally:
            c.close()


__all__ = ["ZooKeeperServer", "classpath"]
