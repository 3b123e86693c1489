#!/usr/bin/env bash
# The replication tests start a private ZooKeeper (tests/zookeeper.py) from Debian's `zookeeper`
# package: its jars in /usr/share/java and /etc/zookeeper/conf. Installs the package when its
# server jar is missing; needs Java (scripts/ensure-java.sh runs first). No system service is used.
set -euo pipefail

have_zookeeper() {
    compgen -G "/usr/share/java/zookeeper*.jar" >/dev/null && [ -d /etc/zookeeper/conf ]
}

if have_zookeeper; then
    exit 0
fi
echo "ensure-zookeeper: no ZooKeeper jars in /usr/share/java; installing Debian's zookeeper package" >&2
"$(dirname "$0")/apt-install.sh" zookeeper
if ! have_zookeeper; then
    echo "ensure-zookeeper: still no /usr/share/java/zookeeper*.jar after installing the zookeeper package" >&2
    exit 1
fi
