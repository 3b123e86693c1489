#!/usr/bin/env bash
# `memory-allocator = "mimalloc"` (decision 0083) preloads Debian's `libmimalloc2.0`; the leak test
# and the allocator's tests run brokers with it. Installs the package when the library is missing.
set -euo pipefail

have_mimalloc() {
    ldconfig -p 2>/dev/null | grep -q 'libmimalloc\.so'
}

if have_mimalloc; then
    exit 0
fi
echo "ensure-mimalloc: no libmimalloc in the loader's cache; installing Debian's libmimalloc2.0 package" >&2
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    SUDO=(sudo -n)
fi
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libmimalloc2.0 >/dev/null
if ! have_mimalloc; then
    echo "ensure-mimalloc: still no libmimalloc after installing libmimalloc2.0" >&2
    exit 1
fi
