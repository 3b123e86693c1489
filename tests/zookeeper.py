"""The tests' name for `tandem.testing.zookeeper` (the chaos suite starts its ZooKeeper the same way)."""

from tandem.testing.zookeeper import ZooKeeperServer, classpath

__all__ = ["ZooKeeperServer", "classpath"]
