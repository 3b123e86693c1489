#!/usr/bin/env bash
# Installs Debian packages for the ensure-*.sh scripts: as root, or through `sudo -n` (never asks
# for a password: a CI machine without it fails here, with apt's message).
set -euo pipefail

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    SUDO=(sudo -n)
fi
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
