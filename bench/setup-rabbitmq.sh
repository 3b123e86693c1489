#!/usr/bin/env bash
# Install Debian's rabbitmq-server for the side-by-side benchmark.
#
# Idempotent and non-interactive. The package's own system service is never
# left running: a policy-rc.d that forbids service starts is in place during
# the install (created temporarily unless one already exists), and any system
# node that was started anyway (e.g. under systemd) is stopped and the unit
# disabled. The benchmark starts its own private node instead
# (bench/brokers/rabbitmq.py), on its own ports and with its own epmd.
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
    SUDO=(sudo)
else
    SUDO=()
fi

system_node_running() {
    pgrep -u rabbitmq -f 'beam.*-s rabbit boot' >/dev/null 2>&1
}

epmd_pids_of_rabbitmq_user() {
    pgrep -u rabbitmq -x epmd 2>/dev/null || true
}

stop_system_service() {
    if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
        "${SUDO[@]}" systemctl disable --now rabbitmq-server.service >/dev/null 2>&1 || true
    fi
    # Only call the init script if a system node really runs: its status
    # check runs rabbitmqctl, which would start a system-wide epmd itself.
    if system_node_running && [[ -x /etc/init.d/rabbitmq-server ]]; then
        "${SUDO[@]}" /etc/init.d/rabbitmq-server stop >/dev/null 2>&1 || true
    fi
    if command -v update-rc.d >/dev/null 2>&1 && [[ -x /etc/init.d/rabbitmq-server ]]; then
        "${SUDO[@]}" update-rc.d rabbitmq-server disable >/dev/null 2>&1 || true
    fi
}

EPMD_BEFORE=$(epmd_pids_of_rabbitmq_user)

kill_new_epmd() {
    # An epmd of user rabbitmq that was not there before this script ran was
    # started as a side effect of the install; stop it (ours uses its own).
    local pid
    for pid in $(epmd_pids_of_rabbitmq_user); do
        if ! grep -qx "$pid" <<<"$EPMD_BEFORE" && ! system_node_running; then
            "${SUDO[@]}" kill "$pid" 2>/dev/null || true
        fi
    done
}

if dpkg-query -W -f='${Status}' rabbitmq-server 2>/dev/null | grep -q 'install ok installed'; then
    stop_system_service
    kill_new_epmd
    echo "rabbitmq-server already installed: $(dpkg-query -W -f='${Version}' rabbitmq-server)"
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
    rabbitmq-server >/dev/null

stop_system_service
kill_new_epmd
echo "rabbitmq-server installed: $(dpkg-query -W -f='${Version}' rabbitmq-server)"
