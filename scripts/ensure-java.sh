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
"$(dirname "$0")/apt-install.sh" openjdk-17-jre-headless
if [ "$(java_major)" -lt 17 ]; then
    echo "ensure-java: Java 17 is still not on PATH after installing openjdk-17-jre-headless" >&2
    exit 1
fi
