#!/bin/sh
# Start a private, throwaway ZooKeeper in the foreground on 127.0.0.1 (Ctrl-C stops it), as the
# tests do (tests/zookeeper.py): Debian's `zookeeper` package (scripts/ensure-zookeeper.sh
# installs it), a generated zoo.cfg, no system service.
#   examples/replication-zk/start-zookeeper.sh [DIR] [PORT]     (defaults: a temp dir, 2181)
set -eu
dir=${1:-$(mktemp -d /tmp/tandem-zk.XXXXXX)}
port=${2:-2181}
jars=/usr/share/java
for j in zookeeper.jar zookeeper-jute.jar slf4j-api.jar slf4j-simple.jar; do
    if [ ! -f "$jars/$j" ]; then
        echo "missing $jars/$j: run scripts/ensure-zookeeper.sh (apt-get install zookeeper)" >&2
        exit 1
    fi
done
mkdir -p "$dir/data"
cat > "$dir/zoo.cfg" <<CFG
tickTime=2000
dataDir=$dir/data
clientPort=$port
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr
CFG
echo "ZooKeeper on 127.0.0.1:$port, data in $dir (Ctrl-C to stop)" >&2
exec java -Xmx128m -cp "$jars/zookeeper.jar:$jars/zookeeper-jute.jar:$jars/slf4j-api.jar:$jars/slf4j-simple.jar" \
    org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg"
