#!/usr/bin/env bash
# Spark (the `spark` extra, its tests and examples) needs Java 17 or later.
# Installs Debian's OpenJDK 17 headless runtime when no suitable `java` is on PATH.
set -euo pipefail

java_major() {
    command -v java >/dev/null 2>&1 || { echo 0; return; }
    java -version 2>&1 | awk -F'"' '/version/ { split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit }'
}

if [ "$(java_major)" -ge 17 ] 2>/dev/null; then
    exit 0
fi
echo "ensure-java: no Java >= 17 found; installing openjdk-17-jre-headless from Debian" >&2
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    SUDO=(sudo -n)
fi
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null
if [ "$(java_major)" -lt 17 ]; then
    echo "ensure-java: Java 17 is still not on PATH after installing openjdk-17-jre-headless" >&2
    exit 1
fi
