#!/usr/bin/env bash
# Install Debian's activemq package (ActiveMQ Classic 5.17) for the STOMP benchmark.
#
# Idempotent and non-interactive. The package's own system broker is never
# left running: a policy-rc.d that forbids service starts is in place during
# the install (created temporarily unless one already exists); afterwards the
# service is stopped and disabled (systemd unit and SysV links) and any broker
# still running as user activemq is stopped. The package's instances in
# /etc/activemq/instances-enabled are left alone: the init script is what
# starts them, and it is disabled. The benchmark starts its own private broker
# instead (bench/brokers/activemq.py), with its own activemq.xml, data
# directory and loopback ports.
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
    SUDO=(sudo)
else
    SUDO=()
fi

system_broker_pids() {
    pgrep -u activemq -f 'java.*activemq' 2>/dev/null || true
}

stop_system_service() {
    if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
        "${SUDO[@]}" systemctl disable --now activemq.service >/dev/null 2>&1 || true
    fi
    if [[ -n $(system_broker_pids) && -x /etc/init.d/activemq ]]; then
        "${SUDO[@]}" timeout 60 /etc/init.d/activemq stop >/dev/null 2>&1 || true
    fi
    if command -v update-rc.d >/dev/null 2>&1 && [[ -x /etc/init.d/activemq ]]; then
        "${SUDO[@]}" update-rc.d activemq disable >/dev/null 2>&1 || true
    fi
    # Whatever still runs as the package's user (an instance started some
    # other way): SIGTERM, a bounded wait, then SIGKILL.
    local pid i
    for pid in $(system_broker_pids); do
        "${SUDO[@]}" kill "$pid" 2>/dev/null || true
    done
    for i in $(seq 1 30); do
        [[ -z $(system_broker_pids) ]] && break
        sleep 1
    done
    for pid in $(system_broker_pids); do
        "${SUDO[@]}" kill -9 "$pid" 2>/dev/null || true
    done
}

check_java() {
    if ! command -v java >/dev/null 2>&1; then
        echo "warning: no java on PATH" >&2
        return
    fi
    echo "java: $(java -version 2>&1 | head -n 1)"
}

if dpkg-query -W -f='${Status}' activemq 2>/dev/null | grep -q 'install ok installed'; then
    stop_system_service
    echo "activemq already installed: $(dpkg-query -W -f='${Version}' activemq)"
    check_java
    exit 0
fi

POLICY=/usr/sbin/policy-rc.d
CREATED_POLICY=0
if [[ ! -e $POLICY ]]; then
    printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$POLICY" >/dev/null
    "${SUDO[@]}" chmod 755 "$POLICY"
    CREATED_POLICY=1
fi
cleanup() {
    if [[ $CREATED_POLICY -eq 1 ]]; then
        "${SUDO[@]}" rm -f "$POLICY"
    fi
}
trap cleanup EXIT

"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    activemq >/dev/null

stop_system_service
if [[ -n $(system_broker_pids) ]]; then
    echo "error: a system ActiveMQ broker is still running: $(system_broker_pids)" >&2
    exit 1
fi
echo "activemq installed: $(dpkg-query -W -f='${Version}' activemq)"
check_java
